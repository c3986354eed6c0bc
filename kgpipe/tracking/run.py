"""The MLflow run of a kgpipe run: created when the run starts, *continued* when it resumes,
fed every epoch once, finished with the test metrics and the report.

Its id is kept in the run folder (``tracking.json``, next to ``config.yaml``), so a resumed run
-- after a crash, or extended to more epochs -- goes on logging to the same MLflow run. Epochs
trained again (a gang relaunched from its last commit, a resume from an earlier checkpoint)
are not logged again: the last epoch logged is kept in ``tracking.json`` and read back from
MLflow's metric history. Once a run has started, MLflow faults are warnings, never a reason to
stop training: epochs that did not reach MLflow are logged when it answers again.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kgpipe.config import RunConfig, TrackingConfig, config_hash, config_to_yaml
from kgpipe.runs.folder import CURVES, REPORT, RESULTS, RunFolder
from kgpipe.runs.report import curve_png, markdown_report
from kgpipe.runs.segments import committed_history
from kgpipe.tracking.client import (
    Mlflow,
    TrackingError,
    connect,
    experiment_name,
    flat_params,
    shown_uri,
    within,
)
from kgpipe.training.hooks import Callback, TrainerView
from kgpipe.training.records import EpochStats

__all__ = ["TRACKING", "RunTracker", "check_tracking", "run_tags", "track_run"]

Log = Callable[[str], None]

#: the run folder's record of its MLflow run: uri, experiment and run id, last epoch logged
TRACKING = "tracking.json"
#: metrics of ``results.json`` logged at the end, as ``test_<name>``
TEST_METRICS = ("mrr", "mr", "hits@1", "hits@3", "hits@10")


def check_tracking(tracking: TrackingConfig) -> None:
    """Fail fast (one line) when ``tracking`` logs to MLflow and cannot: the mlflow package is
    missing, or the tracking server does not answer. Nothing to check for backend ``none``."""
    if tracking.backend != "none":
        connect(tracking)


def run_tags(
    config: RunConfig,
    url: str,
    *,
    tracking: TrackingConfig | None = None,
    parent_run_id: str | None = None,
    **more: str,
) -> dict[str, str]:
    """The tags of a kgpipe run's MLflow run: where it lives, its config hash, the tags of
    ``tracking`` (default: the config's), ``more``; ``mlflow.parentRunId`` nests it under
    ``parent_run_id``."""
    tags = {
        "kgpipe.run": url,
        "kgpipe.config_hash": config_hash(config),
        "kgpipe.model": config.model.name,
        **(tracking or config.tracking).tags,
        **more,
    }
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


def experiment_of(
    mlf: Mlflow, tracking: TrackingConfig, config: RunConfig | None, parent_run_id: str | None
) -> str:
    """The experiment id a run goes to: its parent's (nested runs live with their parent),
    else :func:`~kgpipe.tracking.client.experiment_name`'s."""
    if parent_run_id:
        return str(mlf.get_run(parent_run_id).info.experiment_id)
    return mlf.experiment_id(experiment_name(tracking, config))


def _run_link(uri: str, experiment_id: str, run_id: str) -> str:
    if urlsplit(uri).scheme in ("http", "https"):
        return f"{shown_uri(uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"{run_id} at {shown_uri(uri)}"


class RunTracker(Callback):
    """Mirrors one kgpipe run into one MLflow run, from the process that drives training (in
    one process, or the driver of a Dask gang; never a rank).

    :meth:`start` (after the run folder is prepared) creates or continues the MLflow run and
    logs the params; the callback logs each epoch once (``step=epoch``); :meth:`finish` logs
    the test metrics, the report and the curve, and ends the run. :func:`track_run` does it
    all around a block of code."""

    def __init__(
        self,
        run: RunFolder,
        *,
        parent_run_id: str | None = None,
        log: Log | None = None,
        warn: Log | None = None,
        retry_after_s: float = 60.0,
    ) -> None:
        self.run = run
        self.tracking = run.config.tracking
        self.parent_run_id = parent_run_id
        self.say: Log = log or (lambda _msg: None)
        self.warn: Log = warn or (lambda msg: self.say(f"WARNING: {msg}"))
        self.retry_after_s = retry_after_s
        self.mlflow: Mlflow | None = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.last_epoch = 0  # the last epoch MLflow has
        self.continued = False  # an MLflow run of an earlier start of this run folder
        self.ended = False
        self._retry_at = 0.0
        self._failed = 0  # calls failed in a row: each waits twice as long for the next try
        self._verify = False  # after a failed log, ask MLflow what it has before logging again

    # -- start ---------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        store = self.run.store
        try:
            state = store.read_json(TRACKING) if store.exists(TRACKING) else {}
        except (ValueError, OSError):  # a torn record: start a new MLflow run
            return {}
        return state if isinstance(state, dict) else {}

    def _save(self) -> None:
        record = {
            "backend": self.tracking.backend,
            "uri": shown_uri(self.tracking.uri or ""),  # (the password is not the folder's)
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
            "last_epoch": self.last_epoch,
            "status": "ended" if self.ended else "running",
        }
        try:
            self.run.store.write_json(TRACKING, record)
        except Exception as err:  # the MLflow history says the same; training goes on
            self.warn(f"{TRACKING} not written: {err}")

    def start(self) -> str:
        """Create the MLflow run, or continue the one in the run folder's ``tracking.json``
        (same tracking URI, run not deleted); log the params and the epochs already committed
        that MLflow does not have. Returns the MLflow run id. Raises
        :class:`~kgpipe.tracking.client.TrackingError` (one line) when MLflow fails."""
        mlf = self.mlflow = connect(self.tracking)
        config, state = self.run.config, self._state()
        live = None
        if state.get("run_id") and state.get("uri") in (
            self.tracking.uri,  # (recorded with its password before it was masked)
            shown_uri(self.tracking.uri or ""),
        ):
            live = mlf.live_run(str(state["run_id"]))
        tags = run_tags(config, self.run.url, parent_run_id=self.parent_run_id)
        if live is not None:
            self.run_id, self.experiment_id = live.info.run_id, live.info.experiment_id
            self.continued = True
            mlf.update_run(self.run_id, status="RUNNING")
            self.last_epoch = max(int(state.get("last_epoch") or 0), mlf.last_epoch(self.run_id))
            existing = dict(live.data.params)
            mlf.set_tags(self.run_id, tags)
        else:
            self.experiment_id = experiment_of(mlf, self.tracking, config, self.parent_run_id)
            created = mlf.create_run(self.experiment_id, run_name=config.run.name, tags=tags)
            self.run_id, existing = str(created.info.run_id), {}
        mlf.log_params(self.run_id, flat_params(config), existing)
        self._save()
        # committed epochs MLflow lacks: tracking turned on at a resume, or a driver that
        # died between a commit and its log
        self.last_epoch = mlf.log_epochs(
            self.run_id, committed_history(self.run), after=self.last_epoch
        )
        self._save()
        where = _run_link(self.tracking.uri or "", str(self.experiment_id), self.run_id)
        if self.continued:
            self.say(f"continuing the MLflow run {where} (epochs logged: {self.last_epoch})")
        else:
            self.say(f"tracking in MLflow: {where}")
        return self.run_id

    # -- epochs ----------------------------------------------------------------------------------

    def _log_epochs(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if self.mlflow is None or self.run_id is None or self.ended:
            return
        if time.monotonic() < self._retry_at:
            return
        try:
            if self._verify:  # a failed batch may have been stored all the same
                self.last_epoch = max(self.last_epoch, self.mlflow.last_epoch(self.run_id))
                self._verify = False
            self.last_epoch = self.mlflow.log_epochs(self.run_id, rows, after=self.last_epoch)
            self._failed = 0
        except TrackingError as err:
            # a server that stopped answering costs a timeout and retries per try (~48 s), in
            # the training loop: tries get rarer while it stays silent (60 s, 120 s, ... 1 h)
            wait = min(self.retry_after_s * 2**self._failed, 3600.0)
            self._failed += 1
            self._verify = True
            self._retry_at = time.monotonic() + wait
            self.warn(
                f"{err}; training goes on, and the epochs are logged when MLflow answers again "
                f"(next try in {wait:g} s)"
            )

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        rows = [h.as_dict() for h in trainer.history if h.epoch > self.last_epoch]
        self._log_epochs([*rows, stats.as_dict()])

    def on_train_end(self, trainer: TrainerView) -> None:
        if self.run_id is not None and not self.ended:
            self._save()  # once a segment: the last epoch logged

    # -- the end -------------------------------------------------------------------------------

    def finish(
        self,
        results: dict[str, Any] | None,
        history: Sequence[Mapping[str, Any]],
        *,
        seconds: float | None = None,
        from_folder: bool = False,
        status: str = "FINISHED",
    ) -> None:
        """Log the epochs MLflow still lacks, the test metrics (``test_mrr``, ...; step = the
        last epoch), the report and the curve, the config and the results; end the run with
        ``status``. The report and curve are the run folder's with ``from_folder`` (the flow
        has just written them), else made here. MLflow faults are warnings."""
        if self.mlflow is None or self.run_id is None or self.ended:
            return
        self._retry_at = 0.0
        self._log_epochs(history)
        if self._failed:  # it did not answer just now: not three more timeouts at the end
            self.warn(f"the MLflow run {self.run_id} was left as it is; the run's results are "
                      f"in {self.run.url}")  # fmt: skip
            self.ended = True
            self._save()
            return
        last = max((int(h["epoch"]) for h in history), default=0)
        try:
            self.mlflow.log_metrics(self.run_id, final_metrics(results), step=last)
            self._artifacts(results, history, seconds=seconds, from_folder=from_folder)
        except TrackingError as err:
            self.warn(f"{err}; the run's results are in {self.run.url}")
        except OSError as err:
            self.warn(f"the report was not logged to MLflow: {err}")
        self.end(status)

    def end(self, status: str = "FINISHED", *, wait_s: float | None = None) -> None:
        """End the MLflow run with ``status`` (FINISHED, FAILED, KILLED); once. With ``wait_s``
        (a process on its way out) waits at most that long for the server (:func:`within`)."""
        mlflow, run_id = self.mlflow, self.run_id
        if mlflow is None or run_id is None or self.ended:
            return

        def mark() -> None:
            try:
                mlflow.set_terminated(run_id, status)
            except TrackingError as err:
                self.warn(f"{err}; the MLflow run {run_id} was not marked {status}")

        if wait_s is None:
            mark()
        elif not within(mark, wait_s):
            self.warn(f"the MLflow run {run_id} was not marked {status}: no answer in {wait_s:g} s")
        self.ended = True
        self._save()

    def _artifacts(
        self,
        results: dict[str, Any] | None,
        history: Sequence[Mapping[str, Any]],
        *,
        seconds: float | None,
        from_folder: bool,
    ) -> None:
        assert self.mlflow is not None and self.run_id is not None
        store = self.run.store
        with tempfile.TemporaryDirectory(prefix="kgpipe-tracking-") as tmp:
            files: dict[str, bytes] = {"config.yaml": config_to_yaml(self.run.config).encode()}
            if results is not None:
                files[RESULTS] = json.dumps(results, indent=2).encode()
            if from_folder:
                files.update({n: store.read_bytes(n) for n in (REPORT, CURVES) if store.exists(n)})
            elif history:
                rows = [dict(h) for h in history]
                took = seconds if seconds is not None else sum(float(h["seconds"]) for h in rows)
                files[CURVES] = curve_png(rows)
                report = markdown_report(self.run, results, rows, seconds=took, curve=CURVES)
                files[REPORT] = report.encode()
            for name, data in files.items():
                path = Path(tmp) / name
                path.write_bytes(data)
                self.mlflow.log_artifact(self.run_id, str(path))


def final_metrics(results: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``results.json`` adds to the MLflow run: ``test_mrr``, ``test_hits@10``, ... and
    the training's seconds and final model epoch."""
    if not results:
        return {}
    split = str(results.get("split", "test"))
    out: dict[str, Any] = {f"{split}_{k}": results[k] for k in TEST_METRICS if k in results}
    training = results.get("training") or {}
    for key in ("train_seconds", "wall_seconds", "model_epoch"):
        if training.get(key) is not None:
            out[key] = training[key]
    return out


@contextlib.contextmanager
def track_run(
    run: RunFolder,
    *,
    parent_run_id: str | None = None,
    log: Log | None = None,
    warn: Log | None = None,
) -> Iterator[RunTracker | None]:
    """The :class:`RunTracker` of ``run``, started (``None`` under ``tracking.backend: none``);
    the MLflow run ends FAILED (KILLED on Ctrl-C) if the block raises, else FINISHED unless
    :meth:`RunTracker.finish` ended it already."""
    if run.config.tracking.backend == "none":
        yield None
        return
    tracker = RunTracker(run, parent_run_id=parent_run_id, log=log, warn=warn)
    tracker.start()
    try:
        yield tracker
    except Exception:
        tracker.end("FAILED")
        raise
    except BaseException:  # Ctrl-C, SIGTERM (SystemExit): on its way out, waits at most 5 s
        tracker.end("KILLED", wait_s=5.0)
        raise
    tracker.end("FINISHED")
