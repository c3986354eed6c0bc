"""Experiment tracking: a kgpipe run mirrored into an MLflow run (``tracking.backend: mlflow``).

MLflow is imported only when a config tracks to it, and only by the process that drives
training. :class:`RunTracker` follows one run (created at its start, continued when it
resumes, every epoch logged once); :mod:`.search` logs a hyperparameter search (a parent run
per study, trials nested under it) from its driver.
"""

from kgpipe.tracking.client import MLFLOW_MISSING, TrackingError, connect, metric_key, within
from kgpipe.tracking.run import TRACKING, RunTracker, check_tracking, final_metrics, track_run
from kgpipe.tracking.search import (
    log_finished_run,
    log_parent_result,
    log_refused_trial,
    log_run_artifacts,
    log_run_metrics,
    start_parent_run,
)

__all__ = [
    "MLFLOW_MISSING",
    "TRACKING",
    "RunTracker",
    "TrackingError",
    "check_tracking",
    "connect",
    "final_metrics",
    "log_finished_run",
    "log_parent_result",
    "log_refused_trial",
    "log_run_artifacts",
    "log_run_metrics",
    "metric_key",
    "start_parent_run",
    "track_run",
    "within",
]
