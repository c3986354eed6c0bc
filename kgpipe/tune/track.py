"""A search in MLflow (``tracking.backend: mlflow`` in the base config): a parent run per study,
each trial a nested run logged by the driver when the trial ends (trials never import MLflow),
the findings on the parent at the end. Run ids are kept in the Optuna study, so a resumed
search continues the same parent and a continued trial its own run: nothing is logged twice.
A tracking server failing mid-search is a warning, not the end of the search."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.tune.folder import StudyFolder
from kgpipe.tune.settings import redact_url

__all__ = ["StudyTracker", "track_findings"]

PARENT = "mlflow_run_id"


class StudyTracker:
    """Logs one search's trials to MLflow (``None`` from :meth:`open` when it does not track)."""

    def __init__(
        self, folder: StudyFolder, study: Any, parent: str, warn: Callable[[str], None]
    ) -> None:
        self.folder, self.study, self.parent, self.warn = folder, study, parent, warn

    @classmethod
    def open(
        cls, folder: StudyFolder, study: Any, warn: Callable[[str], None]
    ) -> StudyTracker | None:
        tracking = folder.base.tracking
        if tracking.backend == "none":
            return None
        from kgpipe.tracking import check_tracking, start_parent_run

        check_tracking(tracking)  # unreachable or missing: one line, before any trial
        params = {f"tune.{k}": v for k, v in folder.settings.model_dump(mode="json").items()}
        if params.get("tune.storage"):  # a database URL's password: not for the tracking server
            params["tune.storage"] = redact_url(str(params["tune.storage"]))
        params["tune.space"] = "; ".join(folder.space.describe())
        parent = start_parent_run(
            tracking, name=folder.name, params=params, run_id=study.user_attrs.get(PARENT)
        )
        study.set_user_attr(PARENT, parent)
        return cls(folder, study, parent, warn)

    def end(self, status: str, *, wait_s: float | None = None) -> None:
        """Mark the study's run ended without findings (``KILLED``: the search was interrupted;
        ``FAILED``: it stopped on an error), not left RUNNING; a resume sets it running
        again. With ``wait_s`` (an interrupted process on its way out) the call runs in a
        daemon thread waited for that long: a server that stopped answering does not hold
        the exit for MLflow's retries."""
        from kgpipe.tracking import TrackingError, connect, within

        def mark() -> None:
            try:
                connect(self.folder.base.tracking).set_terminated(self.parent, status)
            except TrackingError as err:
                self.warn(f"the study's MLflow run was not marked {status}: {err}")

        if wait_s is None:
            mark()
            return
        if not within(mark, wait_s):
            self.warn(f"the study's MLflow run was not marked {status}: no answer in {wait_s:g} s")

    def trial(self, trial: Any, config: dict[str, Any], outcome: Any) -> None:
        """Log a finished trial (its epochs, values, best valid MRR; its config and its curve
        as artifacts) under the study's run."""
        with tempfile.TemporaryDirectory(prefix="kgpipe-trial-") as tmp:
            try:
                files = _trial_files(Path(tmp), config, outcome.history)
            except Exception as err:  # the artifacts are extras: the trial is logged anyway
                self.warn(f"trial {trial.number}: no artifacts for MLflow: {err}")
                files = []
            self._trial(trial, config, outcome, files)

    def refused(self, trial: Any, values: dict[str, Any], error: str) -> None:
        """Log a trial whose sampled config was refused: a FAILED run with its values and the
        refusal (it never trained, so no epochs and no artifacts)."""
        from kgpipe.tracking import TrackingError, log_refused_trial

        try:
            run_id = log_refused_trial(
                self.folder.base.tracking,
                name=f"{self.folder.name}/trial-{trial.number:04d}",
                parent_run_id=self.parent,
                params=dict(values),
                error=error,
                tags={
                    "kgpipe.trial": str(trial.number),
                    "kgpipe.trial_state": "fail",
                    "kgpipe.model": self.folder.base.model.name,
                },
                run_id=trial.user_attrs.get(PARENT),
            )
            trial.set_user_attr(PARENT, run_id)
        except TrackingError as err:
            self.warn(f"trial {trial.number} not logged to MLflow: {err}")

    def _trial(self, trial: Any, config: dict[str, Any], outcome: Any, files: list[str]) -> None:
        from kgpipe.tracking import TrackingError, log_finished_run, log_run_artifacts

        status = {"complete": "FINISHED", "pruned": "KILLED"}.get(outcome.state, "FAILED")
        try:
            run_id = log_finished_run(
                self.folder.base.tracking,
                name=f"{self.folder.name}/trial-{trial.number:04d}",
                parent_run_id=self.parent,
                config=RunConfig.model_validate(config),
                history=outcome.history,
                params=dict(trial.user_attrs.get("values", {})),
                metrics={"best_valid_mrr": outcome.value} if outcome.value is not None else None,
                status=status,
                tags={"kgpipe.trial": str(trial.number), "kgpipe.trial_state": outcome.state},
                run_id=trial.user_attrs.get(PARENT),
            )
            trial.set_user_attr(PARENT, run_id)
        except TrackingError as err:
            self.warn(f"trial {trial.number} not logged to MLflow: {err}")
            return
        try:  # after the run is ended and its id kept: a failing artifact store costs only these
            log_run_artifacts(self.folder.base.tracking, run_id, files)
        except TrackingError as err:
            self.warn(f"trial {trial.number}: its artifacts were not logged to MLflow: {err}")


