"""Train a shipped config end to end through the Prefect flow and append a quality row.

    .venv/bin/python bench/quality.py configs/fb15k237-complex.yaml --set training.epochs=25

Appends one JSON line to ``bench/results/quality.jsonl``: data set, model, test MRR and
Hits@1/3/10 (full filtered ranking, protocol stated), epochs, wall time, the validation curve
with cumulative training time (time-to-quality), hardware and commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import commit, hardware  # noqa: E402

from flows.cli import local_prefect_defaults  # noqa: E402
from kgpipe.config import load_config  # noqa: E402

PUBLISHED = {  # ../shared/datasets/README.md: filtered test MRR
    ("fb15k-237", "transe"): 0.313, ("fb15k-237", "distmult"): 0.343,
    ("fb15k-237", "complex"): 0.348, ("fb15k-237", "rotate"): 0.338,
    ("wn18rr", "transe"): 0.228, ("wn18rr", "distmult"): 0.452,
    ("wn18rr", "complex"): 0.475, ("wn18rr", "rotate"): 0.476,
}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "quality.jsonl"))
    a = p.parse_args()
    local_prefect_defaults()  # as the CLI does: no telemetry, a patient temporary-server start
    from flows.train import train_kge

    cfg = load_config(a.config, a.set).with_run_name()
    code = commit()  # the code that trains: HEAD may move while a long run goes on
    t0 = time.perf_counter()
    summary = train_kge(cfg, resume=True)
    wall = time.perf_counter() - t0
    run = Path(summary["run"])
    results = json.loads((run / "results.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    elapsed, curve = 0.0, []
    for r in rows:
        elapsed += r["seconds"] + r.get("valid_seconds", 0.0)
        if "valid_mrr" in r:
            curve.append({"epoch": r["epoch"], "train_seconds": round(elapsed, 1),
                          "valid_mrr": r["valid_mrr"], "valid_hits@10": r["valid_hits@10"]})  # fmt: skip
    published = PUBLISHED.get((cfg.data.dataset or "", cfg.model.name))
    row = {
        "dataset": cfg.data.dataset,
        "model": cfg.model.name,
        "config": a.config,
        "overrides": a.set,
        **{k: results[k] for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10")},
        "published_mrr": published,
        "epochs": len(rows),
        "wall_seconds": wall,
        "valid_curve": curve,
        "protocol": results["protocol"],
        "run": str(run),
        "hardware": hardware(),
        "commit": code,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    with open(a.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
