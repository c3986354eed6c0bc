"""Distributed training on a Dask LocalCluster: quality and bytes of each sync/compression mode,
and throughput of 1 vs 2 workers against the in-process loop.

    .venv/bin/python bench/gang.py quality --json bench/results/distributed_quality_umls.json
    .venv/bin/python bench/gang.py speed --json bench/results/distributed_speed_fb15k237.json
    .venv/bin/python bench/gang.py short --epochs 10 --json bench/results/distributed_fb15k237_short.json
    .venv/bin/python bench/gang.py overhead --epochs 6 --rounds 3 --json bench/results/dask_overhead_fb15k237.json

``quality``: the shipped UMLS config (or ``--config``) trained in-process and with 2 workers in
every mode (step sync, epoch sync, step sync with int8 and with top-k compression); test MRR,
bytes sent per epoch (counted from the tensors handed to the collectives) and wall time.

``speed``: FB15k-237 epochs (TransE, d=200, batch 1024, 256 negatives; ``--epochs``) in-process,
on a 1-worker Dask cluster (the overhead of the Dask path) and on 2 workers with step sync;
triples/s, compute vs communication seconds per epoch.

``overhead``: the 1-worker Dask path against the in-process loop only, in interleaved rounds
(median over rounds of each run's median steady epoch time).

``short``: FB15k-237 test MRR after ``--epochs`` epochs in one process and with 2 workers
(epoch sync, step sync).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import hardware  # noqa: E402

from kgpipe.config import load_config  # noqa: E402
from kgpipe.pipeline import train  # noqa: E402


def run(config: str, overrides: list[str], root: str, name: str) -> dict[str, Any]:
    cfg = load_config(config, [*overrides, f"run.root={root}", f"run.name={name}"])
    t0 = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - t0
    epochs = [s.as_dict() for s in result.history]
    steady = epochs[1:] or epochs  # the first epoch includes one-off start-up
    return {
        "name": name,
        "overrides": overrides,
        "test_mrr": result.results["mrr"] if result.results else None,
        "test_hits@10": result.results["hits@10"] if result.results else None,
        "wall_seconds": wall,
        "epoch_seconds_median": statistics.median(e["seconds"] for e in steady),
        "triples_per_s_median": statistics.median(e["triples_per_s"] for e in steady),
        "comm_seconds_median": statistics.median(e.get("comm_seconds", 0.0) for e in steady),
        "compute_seconds_median": statistics.median(
            e.get("compute_seconds", e["seconds"]) for e in steady
        ),
        "bytes_sent_per_epoch": statistics.median(e.get("bytes_sent", 0) for e in steady),
        "world_size": epochs[-1].get("world_size", 1),
    }


def quality(args: argparse.Namespace, root: str) -> list[dict[str, Any]]:
    variants = {
        "single": [],
        "step-2": ["distributed.workers=2", "distributed.sync=step"],
        "epoch-2": ["distributed.workers=2", "distributed.sync=epoch"],
        "step-2-int8": ["distributed.workers=2", "distributed.compression=int8"],
        "step-2-topk": ["distributed.workers=2", "distributed.compression=topk"],
    }
    return [run(args.config, ov, root, name) for name, ov in variants.items()]


def speed(args: argparse.Namespace, root: str) -> list[dict[str, Any]]:
    base = [
        f"data.root={args.data_root}",
        f"training.epochs={args.epochs}",
        "evaluation.every=0",
        "evaluation.test=false",
    ]
    variants = {
        "in-process": [],
        "dask-1-worker": ["distributed.launch=dask", "distributed.workers=1"],
        "dask-2-workers-step": ["distributed.workers=2", "distributed.sync=step"],
        "dask-2-workers-epoch": ["distributed.workers=2", "distributed.sync=epoch"],
    }
    out = []
    for name, ov in variants.items():
        out.append(run(args.speed_config, base + ov, root, name))
    return out


def overhead(args: argparse.Namespace, root: str) -> list[dict[str, Any]]:
    """The Dask path with one worker against the in-process loop, ``--rounds`` interleaved
    rounds (alternating which goes first) of ``--epochs`` epochs each."""
    base = [
        f"data.root={args.data_root}",
        f"training.epochs={args.epochs}",
        "evaluation.every=0",
        "evaluation.test=false",
    ]
    variants = {
        "in-process": [],
        "dask-1-worker": ["distributed.launch=dask", "distributed.workers=1"],
    }
    out = []
    for k in range(args.rounds):
        names = list(variants) if k % 2 == 0 else list(reversed(variants))
        for name in names:
            row = run(args.speed_config, base + variants[name], root, f"{name}-{k}")
            row["variant"] = name
            out.append(row)
    per = {
        name: statistics.median(r["epoch_seconds_median"] for r in out if r["variant"] == name)
        for name in variants
    }
    ratio = per["dask-1-worker"] / per["in-process"]
    print(f"median epoch s: {per}; Dask 1 worker / in-process = {ratio:.3f}", file=sys.stderr)
    out.append({"name": "summary", "median_epoch_seconds": per, "overhead": ratio - 1.0,
                "test_mrr": None, "triples_per_s_median": 0.0, "epoch_seconds_median": 0.0,
                "comm_seconds_median": 0.0, "bytes_sent_per_epoch": 0})  # fmt: skip
    return out


def short(args: argparse.Namespace, root: str) -> list[dict[str, Any]]:
    """FB15k-237 test MRR after ``--epochs`` epochs: one process vs 2 workers (epoch, step)."""
    base = [f"data.root={args.data_root}", f"training.epochs={args.epochs}", "evaluation.every=0"]
    variants = {
        "single": [],
        "epoch-2": ["distributed.workers=2", "distributed.sync=epoch"],
        "step-2": ["distributed.workers=2", "distributed.sync=step"],
    }
    return [run(args.speed_config, base + ov, root, name) for name, ov in variants.items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=("quality", "speed", "short", "overhead"))
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (overhead)")
    p.add_argument("--config", default=str(REPO / "configs" / "umls-complex.yaml"))
    p.add_argument(
        "--speed-config", default=str(REPO / "bench" / "configs" / "fb15k237-transe-speed.yaml")
    )
    p.add_argument("--data-root", default=str(REPO.parent / "shared" / "datasets"))
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        modes = {"quality": quality, "speed": speed, "short": short, "overhead": overhead}
        rows = modes[args.what](args, root)
    for r in rows:
        print(
            f"{r['name']:22s} mrr {r['test_mrr'] if r['test_mrr'] is None else round(r['test_mrr'], 4)}"
            f"  {r['triples_per_s_median']:>10,.0f} triples/s  epoch {r['epoch_seconds_median']:.2f}s"
            f" (comm {r['comm_seconds_median']:.2f}s)  {r['bytes_sent_per_epoch'] / 1e6:8.2f} MB/epoch",
            file=sys.stderr,
        )
    text = json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "cpu_count": os.cpu_count(),
                       "hardware": hardware(), "results": rows}, indent=2)  # fmt: skip
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
