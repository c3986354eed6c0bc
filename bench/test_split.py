"""Who ranks a sharded run's test split (issue 22): the driver alone, or the run's gang.

Generates a synthetic graph (``kgpipe synth``), trains it for one epoch with 2 sharded workers
on a LocalCluster (test off), then ranks its test split in rounds, each in a fresh process, the
ways below interleaved:

- ``driver``: :func:`~kgpipe.runs.finish.finish_run` as a run ends without a gang: the model
  file written from the shards, the test split ranked against its memory map, the export;
- ``gang``: a LocalCluster of the run's workers, and
  :meth:`~kgpipe.launch.dask.DaskLauncher.test_split`: every rank reads its shards of the
  checkpoint and ranks the queries against its own rows.

With ``--before TREE`` (a ``git worktree`` of older code) that code's gang ranks too, as
``gang-before``. Reports the ranking's seconds (``driver``: the ranking alone; ``gang``: rank 0's ranking, and
the whole call with the launch and the reads), each process's peak resident memory (``VmHWM``;
the driver's covers the model file and the export too) and the test MRR, which must agree.

    .venv/bin/python bench/test_split.py --entities 1000000 --edges 4400000 --rounds 2
Results: bench/results/test_split_<entities>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, synth_graph, train_sharded

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

#: one ranking of the test split, in a fresh process: argv = run folder, mode
CHILD = r"""
import json, sys, time
def hwm():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.read import open_run
url, mode = sys.argv[1], sys.argv[2]
_, cfg = open_run(url)
cfg = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"test": True})})
run = RunFolder.read(cfg)
if mode == "driver":
    from kgpipe.runs.finish import finish_run
    history = [json.loads(x) for x in open(url + "/metrics.jsonl")]
    t0 = time.perf_counter()
    results = finish_run(run, history=history)
    row = {"wall_seconds": time.perf_counter() - t0, "peaks": [hwm()]}
else:
    from kgpipe.launch.dask import DaskLauncher, open_run_cluster
    with open_run_cluster(cfg) as client:
        t0 = time.perf_counter()
        results = DaskLauncher(run, client).test_split()
        row = {"wall_seconds": time.perf_counter() - t0}
        row["peaks"] = sorted(client.run(hwm).values())
row.update(ranking_seconds=results["seconds"], test_mrr=results["mrr"],
           test_triples=results["triples"], ranked_by=results["ranked_by"])
print(json.dumps(row))
"""


def _rank(run: Path, mode: str, tree: Path) -> dict[str, Any]:
    """One ranking in a fresh process importing kgpipe from ``tree`` (run outside any
    checkout: ``-c`` puts the working directory first on the path)."""
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(run), mode.removesuffix("-before")],
            cwd=cwd, env={**os.environ, "PYTHONPATH": str(tree)},
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entities", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=4_400_000)
    p.add_argument("--relations", type=int, default=50)
    p.add_argument("--exponent", type=float, default=0.2)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--keep", type=Path, default=None, help="keep the graph and run here")
    p.add_argument(
        "--before", type=Path, default=None,
        help="a checkout of older code: its gang ranks too (mode gang-before)",
    )  # fmt: skip
    args = p.parse_args()
    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
    }
    trees = {"driver": ROOT, "gang": ROOT}
    if args.before is not None:
        trees["gang-before"] = args.before.resolve()
    modes = list(trees)
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        graph = where / "graph"
        synth_graph(
            graph, entities=args.entities, relations=args.relations, edges=args.edges,
            exponent=args.exponent,
        )  # fmt: skip
        run = where / "runs" / "sharded"
        if not (run / "model.safetensors").exists():
            t0 = time.perf_counter()
            train_sharded(graph, where / "runs", args.dim, args.workers)
            out["train_seconds"] = round(time.perf_counter() - t0, 1)
        info = json.loads((run / "data.json").read_text())
        rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for i in range(args.rounds):
            for mode in modes if i % 2 == 0 else reversed(modes):
                got = _rank(run, mode, trees[mode])
                rows[mode].append(got)
                print(mode, json.dumps(got), flush=True)
    n = int(info["num_entities"])
    out.update(entities=n, entity_table_bytes=4 * n * args.dim, rounds=rows)
    out["medians"] = {
        mode: {
            "ranking_seconds": statistics.median(r["ranking_seconds"] for r in got),
            "wall_seconds": statistics.median(r["wall_seconds"] for r in got),
            "largest_peak_bytes": statistics.median(max(r["peaks"]) for r in got),
        }
        for mode, got in rows.items()
    }
    mrrs = [r["test_mrr"] for got in rows.values() for r in got]
    out["same_test_mrr"] = max(mrrs) - min(mrrs) <= 1e-9 * max(mrrs)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"test_split_{n}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["medians"], indent=1), "same test MRR:", out["same_test_mrr"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
