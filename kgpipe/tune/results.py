"""What a study found: the trials table, the best config (ready for ``kgpipe train -c``), the
winner's test metrics, and the plots (best-so-far curve, parameter importances)."""

from __future__ import annotations

import csv
import io
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.config.io import config_to_yaml
from kgpipe.errors import KgpipeError
from kgpipe.tune.folder import StudyFolder
from kgpipe.tune.settings import redact_url
from kgpipe.tune.space import trial_config
from kgpipe.tune.track import track_findings

__all__ = [
    "best_config",
    "best_so_far",
    "best_trial",
    "importances",
    "summarize",
    "trial_rows",
    "write_plots",
]

Log = Callable[[str], None]


def _state(trial: Any) -> str:
    return str(trial.state.name).lower()


def trial_rows(study: Any) -> list[dict[str, Any]]:
    """One row per trial: number, state, valid MRR, epochs, seconds, the sampled values."""
    from optuna.trial import TrialState

    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:  # enqueued (the base config), not started yet
            continue
        value = t.user_attrs.get("best_valid_mrr")  # a pruned trial's t.value is its last
        if value is None:
            value = t.value
        row: dict[str, Any] = {
            "trial": t.number,
            "state": _state(t),
            "valid_mrr": None if value is None else round(float(value), 4),
            "epochs": t.user_attrs.get("epochs"),
            "seconds": t.user_attrs.get("seconds"),
        }
        row.update(t.user_attrs.get("values", {}))
        if t.user_attrs.get("error"):
            row["error"] = str(t.user_attrs["error"]).splitlines()[0][:200]
        rows.append(row)
    return rows


def best_so_far(study: Any) -> list[tuple[int, float]]:
    """``(trial number n, best valid MRR of the trials numbered up to n that may win)``, as
    Optuna's optimisation history plots it; the candidates are :func:`best_trial`'s, so the
    curve ends at the study's best."""
    done = [t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None]
    done.sort(key=lambda t: t.number)
    best, out = -math.inf, []
    for t in done:
        value = _candidate_value(t)
        if value is not None:
            best = max(best, value)
        if best > -math.inf:
            out.append((t.number, best))
    return out


def importances(study: Any) -> dict[str, float]:
    """Optuna's parameter importances over the complete trials (PED-ANOVA, named: the
    default of Optuna 5, not of the Optuna 4 that pyproject also allows), normalised to sum
    to 1; empty when too few trials."""
    import optuna

    complete = [t for t in study.get_trials(deepcopy=False) if _state(t) == "complete"]
    if len(complete) < 3:
        return {}
    try:
        with warnings.catch_warnings():
            # one warning per conditional parameter whose branch ran in under 2 trials (any
            # short study with a `when:` has some): the plot is read as rough anyway, and the
            # study's output stays quiet
            warnings.filterwarnings("ignore", message="Some regimes for parameter")
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            evaluator = optuna.importance.PedAnovaImportanceEvaluator()
            return dict(optuna.importance.get_param_importances(study, evaluator=evaluator))
    except (ValueError, RuntimeError):  # e.g. a single value in every parameter
        return {}


def best_trial(study: Any) -> tuple[Any, float] | None:
    """The trial with the best validation MRR, and that MRR: among the complete trials and
    those the trial time limit stopped (slow, not judged worse by the pruner: their committed
    checkpoints hold the model they validated). The earliest wins a tie."""
    best: tuple[Any, float] | None = None
    for t in study.get_trials(deepcopy=False):
        value = _candidate_value(t)
        if value is not None and (best is None or value > best[1]):
            best = (t, value)
    return best


def _candidate_value(t: Any) -> float | None:
    """Trial ``t``'s valid MRR if it may win the study (:func:`best_trial`), else None."""
    from optuna.trial import TrialState

    if t.state == TrialState.COMPLETE:
        value = t.value
    elif t.state == TrialState.PRUNED and t.user_attrs.get("timed_out"):
        value = t.user_attrs.get("best_valid_mrr") if t.user_attrs.get("run") else None
    else:
        value = None
    return None if value is None else float(value)


def best_config(folder: StudyFolder, best: Any) -> RunConfig:
    """The config of trial ``best`` (:func:`best_trial`'s) as a run config of its own (named
    after the study, tested)."""
    config = trial_config(folder.base, best.user_attrs.get("values", {}), source="best trial")
    return config.model_copy(
        update={
            "run": config.run.model_copy(update={"name": None}),
            "evaluation": config.evaluation.model_copy(update={"test": True}),
        }
    )


