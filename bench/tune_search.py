"""Hyperparameter search benchmarks (issue 24): pruning and parallel trials.

``pruning``: on Kinship, UMLS and Nations, a deliberately poor config (what a search starts
from) is trained once; then the same search (the shipped ComplEx space with dimensions and
negatives scaled to graphs of 14-135 entities, same seed, same random start-up, 2 workers) runs
without pruning (``--trials`` trials) and with each pruner (``--pruned-factor`` times as many
trials). Reported per graph: the poor config's valid MRR; each search's best valid MRR, total
trial-epochs and wall time; for a pruned search, its first ``--trials`` trials (best, epochs)
and the trial-epochs it had spent when a complete trial first reached the unpruned search's
best ("equal best valid MRR"), each trial's epochs spread evenly over its run.

``workers``: trials per hour with 1 worker (2 threads) and 2 workers (1 thread each) -- the same
two cores -- on the same budget (``--trials`` trials, or ``--budget`` seconds of wall time, the
cluster's start included) of trials that all cost the same (UMLS ComplEx, only the learning
rate searched, no pruning), interleaved rounds, medians.

    .venv/bin/python bench/tune_search.py pruning --trials 24 --pruners none asha median
    .venv/bin/python bench/tune_search.py workers --trials 16 --rounds 2
    .venv/bin/python bench/tune_search.py workers --budget 300 --rounds 3

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
    results["timeline"] = [
        {
            "trial": t.number,
            "state": t.state.name.lower(),
            "value": t.value,
            "epochs": int(t.user_attrs.get("epochs") or 0),
            "start": (t.datetime_start - first).total_seconds(),
            "end": (t.datetime_complete - first).total_seconds(),
        }
        for t in trials
        if t.datetime_start is not None and t.datetime_complete is not None
    ]
    return results


def epochs_spent(timeline: list[dict[str, Any]], at: float) -> float:
    """Trial-epochs trained by time ``at`` (seconds from the first trial's start), each trial's
    epochs spread evenly over its run."""
    spent = 0.0
    for t in timeline:
        span = max(t["end"] - t["start"], 1e-9)
        spent += t["epochs"] * min(1.0, max(0.0, (at - t["start"]) / span))
    return spent


def epochs_to_reach(timeline: list[dict[str, Any]], target: float) -> float | None:
    """Trial-epochs a search had spent when a complete trial first reached ``target`` valid
    MRR (None: never)."""
    hits = [
        t["end"]
        for t in timeline
        if t["state"] == "complete" and t["value"] is not None and t["value"] >= target - 1e-9
    ]
    return epochs_spent(timeline, min(hits)) if hits else None


def first_trials(timeline: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Best complete valid MRR and trial-epochs of trials 0..n-1 (a search of n trials)."""
    head = [t for t in timeline if t["trial"] < n]
    values = [t["value"] for t in head if t["state"] == "complete" and t["value"] is not None]
    return {
        "best_valid_mrr": max(values) if values else None,
        "trial_epochs": sum(t["epochs"] for t in head),
    }


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
                # a pruned search gets more trials: the question is the trial-epochs it needs
                # to find what the unpruned search of `--trials` trials finds
                n = args.trials if pruner == "none" else args.trials * args.pruned_factor
                # `median-w0`: the median rule with prune_warmup 0 (may stop a trial at its
                # first validation); a bare name keeps the default warm-up
                name, _, warmup = pruner.partition("-w")
                extra = {"prune_warmup": int(warmup)} if warmup else {}
                r = _search(
                    base,
                    _small_graph_space(),
                    root=tmp,
                    name=f"{dataset}-{pruner}",
                    trials=n,
                    workers=2,
                    seed=args.seed,
                    pruner=name,
                    # the same random start-up
                    startup_trials=args.startup or max(5, args.trials // 5),
                    **extra,
                )
                row[pruner] = {
                    "best_valid_mrr": r["best"]["valid_mrr"],
                    "best_test_mrr": r["best"].get("test", {}).get("mrr"),
                    "best_test_error": r["best"].get("test_error"),
                    "trial_epochs": r["trial_epochs"],
                    "trials": r["trials"],
                    "wall_seconds": round(r["wall_seconds"], 1),
                    "best_values": r["best"]["values"],
                    "first_trials": first_trials(r["timeline"], args.trials),
                    "timeline": r["timeline"],
                }
                print(
                    dataset,
                    pruner,
                    json.dumps(
                        {k: v for k, v in row[pruner].items() if k != "timeline"}, default=str
                    ),
                    flush=True,
                )
            if "none" in row:
                target = row["none"]["best_valid_mrr"]
                none_epochs = row["none"]["trial_epochs"]
                row["target_valid_mrr"] = target
                row["none"]["epochs_to_target"] = epochs_to_reach(row["none"]["timeline"], target)
                for pruner in args.pruners:
                    if pruner == "none":
                        continue
                    r = row[pruner]
                    same = r["first_trials"]
                    r["same_trials_saved"] = 1 - same["trial_epochs"] / none_epochs
                    reach = epochs_to_reach(r["timeline"], target)
                    r["epochs_to_target"] = reach
                    r["saved_to_target"] = None if reach is None else 1 - reach / none_epochs
                    print(
                        dataset,
                        pruner,
                        f"first {args.trials} trials: best {same['best_valid_mrr']}, "
                        f"{same['trial_epochs']} epochs ({r['same_trials_saved']:.0%} saved); "
                        f"reached the unpruned best {target:.4f} after "
                        f"{'never' if reach is None else f'{reach:.0f} epochs'} "
                        f"(unpruned: {none_epochs} in all)",
                        flush=True,
                    )
            out[dataset] = row
            if args.partial:  # what is done so far survives a later failure
                Path(args.partial).write_text(json.dumps(out, indent=2, default=str) + "\n")
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
    done: dict[int, list[int]] = {1: [], 2: []}
    # a budget of time (--budget) or of trials (--trials): with a time budget both searches
    # start no trial after it and finish the ones running, so each pays its cluster's start
    # and its last trials out of the same budget
    budget: dict[str, Any] = (
        {"trials": None, "timeout_s": args.budget} if args.budget else {"trials": args.trials}
    )
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for w in (1, 2):
                r = _search(
                    base,
                    space,
                    root=tmp,
                    name=f"w{w}-r{rnd}",
                    workers=w,
                    seed=rnd,
                    pruner="none",
                    test_best=False,
                    **budget,
                )
                n = sum(1 for t in r["timeline"] if t["state"] == "complete")
                done[w].append(n)
                rate = n / r["wall_seconds"] * 3600
                rates[w].append(rate)
                steady[w].append(n / r["trials_span_seconds"] * 3600)
                print(
                    f"round {rnd} workers {w}: {n} trials, {rate:.0f} trials/h "
                    f"({r['wall_seconds']:.1f} s with the cluster's start and end), "
                    f"{steady[w][-1]:.0f} trials/h from the first trial's start to the last "
                    "one's end",
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
        "trials_complete": done,
        "budget_trials": None if args.budget else args.trials,
        "budget_seconds": args.budget,
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
    p.add_argument("--pruners", nargs="+", default=["none", "median"])
    p.add_argument(
        "--pruned-factor",
        type=int,
        default=2,
        help="a pruned search runs this many times --trials trials",
    )
    p.add_argument(
        "--startup",
        type=int,
        default=None,
        help="random start-up trials of every search (default: max(5, trials // 5)); "
        "--startup N --pruned-factor 1 with N = --trials makes both searches random searches "
        "of the same configs, so that they differ only by the pruner",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="workers: a budget of this many seconds per search instead of --trials trials",
    )
    p.add_argument("--out", default=None, help="result file name under bench/results")
    p.add_argument("--partial", default=None, help="pruning: write each graph's results here too")
    args = p.parse_args()
    result = pruning(args) if args.what == "pruning" else workers(args)
    record = {"hardware": hardware(), "commit": commit(), "command": " ".join(sys.argv), **result}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (args.out or f"tune_{args.what}.json")
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