def track_findings(
    folder: StudyFolder, study: Any, results: dict[str, Any], warn: Callable[[str], None]
) -> None:
    """The study's findings on its parent run: best valid/test MRR, counts, files."""
    parent = study.user_attrs.get(PARENT)
    if folder.base.tracking.backend == "none" or not parent:
        return
    from kgpipe.tracking import TrackingError, log_parent_result, log_run_metrics

    metrics: dict[str, float] = {f"trials_{k}": float(v) for k, v in results["trials"].items()}
    metrics["trial_epochs"] = float(results["trial_epochs"])
    best = results.get("best") or {}
    if best.get("valid_mrr") is not None:
        metrics["best_valid_mrr"] = float(best["valid_mrr"])
    test = {
        k: float(v)
        for k, v in (best.get("test") or {}).items()
        if isinstance(v, int | float) and k in ("mrr", "mr", "hits@1", "hits@3", "hits@10")
    }
    metrics |= {f"best_test_{k}": v for k, v in test.items()}
    if best.get("trial") is not None:  # which trial the latest best_* are of
        metrics["best_trial"] = float(best["trial"])
    winner = _trial_run(study, best.get("trial"))
    if test and winner:  # the winner's own run gets its test metrics too, as a tested run has
        try:
            log_run_metrics(folder.base.tracking, winner, {f"test_{k}": v for k, v in test.items()})
        except TrackingError as err:
            warn(f"the best trial's test metrics were not logged to MLflow: {err}")
    names = ["results.json", "trials.csv", "best.yaml", "best.png", "importance.png"]
    files = [str(folder.file(n)) for n in names if folder.file(n).exists()]
    # at the step of the trials finished so far: a resumed study that ran more trials logs its
    # new findings after the old ones (MLflow shows the latest step), one summarized again
    # logs nothing twice
    step = sum(int(results["trials"].get(k, 0)) for k in ("complete", "pruned", "fail"))
    try:
        log_parent_result(folder.base.tracking, parent, metrics=metrics, artifacts=files, step=step)
    except TrackingError as err:
        warn(f"the study's findings were not logged to MLflow: {err}")


def _trial_run(study: Any, number: Any) -> str | None:
    """The MLflow run id of trial ``number`` of ``study`` (None: none, or not logged)."""
    if number is None:
        return None
    trials = [t for t in study.get_trials(deepcopy=False) if t.number == int(number)]
    return trials[0].user_attrs.get(PARENT) if trials else None


def _trial_files(tmp: Path, config: dict[str, Any], history: list[dict[str, Any]]) -> list[str]:
    """A trial's artifacts, written under ``tmp``: its resolved config (``config.yaml``) and,
    when it trained an epoch, its loss and validation curve (``curves.png``)."""
    from kgpipe.config.io import config_to_yaml
    from kgpipe.runs.folder import CURVES
    from kgpipe.runs.report import curve_png

    (tmp / "config.yaml").write_text(config_to_yaml(RunConfig.model_validate(config)))
    files = [str(tmp / "config.yaml")]
    if history:
        (tmp / CURVES).write_bytes(curve_png(history))
        files.append(str(tmp / CURVES))
    return files
