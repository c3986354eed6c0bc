"""Do two checkouts train the same numbers? Runs a fixed set of small configs with each and
compares the trained parameters bit for bit (and the per-epoch losses, validation MRRs,
learning rates and test MRR) -- the check for a change that must not move any number.

    .venv/bin/python bench/same_numbers.py --before /tmp/wt-base

The configs cover every training mode, every model, dropout, regularisers, the plateau,
cosine and linear schedules, warm-up, clipping, early stopping, and 2-worker Dask gangs in
step and epoch sync with int8 and top-k compression (UMLS, a few epochs each; threads pinned,
so the comparison does not depend on the machine's load). Each checkout runs in its own
process, from its own folder (its ``kgpipe`` package first on the path).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _case(name: str, model: dict, training: dict, evaluation: dict | None = None,
          distributed: dict | None = None) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {
        "run": {"name": name, "seed": 0},
        "data": {"dataset": "umls"},
        "model": model,
        "training": {"threads": 2, **training},
        "evaluation": {"test": True, **(evaluation or {})},
    }
    if distributed:
        out["distributed"] = distributed
    return out


NS = {"batch_size": 512, "negatives": 32, "chunk_size": 64}
CASES = [
    _case("complex-1vsall", {"name": "complex", "dim": 64, "reciprocal": True,
          "regularizer": {"type": "n3", "weight": 0.005}},
          {"epochs": 6, "batch_size": 256, "mode": "1vsall", "loss": "cross_entropy",
           "optimizer": "adagrad", "lr": 0.1}, {"every": 2}),
    _case("distmult-ns-dropout", {"name": "distmult", "dim": 32,
          "dropout": {"entity": 0.2, "relation": 0.1},
          "regularizer": {"type": "lp", "weight": 0.001, "p": 3}},
          {"epochs": 4, **NS, "negatives": 64, "loss": "softplus", "lr": 0.01},
          {"every": 2, "sampled": 50}),
    _case("transe-ns-margin", {"name": "transe", "dim": 32, "p": 1, "margin": 2.0},
          {"epochs": 4, "batch_size": 500, "negatives": 32, "chunk_size": 100, "loss": "margin",
           "margin": 1.0, "lr": 0.01, "warmup_steps": 5, "schedule": "linear"}),
    _case("rotate-nssa", {"name": "rotate", "dim": 32, "margin": 6.0},
          {"epochs": 3, **NS, "loss": "nssa", "adversarial_temperature": 0.5, "lr": 0.01,
           "schedule": "cosine", "clip_grad_norm": 1.0}),
    _case("distmult-kvsall-plateau", {"name": "distmult", "dim": 32, "dropout": {"entity": 0.1}},
          {"epochs": 6, "batch_size": 128, "mode": "kvsall", "loss": "cross_entropy",
           "label_smoothing": 0.1, "optimizer": "adagrad", "lr": 0.2, "schedule": "plateau",
           "plateau": {"patience": 0, "threshold": 10.0}}, {"every": 2}),
    _case("complex-kvsall-bce", {"name": "complex", "dim": 32, "reciprocal": True},
          {"epochs": 3, "batch_size": 256, "mode": "kvsall", "loss": "bce", "lr": 0.01}),
    _case("distmult-1vsall-bce", {"name": "distmult", "dim": 32,
          "dropout": {"entity": 0.2, "relation": 0.2}},
          {"epochs": 3, "batch_size": 256, "mode": "1vsall", "loss": "bce", "lr": 0.01,
           "max_steps_per_epoch": 10}),
    _case("complex-early-stop", {"name": "complex", "dim": 16},
          {"epochs": 12, **NS, "negatives": 16, "loss": "softplus", "lr": 0.5},
          {"every": 1, "patience": 2}),
    _case("complex-dask-step", {"name": "complex", "dim": 32},
          {"epochs": 3, **NS, "loss": "margin", "lr": 0.01}, {"every": 2},
          {"workers": 2, "sync": "step"}),
    _case("transe-dask-epoch-int8", {"name": "transe", "dim": 32},
          {"epochs": 3, **NS, "loss": "margin", "lr": 0.01}, None,
          {"workers": 2, "sync": "epoch", "compression": "int8"}),
    _case("complex-dask-1vsall-topk", {"name": "complex", "dim": 32, "reciprocal": True},
          {"epochs": 2, "batch_size": 256, "mode": "1vsall", "loss": "cross_entropy",
           "lr": 0.01}, None, {"workers": 2, "sync": "step", "compression": "topk"}),
]  # fmt: skip


def child(root: str) -> None:
    """Train every case into ``root`` with the kgpipe this process imports; print a summary."""
    import kgpipe
    from kgpipe.config import parse_config

    try:
        from kgpipe.pipeline import train
    except ImportError:  # checkouts from before kgpipe.pipeline
        from kgpipe.run import train  # type: ignore[no-redef]
    from safetensors.torch import load_file

    out = {}
    for case in CASES:
        name = case["run"]["name"]
        data = json.loads(json.dumps(case))
        data["run"]["root"] = root
        train(parse_config(data))
        folder = Path(root) / name
        tables = load_file(folder / "model.safetensors")
        digest = hashlib.sha256(
            b"".join(tables[k].numpy().tobytes() for k in ("entity", "relation"))
        )
        rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        results = json.loads((folder / "results.json").read_text())
        out[name] = {
            "parameters_sha256": digest.hexdigest(),
            "loss": [r["loss"] for r in rows],
            "valid_mrr": [r.get("valid_mrr") for r in rows],
            "lr": [r["lr"] for r in rows],
            "test_mrr": results["mrr"],
            "model_epoch": results["training"]["model_epoch"],
        }
    print(json.dumps({"kgpipe": str(Path(kgpipe.__file__).parent), "cases": out}))


def run_checkout(path: Path) -> dict[str, Any]:
    """The summary of ``path``'s code: ``{"kgpipe": the package that ran, "cases": ...}``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", tmp],
            cwd=path, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", help="the other checkout (a folder holding its kgpipe package)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--json")
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    after_run = run_checkout(REPO)
    after = after_run["cases"]
    report: dict[str, Any] = {"after": after_run}
    if args.before:
        before_run = run_checkout(Path(args.before).resolve())
        if before_run["kgpipe"] == after_run["kgpipe"]:
            raise SystemExit(f"both runs imported {after_run['kgpipe']}: check --before")
        before = before_run["cases"]
        report["before"] = before_run
        report["differ"] = {
            name: [k for k in after[name] if after[name][k] != before.get(name, {}).get(k)]
            for name in after
            if after[name] != before.get(name)
        }
        for name in after:
            same = (
                "same" if name not in report["differ"] else f"DIFFERS in {report['differ'][name]}"
            )
            print(f"{name:28s} {after[name]['parameters_sha256'][:16]}  {same}", file=sys.stderr)
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text if not args.before else json.dumps({"differ": report["differ"]}))
    if args.before and report["differ"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
