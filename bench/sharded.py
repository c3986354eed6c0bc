"""Sharded against replicated step sync on a real graph: throughput and bytes per epoch (issue 22).

Trains the shipped FB15k-237 TransE config for ``--epochs`` epochs as a gang of ``--workers``
ranks on one LocalCluster, once per strategy per round, rounds interleaved (replicated, sharded,
replicated, ...), and reports the medians of triples/s over the epochs after the first, and the
bytes each rank sent per epoch (the ranks' own accounting of what their collectives carried).

    .venv/bin/python bench/sharded.py --data-root ../shared/datasets --epochs 3 --rounds 3
Results: bench/results/sharded_vs_replicated_fb15k237.json
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
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", action="append", default=[], help="more config overrides k=v")
    p.add_argument("--json", default=str(RESULTS / "sharded_vs_replicated_fb15k237.json"))
    args = p.parse_args()

    import yaml
    from distributed import Client

    from kgpipe.config import parse_config
    from kgpipe.config.io import apply_overrides
    from kgpipe.distributed.client import open_cluster
    from kgpipe.pipeline import train

    runs: dict[str, list[dict[str, Any]]] = {"replicated": [], "sharded": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_cluster("local", workers=args.workers) as client,
    ):
        assert isinstance(client, Client)
        for r in range(args.rounds):
            for strategy in ("replicated", "sharded"):
                tree = yaml.safe_load(Path(args.config).read_text())
                tree["run"] = {"root": tmp, "name": f"{strategy}-{r}", "seed": 0}
                tree["data"]["root"] = args.data_root
                tree["training"]["epochs"] = args.epochs
                tree["evaluation"] = {"every": 0, "test": False}
                tree["distributed"] = {
                    "workers": args.workers,
                    "cluster": str(client.scheduler.address),
                    "sync": "step",
                    "strategy": strategy,
                }
                t0 = time.perf_counter()
                result = train(parse_config(apply_overrides(tree, args.set)))
                seconds = time.perf_counter() - t0
                epochs = [h.as_dict() for h in result.history]
                runs[strategy].append({"seconds": round(seconds, 1), "epochs": epochs})
                print(strategy, r, [round(e["triples_per_s"]) for e in epochs], flush=True)
    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "workers": args.workers,
        "epochs": args.epochs,
        "rounds": args.rounds,
    }
    for strategy, rows in runs.items():
        later = [e for run in rows for e in run["epochs"][1:]] or [
            e for run in rows for e in run["epochs"]
        ]
        out[strategy] = {
            "triples_per_s_median": statistics.median(e["triples_per_s"] for e in later),
            "bytes_sent_per_epoch_median": statistics.median(e["bytes_sent"] for e in later),
            "comm_seconds_per_epoch_median": statistics.median(e["comm_seconds"] for e in later),
            "runs": rows,
        }
    out["sharded_over_replicated_throughput"] = round(
        out["sharded"]["triples_per_s_median"] / out["replicated"]["triples_per_s_median"], 3
    )
    out["sharded_over_replicated_bytes"] = round(
        out["sharded"]["bytes_sent_per_epoch_median"]
        / out["replicated"]["bytes_sent_per_epoch_median"],
        3,
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
