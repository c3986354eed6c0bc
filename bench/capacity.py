"""Capacity: a model that does not fit one worker, trained by sharded workers (issue 22).

Generates a synthetic graph (``kgpipe synth``), starts a LocalCluster of ``--workers`` workers
with ``--limit`` memory each (Dask pauses a worker past 80 % and restarts it past 95 %), and
trains one epoch of TransE with Adam on it twice: under the replicated strategy, which the
pre-flight memory check must refuse, and under the sharded one, which must train to the end
without a worker restart. Reports the refusal, the tables' size against the limit, and every
worker's peak resident memory.

    .venv/bin/python bench/capacity.py --entities 4000000 --edges 4000000 --dim 100 --limit 1.5GiB
    .venv/bin/python bench/capacity.py --entities 4600000 --edges 6000000 --exponent 0.2 \
        --dim 100 --limit 4.5GiB
Results: bench/results/capacity_<entities>.json
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
    p.add_argument("--entities", type=int, default=4_000_000)
    p.add_argument("--edges", type=int, default=4_000_000)
    p.add_argument("--relations", type=int, default=50)
    p.add_argument(
        "--exponent",
        type=float,
        default=1.1,
        help="the synthetic graph's power law (0.2 with 6M edges: 4.2M of 4.6M entities appear)",
    )
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--limit", default="1.5GiB", help="memory limit per worker (Dask notation)")
    p.add_argument("--graph", default=None, help="keep the synthetic graph here (reused)")
    args = p.parse_args()

    from dask.utils import parse_bytes
    from distributed import Client

    from kgpipe.config import parse_config
    from kgpipe.distributed.client import open_cluster
    from kgpipe.errors import ConfigError
    from kgpipe.pipeline import train

    limit = int(parse_bytes(args.limit))
    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "memory_limit_bytes": limit,
        "workers": args.workers,
    }
    with tempfile.TemporaryDirectory() as tmp:
        graph = Path(args.graph) if args.graph else Path(tmp) / "graph"
        synth_graph(
            graph,
            entities=args.entities,
            relations=args.relations,
            edges=args.edges,
            exponent=args.exponent,
        )
        for strategy in ("replicated", "sharded"):
            with open_cluster("local", workers=args.workers, memory_limit=limit) as client:
                assert isinstance(client, Client)
                base = client.run(rss)
                tree: dict[str, Any] = {
                    "run": {"root": str(Path(tmp) / "runs"), "name": strategy},
                    "data": {
                        "train": str(graph / "train.tsv"),
                        "valid": str(graph / "valid.tsv"),
                        "test": str(graph / "test.tsv"),
                        "header": False,
                    },
                    "model": {"name": "transe", "dim": args.dim},
                    "training": {"epochs": 1, "batch_size": 4096, "negatives": 64,
                                 "loss": "cross_entropy", "optimizer": "adam"},
                    "evaluation": {"every": 0, "test": False},
                    "distributed": {"workers": args.workers, "strategy": strategy,
                                    "cluster": str(client.scheduler.address)},
                }  # fmt: skip
                t0 = time.perf_counter()
                row: dict[str, Any] = {"worker_rss_before_bytes": list(base.values())}
                try:
                    result = train(parse_config(tree))
                except ConfigError as err:
                    row["refused"] = str(err)
                else:
                    last = result.history[-1]
                    row.update(
                        epochs=len(result.history),
                        triples=last.triples,
                        triples_per_s=last.triples_per_s,
                        restarts=last.extra.get("restarts"),
                    )
                row["seconds"] = round(time.perf_counter() - t0, 1)
                row["worker_peak_rss_bytes"] = list(client.run(peak_rss).values())
                # the driver stages the graph (for the pre-flight check too)
                row["driver_peak_rss_bytes"] = peak_rss()
                out[strategy] = row
                print(strategy, json.dumps(row)[:600], flush=True)
        info = json.loads((Path(tmp) / "runs" / "sharded" / "data.json").read_text())
    n = int(info["num_entities"])
    out["entities"] = n
    tables = 4 * (n + int(info["num_relations"])) * args.dim
    out["tables_and_adam_bytes"] = 3 * tables
    out["tables_and_adam_over_limit"] = round(3 * tables / limit, 2)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"capacity_{n}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