def write_plots(folder: StudyFolder, study: Any) -> dict[str, str]:
    """``best.png`` (best valid MRR so far by trial) and ``importance.png``; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    curve = best_so_far(study)
    rows = trial_rows(study)
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [r["trial"] for r in rows if r["valid_mrr"] is not None]
    ys = [r["valid_mrr"] for r in rows if r["valid_mrr"] is not None]
    colors = [
        "tab:blue" if r["state"] == "complete" else "tab:gray"
        for r in rows
        if r["valid_mrr"] is not None
    ]
    ax.scatter(xs, ys, c=colors, s=14, label="trial (gray: pruned; its best validation)")
    if curve:
        ax.step(
            [c[0] for c in curve],
            [c[1] for c in curve],
            where="post",
            color="tab:red",
            label="best so far",
        )
    ax.set_xlabel("trial")
    ax.set_ylabel("valid MRR")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    ax.set_title(f"{folder.name}")
    fig.tight_layout()
    fig.savefig(folder.file("best.png"), dpi=100)
    plt.close(fig)
    out["best"] = str(folder.file("best.png"))
    imp = importances(study)
    if imp:
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(imp) + 1.2))
        names = list(imp)[::-1]
        # an alternative (`training.lr#1`) by its condition: `training.lr (training.optimizer=adagrad)`
        when = {
            p.name: f"{p.key} ({_condition(p.when)})" for p in folder.space.params if "#" in p.name
        }
        labels = [when.get(n, n) for n in names]
        ax.barh(labels, [imp[n] for n in names], color="tab:blue")
        ax.set_xlabel("importance (Optuna's PED-ANOVA, normalised to sum to 1)")
        fig.tight_layout()
        fig.savefig(folder.file("importance.png"), dpi=100)
        plt.close(fig)
        out["importance"] = str(folder.file("importance.png"))
    return out


def _condition(when: Any) -> str:
    return ", ".join(k + "=" + "|".join(str(v) for v in values) for k, values in when)


def _csv(rows: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def summarize(
    folder: StudyFolder,
    study: Any,
    *,
    seconds: float,
    test: bool = True,
    log: Log | None = None,
    warn: Log | None = None,
    lease: bool = True,
) -> dict[str, Any]:
    """Write ``trials.csv``, ``best.yaml``, the plots, and ``results.json`` (with the best
    trial's test metrics when ``test``: only the winner is ever tested); returns the latter.
    Holds the study's lease while it does (``lease=False``: the caller holds it), so that a
    concurrent search of the study cannot trim the winner under its test; a study another
    search holds is refused (:class:`~kgpipe.errors.RunError` naming that search)."""
    if not lease:
        return _summarize(folder, study, seconds=seconds, test=test, log=log, warn=warn)
    with folder.lease():
        return _summarize(folder, study, seconds=seconds, test=test, log=log, warn=warn)


def _summarize(
    folder: StudyFolder,
    study: Any,
    *,
    seconds: float,
    test: bool,
    log: Log | None,
    warn: Log | None,
) -> dict[str, Any]:
    from kgpipe.runs.read import evaluate_run

    say = log or (lambda _m: None)
    rows = trial_rows(study)
    folder.write_text("trials.csv", _csv(rows))
    states = [r["state"] for r in rows]
    results: dict[str, Any] = {
        "study": folder.name,
        "storage": redact_url(folder.storage),
        "selection": "best valid MRR (filtered, both sides) over each trial's validations, "
        "among the complete trials and those the trial time limit stopped; test metrics are of "
        "the best trial only, computed after the search",
        "trials": {s: states.count(s) for s in sorted(set(states))},
        "trial_epochs": sum(int(r["epochs"] or 0) for r in rows),
        "trial_seconds": round(sum(float(r["seconds"] or 0) for r in rows), 1),
        "seconds": round(seconds, 1),
        "settings": {
            **folder.settings.model_dump(mode="json"),
            "storage": folder.settings.storage and redact_url(folder.settings.storage),
        },
    }
    found = best_trial(study)
    if found is not None:
        best, value = found
        config = best_config(folder, best)
        # where the trial trained, in this folder (it may have moved since: not the URL stored)
        run = str(folder.trial_path(best.number).resolve()) if best.user_attrs.get("run") else None
        folder.write_text(
            "best.yaml",
            f"# best trial {best.number} of study {folder.name}: "
            f"valid MRR {value:.4f}\n" + config_to_yaml(config),
        )
        results["best"] = {
            "trial": best.number,
            "valid_mrr": value,
            "state": _state(best),
            "epoch": best.user_attrs.get("best_epoch"),
            "values": best.user_attrs.get("values", {}),
            "run": run,
            "config": str(folder.file("best.yaml")),
        }
        if test and run:
            say(f"testing the best trial ({best.number}) on test")
            t0 = time.perf_counter()
            try:
                metrics = evaluate_run(run, split="test", checkpoint="best")
            except KgpipeError as err:  # the findings are written all the same
                (warn or say)(f"the best trial could not be tested: {err}")
                results["best"]["test_error"] = str(err)
            else:
                metrics["seconds"] = time.perf_counter() - t0
                results["best"]["test"] = metrics
    results["plots"] = write_plots(folder, study)
    folder.write_json("results.json", results)
    track_findings(folder, study, results, warn or say)
    return results
