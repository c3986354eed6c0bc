"""MLflow runs of a hyperparameter search, logged from its driver: a parent run per study, and
each trial -- a whole kgpipe run -- logged after the fact from its epoch history, nested under
the parent (``mlflow.parentRunId``). Trials never talk to MLflow themselves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kgpipe.config import RunConfig, TrackingConfig
from kgpipe.runs.folder import run_store
from kgpipe.tracking.client import (
    Mlflow,
    TrackingError,
    connect,
    experiment_name,
    flat_params,
    text_params,
)
from kgpipe.tracking.run import experiment_of, run_tags

__all__ = [
    "log_finished_run",
    "log_parent_result",
    "log_refused_trial",
    "log_run_artifacts",
    "log_run_metrics",
    "start_parent_run",
]


def _continued(mlf: Mlflow, run_id: str | None) -> Any | None:
    """The run ``run_id`` when given and alive (to continue), else None (to create)."""
    return mlf.live_run(run_id) if run_id else None


def start_parent_run(
    tracking: TrackingConfig,
    *,
    name: str,
    params: dict[str, Any],
    run_id: str | None = None,
) -> str:
    """Create the MLflow run of a study named ``name`` in ``tracking``'s experiment
    (``tracking.experiment``, else ``kgpipe``), with ``params`` (the search's settings) and
    ``tracking.tags``; or continue ``run_id`` when it exists (a resumed study: it is RUNNING
    again, and params it lacks are added). Returns the run id. Raises
    :class:`~kgpipe.tracking.client.TrackingError` (one line) when MLflow fails."""
    mlf = connect(tracking)
    live = _continued(mlf, run_id)
    if live is not None:
        found = str(live.info.run_id)
        mlf.update_run(found, status="RUNNING")
        mlf.log_params(found, text_params(params), dict(live.data.params))
        return found
    experiment = mlf.experiment_id(experiment_name(tracking))
    tags = {**tracking.tags, "kgpipe.kind": "study"}
    created = mlf.create_run(experiment, run_name=name, tags=tags)
    found = str(created.info.run_id)
    mlf.log_params(found, text_params(params), {})
    return found


def log_finished_run(
    tracking: TrackingConfig,
    *,
    name: str,
    parent_run_id: str | None,
    config: RunConfig,
    history: Sequence[dict[str, Any]],
    params: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    status: str = "FINISHED",
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
) -> str:
    """Log a whole finished kgpipe run (a trial) after the fact: the run named ``name``, nested
    under ``parent_run_id`` (in its experiment), with the config's params plus ``params`` (the
    sampled values), every epoch of ``history`` (``step=epoch``), ``metrics`` (final values:
    the objective, test metrics; step = the last epoch) and ``tags``; it ends with ``status``
    (FINISHED, FAILED, KILLED). With ``run_id`` of an existing run, only the epochs, params
    and metrics it does not have yet are added. Returns the run id."""
    mlf = connect(tracking)
    live = _continued(mlf, run_id)
    url = run_store(config).url if config.run.name else str(config.run.root)
    all_tags = run_tags(config, url, tracking=tracking, parent_run_id=parent_run_id, **(tags or {}))
    all_params = flat_params(config, params)
    if live is not None:
        found = str(live.info.run_id)
        after, existing = mlf.last_epoch(found), dict(live.data.params)
        mlf.set_tags(found, all_tags)
    else:
        experiment = experiment_of(mlf, tracking, config, parent_run_id)
        created = mlf.create_run(experiment, run_name=name, tags=all_tags)
        found, after, existing = str(created.info.run_id), 0, {}
    mlf.log_params(found, all_params, existing)
    mlf.log_epochs(found, history, after=after)
    last = max((int(h["epoch"]) for h in history), default=0)
    if metrics:
        mlf.log_metrics(found, metrics, step=last)
    mlf.set_terminated(found, status)
    return found


def log_refused_trial(
    tracking: TrackingConfig,
    *,
    name: str,
    parent_run_id: str,
    params: dict[str, Any],
    error: str,
    tags: dict[str, str],
    run_id: str | None = None,
) -> str:
    """Log a trial whose sampled values the config refused (it never ran): a FAILED run nested
    under ``parent_run_id`` with the sampled ``params`` and the refusal in the tag
    ``kgpipe.error``, so that every trial of a search shows in MLflow. With ``run_id`` of an
    existing run nothing is logged again. Returns the run id."""
    mlf = connect(tracking)
    if run_id and mlf.live_run(run_id) is not None:
        return run_id
    experiment = str(mlf.get_run(parent_run_id).info.experiment_id)
    all_tags = {**tracking.tags, **tags, "mlflow.parentRunId": parent_run_id}
    all_tags["kgpipe.error"] = error[:5000]
    created = mlf.create_run(experiment, run_name=name, tags=all_tags)
    found = str(created.info.run_id)
    mlf.log_params(found, text_params(params), {})
    mlf.set_terminated(found, "FAILED")
    return found


def log_run_artifacts(tracking: TrackingConfig, run_id: str, paths: Sequence[str]) -> None:
    """Upload the local files ``paths`` to the run ``run_id`` (ended or not); a file logged
    again replaces itself."""
    mlf = connect(tracking)
    for path in paths:
        mlf.log_artifact(run_id, str(path))


def log_run_metrics(tracking: TrackingConfig, run_id: str, metrics: dict[str, float]) -> None:
    """Add ``metrics`` to the finished run ``run_id`` at the step of its last epoch (a trial's
    test metrics, once the study has tested it); those it has there already are left out."""
    mlf = connect(tracking)
    mlf.log_metrics(run_id, metrics, step=mlf.last_epoch(run_id))


def log_parent_result(
    tracking: TrackingConfig,
    run_id: str,
    *,
    metrics: dict[str, float],
    artifacts: Sequence[str],
    status: str = "FINISHED",
    step: int = 0,
) -> None:
    """End a study's run ``run_id``: its ``metrics`` (the best value, trial counts) at
    ``step``, ``artifacts`` (local files: the study's report, plots) and ``status``."""
    missing = [str(p) for p in artifacts if not Path(p).is_file()]
    if missing:
        raise TrackingError(f"{missing[0]}: no such file to log to the MLflow run {run_id}")
    mlf = connect(tracking)
    mlf.log_metrics(run_id, metrics, step=step)
    for path in artifacts:
        mlf.log_artifact(run_id, str(path))
    mlf.set_terminated(run_id, status)
