"""Full filtered evaluation against a million entities: one process, and split over gloo ranks.

    .venv/bin/python bench/eval_split.py --entities 1000000 --triples 5000 --ranks 1 2

A randomly initialised model (speed does not depend on its values) ranks ``--triples`` random
evaluation triples on both sides against every entity, filtered with ``--train`` random known
triples. ``--ranks 1`` is ``evaluate`` in this process with all the cores; ``--ranks W`` spawns
W gloo ranks with ``cores // W`` threads each, every rank scoring its range of entities (what a
gang's validation does, `kgpipe/evaluation.py`). Reported per setting: the evaluation's wall
time (from a barrier to the last rank's end), each process's peak resident memory, and the MRR
(equal in every setting). ``--blocks 8192 0`` compares one process's ranking in blocks of
candidates with the whole matrix at once (``--rounds`` interleaves them). ``--candidates K``
adds one process's OGB-style ranking, each query against K candidates of its own
(``evaluation.candidates``; its MRR is not the full protocol's). ``--sampled K`` adds one
process's sampled ranking, every query against the same K entities (``evaluation.sampled``).
Results: ``bench/results/eval_split_<entities>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, peak_rss

RESULTS = Path(__file__).resolve().parent / "results"


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import torch

    from kgpipe.config import ModelConfig
    from kgpipe.evaluation import FilterIndex
    from kgpipe.models.model import KGEModel

    g = torch.Generator().manual_seed(0)
    n, r = args.entities, args.relations

    def triples(k: int) -> torch.Tensor:
        return torch.stack(
            (
                torch.randint(0, n, (k,), generator=g),
                torch.randint(0, r, (k,), generator=g),
                torch.randint(0, n, (k,), generator=g),
            ),
            1,
        )

    train, test = triples(args.train), triples(args.triples)
    index = FilterIndex.from_triples([train, test], r)
    model = KGEModel.build(
        ModelConfig(name=args.model, dim=args.dim, reciprocal=True),
        num_entities=n,
        num_relations=r,
        seed=0,
    )
    return model, test, index


def _rank(
    rank: int,
    world: int,
    port: int,
    threads: int,
    args: argparse.Namespace,
    out: str,
    block: int,
    candidates: int,
    sampled: int,
) -> None:
    import torch
    import torch.distributed as dist

    import kgpipe.evaluation as ev
    from kgpipe.evaluation import evaluate
    from kgpipe.query_candidates import QueryCandidates

    ev.BLOCK = block or 1 << 62  # 0: the whole (chunk x entities) matrix at once
    torch.set_num_threads(threads)
    model, test, index = _setup(args)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        dist.barrier()
        t0 = time.perf_counter()
        per_query = QueryCandidates(candidates, split="test") if candidates else None
        m = evaluate(
            model, test, index, batch_size=args.batch_size, part=(rank, world),
            candidates=per_query, sampled=sampled or None,
        )  # fmt: skip
        dist.barrier()
        seconds = time.perf_counter() - t0
    finally:
        dist.destroy_process_group()
    peak = peak_rss()
    Path(f"{out}.{rank}").write_text(
        json.dumps({"seconds": seconds, "mrr": m["mrr"], "peak": peak})
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entities", type=int, default=1_000_000)
    p.add_argument("--relations", type=int, default=50)
    p.add_argument("--train", type=int, default=2_000_000)
    p.add_argument("--triples", type=int, default=5_000)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--model", default="complex")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    p.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        default=[0],
        help="candidates per block of one process's ranking (0: all at once); interleaved",
    )
    p.add_argument(
        "--candidates",
        type=int,
        nargs="*",
        default=[],
        help="also rank each query against this many candidates of its own (one process)",
    )
    p.add_argument(
        "--sampled",
        type=int,
        nargs="*",
        default=[],
        help="also rank every query against this many sampled entities (one process)",
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", help="result file name (default: eval_split_<entities>.json)")
    args = p.parse_args()

    import torch.multiprocessing as mp

    cores = os.cpu_count() or 1
    runs = []
    settings = [(w, b, 0, 0) for w in args.ranks for b in (args.blocks if w == 1 else [0])]
    settings += [(1, 0, k, 0) for k in args.candidates]
    settings += [(1, 0, 0, k) for k in args.sampled]
    for round_ in range(args.rounds):
        for world, block, candidates, sampled in settings:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            threads = max(1, cores // world)
            with tempfile.TemporaryDirectory() as tmp:
                out = str(Path(tmp) / "rank")
                mp.spawn(
                    _rank,
                    args=(world, port, threads, args, out, block, candidates, sampled),
                    nprocs=world,
                )
                ranks = [json.loads(Path(f"{out}.{k}").read_text()) for k in range(world)]
            run = {
                "round": round_,
                "ranks": world,
                "block": block,
                "candidates": f"sampled-{sampled}" if sampled else candidates or "all",
                "threads_per_rank": threads,
                "seconds": round(max(x["seconds"] for x in ranks), 2),
                "mrr": ranks[0]["mrr"],
                "peak_rss_bytes": [x["peak"] for x in ranks],
            }
            print(json.dumps(run), flush=True)
            runs.append(run)
    out_json = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "entities": args.entities,
        "queries": 2 * args.triples,
        "model": args.model,
        "dim": args.dim,
        "batch_size": args.batch_size,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (args.out or f"eval_split_{args.entities}.json")
    path.write_text(json.dumps(out_json, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
