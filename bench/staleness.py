"""Bounded staleness against every row fresh every step, sharded, on a real graph (issue 22).

Trains the shipped FB15k-237 TransE config for ``--epochs`` epochs as a sharded gang of
``--workers`` ranks on one LocalCluster, once per ``distributed.staleness`` in ``--staleness``
(0: every row fetched every step), and reports for each: the validation MRR after the last
epoch (quality), the median triples/s over the epochs after the first, the bytes each rank
sent per epoch, and the rows read from the cache against the rows fetched.

    .venv/bin/python bench/staleness.py --data-root ../shared/datasets --epochs 10 --staleness 0 1 4
Results: bench/results/staleness_fb15k237.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-root", default="../shared/datasets")
    p.add_argument("--config", default=str(ROOT / "configs" / "fb15k237-transe.yaml"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 4])
    p.add_argument("--json", default=str(RESULTS / "staleness_fb15k237.json"))
    args = p.parse_args()

    import yaml
    from distributed import Client

    from kgpipe.config import parse_config
    from kgpipe.distributed.client import open_cluster
    from kgpipe.pipeline import train

    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "workers": args.workers,
        "epochs": args.epochs,
        "runs": {},
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_cluster("local", workers=args.workers) as client,
    ):
        assert isinstance(client, Client)
        for k in args.staleness:
            tree = yaml.safe_load(Path(args.config).read_text())
            tree["run"] = {"root": tmp, "name": f"staleness-{k}", "seed": 0}
            tree["data"]["root"] = args.data_root
            tree["training"]["epochs"] = args.epochs
            tree["evaluation"] = {"every": args.epochs, "test": False, "batch_size": 512}
            tree["distributed"] = {
                "workers": args.workers,
                "cluster": str(client.scheduler.address),
                "strategy": "sharded",
                "staleness": k,
            }
            t0 = time.perf_counter()
            result = train(parse_config(tree))
            seconds = time.perf_counter() - t0
            epochs = [h.as_dict() for h in result.history]
            later = epochs[1:] or epochs
            row = {
                "seconds": round(seconds, 1),
                "valid_mrr": epochs[-1].get("valid_mrr"),
                "triples_per_s_median": statistics.median(e["triples_per_s"] for e in later),
                "bytes_sent_per_epoch_median": statistics.median(e["bytes_sent"] for e in later),
                "comm_seconds_per_epoch_median": statistics.median(
                    e["comm_seconds"] for e in later
                ),
                "rows_cached": sum(e.get("rows_cached", 0) for e in epochs),
                "rows_fetched": sum(e.get("rows_fetched", 0) for e in epochs),
                "epochs": epochs,
            }
            out["runs"][str(k)] = row
            print(k, json.dumps({x: v for x, v in row.items() if x != "epochs"}), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
