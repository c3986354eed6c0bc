"""Can a rank pull rows from, and push gradients to, their owner without the owner joining a
collective? A probe for issue 22's lock-free asynchronous mode, not a benchmark of kgpipe.

gloo and NCCL collectives need every rank to take part, which is why kgpipe's sharded step
(kgpipe/distributed/sharded.py) has every rank meet in every step's ``all_to_all``. torch's RPC
framework (``torch.distributed.rpc``, TensorPipe) serves requests on the owner's own threads, so
a rank can ask for rows while the owner trains. This script times one step's traffic between 2
CPU processes, each owning a table of ``--rows`` x ``--dim`` float32 rows and asking the other for
``m`` random rows, then sending back ``m`` gradient rows that the owner adds to its table:

- ``gloo``: the synchronous shape (ids out, rows back, gradients out: three ``all_to_all_single``
  with split sizes that send to the other rank only);
- ``rpc``: ``rpc_async(pull)`` waited for, then ``rpc_async(push)`` waited for;
- ``rpc-k``: the push is not waited for until ``k`` steps later (a staleness bound on pushes).

Each (mode, m) runs in a fresh pair of processes, rounds interleaved; medians of per-step times
on rank 0 (after 5 warm-up steps) over the rounds.

    .venv/bin/python bench/rpc_probe.py --pulls 1000 10000 --rounds 3
Results: bench/results/rpc_probe.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, write_result

RESULTS = Path(__file__).resolve().parent / "results"
WARMUP = 5

_table: torch.Tensor | None = None
_lock = threading.Lock()


def _pull(ids: torch.Tensor) -> torch.Tensor:
    assert _table is not None
    return _table.index_select(0, ids)


def _push(ids: torch.Tensor, grads: torch.Tensor) -> None:
    assert _table is not None
    with _lock:  # the owner's RPC threads apply pushes as they arrive
        _table.index_add_(0, ids, grads, alpha=-0.01)


def _gloo_step(ids: torch.Tensor, table: torch.Tensor, rank: int) -> None:
    m = len(ids)
    split = [0, m] if rank == 0 else [m, 0]  # to the other rank only, as the RPC path does
    asked = torch.empty_like(ids)
    dist.all_to_all_single(asked, ids, split, split)
    rows = table.index_select(0, asked)
    got = torch.empty_like(rows)
    dist.all_to_all_single(got, rows, split, split)
    grads = got * 1e-3
    back = torch.empty_like(grads)
    dist.all_to_all_single(back, grads, split, split)
    table.index_add_(0, asked, back, alpha=-0.01)


def _rank(
    rank: int, mode: str, m: int, steps: int, rows: int, dim: int, port: int, out: Any
) -> None:
    global _table
    torch.set_num_threads(1)
    _table = torch.randn(rows, dim, generator=torch.Generator().manual_seed(rank))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if mode != "gloo":
        options = rpc.TensorPipeRpcBackendOptions(
            init_method=f"tcp://127.0.0.1:{port + 1}", num_worker_threads=4
        )
        rpc.init_rpc(f"rank{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    other = f"rank{1 - rank}"
    lag = int(mode.split("-")[1]) if "-" in mode else 0
    gen = torch.Generator().manual_seed(100 + rank)
    pending: list[Any] = []
    times = []
    for step in range(steps + WARMUP):
        ids = torch.randint(0, rows, (m,), generator=gen)
        t0 = time.perf_counter()
        if mode == "gloo":
            _gloo_step(ids, _table, rank)
        else:
            got = rpc.rpc_async(other, _pull, args=(ids,)).wait()
            pending.append(rpc.rpc_async(other, _push, args=(ids, got * 1e-3)))
            while len(pending) > lag:
                pending.pop(0).wait()
        if step >= WARMUP:
            times.append(time.perf_counter() - t0)
    for fut in pending:
        fut.wait()
    if mode != "gloo":
        rpc.shutdown()  # waits for every rank's outstanding work
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out.put(statistics.median(times))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--pulls", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--modes", nargs="+", default=["gloo", "rpc", "rpc-2"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    port = 29700
    per_step: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for m in args.pulls:
            for mode in args.modes:
                port += 10
                queue = ctx.SimpleQueue()
                procs = [
                    ctx.Process(
                        target=_rank,
                        args=(r, mode, m, args.steps, args.rows, args.dim, port, queue),
                    )
                    for r in range(2)
                ]
                for proc in procs:
                    proc.start()
                for proc in procs:
                    proc.join(timeout=600)
                    if proc.is_alive():
                        for other in procs:
                            other.kill()
                        raise SystemExit(f"{mode} m={m}: a rank did not finish in 600 s")
                    if proc.exitcode:
                        raise SystemExit(f"{mode} m={m}: a rank exited with {proc.exitcode}")
                per_step.setdefault(f"{mode} m={m}", []).append(queue.get())
    median = {k: statistics.median(v) * 1e3 for k, v in per_step.items()}
    for key, ms in median.items():
        print(f"{key:16s} {ms:7.2f} ms a step")
    result = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "rows": args.rows,
        "dim": args.dim,
        "steps": args.steps,
        "rank_torch_threads": 1,  # each rank's; "hardware" records the parent's
        "median_ms_per_step": median,
        "rounds_ms_per_step": {k: [x * 1e3 for x in v] for k, v in per_step.items()},
    }
    write_result(result, Path(args.json or RESULTS / "rpc_probe.json"))


if __name__ == "__main__":
    main()
