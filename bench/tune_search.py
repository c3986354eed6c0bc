"""Hyperparameter search benchmarks (issue 24): pruning and parallel trials.

``pruning``: on Kinship, UMLS and Nations, a deliberately poor config (what a search starts
from) is trained once; then the same search (the shipped ComplEx space with dimensions and
negatives scaled to graphs of 14-135 entities, same seed, same trial budget, 2 workers) runs
with the median pruner and without. Reported per graph: the poor
config's valid MRR, each search's best valid MRR, total trial-epochs and wall time.

``workers``: trials per hour with 1 worker (2 threads) and 2 workers (1 thread each) -- the same
two cores -- on the same budget of trials that all cost the same (UMLS ComplEx, only the
learning rate searched, no pruning), interleaved rounds, medians.

    .venv/bin/python bench/tune_search.py pruning --trials 30
    .venv/bin/python bench/tune_search.py workers --trials 16 --rounds 2

Results go to bench/results/tune_{pruning,workers}.json.
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

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
RESULTS = Path(__file__).resolve().parent / "results"

POOR = {  # a config one would not ship: tiny, slow learning rate, few negatives, softplus
    "model": {"name": "complex", "dim": 16},
    "training": {
        "epochs": 20,
        "batch_size": 256,
        "loss": "softplus",
        "negatives": 4,
        "optimizer": "adam",
        "lr": 0.0003,
    },
    "evaluation": {"every": 4, "batch_size": 512},
    "checkpoint": {"every": 4},
}


def _config(dataset: str, extra: dict[str, Any] | None = None) -> Any:
    from kgpipe.config.io import parse_config

    data = json.loads(json.dumps(POOR))
    data["data"] = {"dataset": dataset, "root": str(SHARED)}
    for k, v in (extra or {}).items():
        data.setdefault(k, {}).update(v)
    return parse_config(data)


def _search(base: Any, space: Any, *, root: str, name: str, **settings: Any) -> dict[str, Any]:
    from kgpipe.tune import TuneSettings, prepare_study, run_and_summarize
    from kgpipe.tune.study import load_optuna_study

    folder = prepare_study(base, space, TuneSettings(root=root, name=name, **settings))
    t0 = time.perf_counter()
    results = run_and_summarize(folder)
    results["wall_seconds"] = time.perf_counter() - t0
    trials = load_optuna_study(folder).get_trials()
    first = min(t.datetime_start for t in trials)
    last = max(t.datetime_complete for t in trials)
    # from the first trial's start to the last one's end: without the cluster's start-up
    results["trials_span_seconds"] = (last - first).total_seconds()
    return results


def _small_graph_space() -> Any:
    """The shipped ComplEx space, its dimensions and negatives scaled to graphs of 14-135
    entities (512-d embeddings and 1024 negatives of 135 entities only cost time)."""
    from kgpipe.tune import SearchSpace, default_space

    raw = dict(default_space("complex").raw)
    raw["model.dim"] = {"choices": [32, 64, 128]}
    raw["training.negatives"] = {"int": [8, 256], "log": True}
    return SearchSpace.from_mapping(raw, source="small-graph ComplEx space")


def pruning(args: argparse.Namespace) -> dict[str, Any]:
    from kgpipe.pipeline import train

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets:
            base = _config(dataset)
            poor = train(base.model_copy(update={"run": base.run.model_copy(update={"root": tmp})}))
            poor_valid = max(h.extra.get("valid_mrr", 0.0) for h in poor.history)
            row: dict[str, Any] = {"poor_valid_mrr": poor_valid, "poor_config": POOR}
            for pruner in args.pruners:
                r = _search(
                    base,
                    _small_graph_space(),
                    root=tmp,
                    name=f"{dataset}-{pruner}",
                    trials=args.trials,
                    workers=2,
                    seed=args.seed,
                    pruner=pruner,
                )
                row[pruner] = {
                    "best_valid_mrr": r["best"]["valid_mrr"],
                    "best_test_mrr": r["best"]["test"]["mrr"],
                    "trial_epochs": r["trial_epochs"],
                    "trials": r["trials"],
                    "wall_seconds": round(r["wall_seconds"], 1),
                    "best_values": r["best"]["values"],
                }
                print(dataset, pruner, json.dumps(row[pruner], default=str), flush=True)
            if "none" in row:
                for pruner in args.pruners:
                    if pruner != "none":
                        saved = 1 - row[pruner]["trial_epochs"] / row["none"]["trial_epochs"]
                        row[f"epochs_saved_{pruner}"] = saved
                        print(dataset, pruner, f"saved {saved:.0%}", flush=True)
            out[dataset] = row
            print(dataset, f"poor {poor_valid:.4f}", flush=True)
    return out


def workers(args: argparse.Namespace) -> dict[str, Any]:
    from kgpipe.tune import SearchSpace

    space = SearchSpace.from_yaml("training.lr: {loguniform: [1.0e-3, 0.1]}")
    base = _config(
        "umls",
        {
            "model": {"dim": 64},
            "training": {"epochs": 20, "loss": "cross_entropy", "negatives": 32},
            "evaluation": {"every": 5},
        },
    )
    rates: dict[int, list[float]] = {1: [], 2: []}
    steady: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for w in (1, 2):
                r = _search(
                    base,
                    space,
                    root=tmp,
                    name=f"w{w}-r{rnd}",
                    trials=args.trials,
                    workers=w,
                    seed=rnd,
                    pruner="none",
                    test_best=False,
                )
                rate = args.trials / r["wall_seconds"] * 3600
                rates[w].append(rate)
                steady[w].append(args.trials / r["trials_span_seconds"] * 3600)
                print(
                    f"round {rnd} workers {w}: {rate:.0f} trials/h ({r['wall_seconds']:.1f} s "
                    f"with the cluster's start), {steady[w][-1]:.0f} trials/h from the first "
                    f"trial's start to the last one's end",
                    flush=True,
                )
    med = {w: statistics.median(v) for w, v in rates.items()}
    med_steady = {w: statistics.median(v) for w, v in steady.items()}
    return {
        "trials_per_hour": rates,
        "median": med,
        "ratio_2_over_1": med[2] / med[1],
        "trials_per_hour_trials_only": steady,
        "median_trials_only": med_steady,
        "ratio_2_over_1_trials_only": med_steady[2] / med_steady[1],
        "budget_trials": args.trials,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("what", choices=["pruning", "workers"])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--datasets", nargs="+", default=["kinship", "umls", "nations"])
    p.add_argument("--pruners", nargs="+", default=["median", "none"])
    p.add_argument("--out", default=None, help="result file name under bench/results")
    args = p.parse_args()
    result = pruning(args) if args.what == "pruning" else workers(args)
    record = {"hardware": hardware(), "commit": commit(), "command": " ".join(sys.argv), **result}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (args.out or f"tune_{args.what}.json")
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
