"""Peak resident memory per Dask worker of a training gang (issue 22: the "before" of sharding).

Generates a synthetic graph (``kgpipe synth``), then trains it for one epoch as a gang of
``--workers`` ranks on a LocalCluster this script starts the way kgpipe does (one process per
worker, ``distributed.memory_limit`` not set), and reads every worker process's peak resident
set (``VmHWM``: not ``ru_maxrss``, which a worker inherits from the driver that spawned it; see
``bench.common.peak_rss``) after the run. Reported next to what the run must hold: the tables
and their optimiser state, the staged training triples. Evaluation is off (its score blocks are
measured by ``bench/eval_speed.py``).

    .venv/bin/python bench/memory.py --entities 1000000 --edges 4400000 --dim 100 [--resume]
Results: bench/results/memory_<strategy>_<entities>[_<tag>].json. With ``--resume``, fresh
workers then resume the run for a second epoch, and their peaks are reported too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, peak_rss, rss, synth_graph

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entities", type=int, default=1_000_000)
    p.add_argument("--relations", type=int, default=50)
    p.add_argument("--edges", type=int, default=4_400_000)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument(
        "--exponent",
        type=float,
        default=1.1,
        help="the synthetic graph's power law (0.2 with 6M edges: 4.2M of 4.6M entities appear)",
    )
    p.add_argument("--model", default="transe")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--negatives", type=int, default=64)
    p.add_argument("--set", action="append", default=[], help="more config overrides k=v")
    p.add_argument(
        "--resume",
        action="store_true",
        help="then, on fresh workers, resume the run for one more epoch (a resume's peak)",
    )
    p.add_argument("--tag", default="", help="suffix of the result file's name")
    p.add_argument(
        "--graph", default=None, help="keep the synthetic graph here (reused when it exists)"
    )
    args = p.parse_args()

    from distributed import Client

    from kgpipe.config import parse_config
    from kgpipe.config.io import apply_overrides
    from kgpipe.distributed.client import open_cluster
    from kgpipe.pipeline import train

    with tempfile.TemporaryDirectory() as tmp:
        graph = Path(args.graph) if args.graph else Path(tmp) / "graph"
        t0 = time.perf_counter()
        synth_graph(
            graph,
            entities=args.entities,
            relations=args.relations,
            edges=args.edges,
            exponent=args.exponent,
        )
        synth_s = time.perf_counter() - t0
        with open_cluster("local", workers=args.workers) as client:
            assert isinstance(client, Client)
            base = client.run(rss)  # each worker before the run: interpreter, torch, Dask
            tree: dict[str, Any] = {
                "run": {"root": str(Path(tmp) / "runs"), "name": "mem"},
                "data": {
                    "train": str(graph / "train.tsv"),
                    "valid": str(graph / "valid.tsv"),
                    "test": str(graph / "test.tsv"),
                    "header": False,
                },
                "model": {"name": args.model, "dim": args.dim},
                "training": {
                    "epochs": 1,
                    "batch_size": args.batch_size,
                    "negatives": args.negatives,
                    "loss": "cross_entropy",
                    "optimizer": args.optimizer,
                },
                "evaluation": {"every": 0, "test": False},
                "distributed": {
                    "workers": args.workers,
                    "cluster": str(client.scheduler.address),
                },
            }
            config = parse_config(apply_overrides(tree, args.set))
            t0 = time.perf_counter()
            result = train(config)
            train_s = time.perf_counter() - t0
            peaks = client.run(peak_rss)
        resumed: dict[str, Any] = {}
        if args.resume:  # new processes, so that their peaks are the resume's alone
            with open_cluster("local", workers=args.workers) as client:
                assert isinstance(client, Client)
                before = client.run(rss)
                tree["distributed"]["cluster"] = str(client.scheduler.address)
                tree["training"]["epochs"] = 2
                t0 = time.perf_counter()
                train(parse_config(apply_overrides(tree, args.set)), resume=True)
                resumed = {
                    "seconds": round(time.perf_counter() - t0, 1),
                    "worker_rss_before_bytes": list(before.values()),
                    "worker_peak_rss_bytes": list(client.run(peak_rss).values()),
                }
        info = json.loads((Path(tmp) / "runs" / "mem" / "data.json").read_text())
    n, r = int(info["num_entities"]), int(info["num_relations"])
    relation_rows = r * (2 if config.model.reciprocal else 1)
    slots = {"adam": 2, "adagrad": 1, "sgd": 0}.get(args.optimizer, 2)
    tables = (n * args.dim + relation_rows * args.dim) * 4
    needed = tables * (1 + slots)
    triples = int(result.history[-1].triples) if result.history else 0
    out = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "strategy": config.distributed.strategy,
        "entities": n,
        "relations": r,
        "train_triples": triples,
        "dim": args.dim,
        "optimizer": args.optimizer,
        "workers": args.workers,
        "synth_seconds": round(synth_s, 1),
        "train_seconds": round(train_s, 1),
        "triples_per_s": result.history[-1].triples_per_s if result.history else None,
        "tables_bytes": tables,
        "tables_and_optimizer_bytes": needed,
        "worker_rss_before_bytes": list(base.values()),
        "worker_peak_rss_bytes": list(peaks.values()),
        "peak_over_tables_and_optimizer": [round(v / needed, 2) for v in peaks.values()],
        "peak_added_over_tables_and_optimizer": [
            round((peaks[k] - base[k]) / needed, 2) for k in peaks
        ],
    }
    if resumed:
        resumed["peak_over_tables_and_optimizer"] = [
            round(v / needed, 2) for v in resumed["worker_peak_rss_bytes"]
        ]
        out["resume_one_more_epoch"] = resumed
    print(json.dumps(out, indent=1))
    RESULTS.mkdir(exist_ok=True)
    path = (
        RESULTS
        / f"memory_{config.distributed.strategy}_{n}{'_' + args.tag if args.tag else ''}.json"
    )
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
