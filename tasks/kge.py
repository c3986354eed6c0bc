"""Thin Prefect tasks over the kgpipe library: each calls one library step and returns something
small (a run-folder record, a segment summary, metrics) -- never tensors.

Policies live in the decorators: retries with backoff on transient storage/network errors,
timeouts, and no caching (every task here has side effects in the run folder).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.events import emit_event

from kgpipe.config import RunConfig
from kgpipe.errors import StorageAccessDenied, StorageError, StorageFull, StorageUnreachable
from kgpipe.launch.dask import connect
from kgpipe.pipeline import make_launcher
from kgpipe.runs.finish import finish_run
from kgpipe.runs.folder import CURVES, REPORT, RunFolder
from kgpipe.runs.report import curve_png, markdown_report, metrics_table
from kgpipe.runs.segments import SegmentResult, committed_history
from kgpipe.runs.stage import prepare_run
from kgpipe.storage import is_transient
from kgpipe.tracking import RunTracker
from kgpipe.training.hooks import Callback, TrainerView
from kgpipe.training.records import EpochStats

__all__: Sequence[str] = [
    "STORAGE_RETRY",
    "evaluate_and_export",
    "new_metrics_table",
    "new_progress",
    "publish_report",
    "stage_data",
    "test_on_gang",
    "track_results",
    "train_segment",
    "transient",
]


def transient(_task: Any, _run: Any, state: Any) -> bool:
    """Retry condition: only object-store and network faults are worth another attempt."""
    try:
        state.result()
    except (StorageAccessDenied, StorageFull, StorageUnreachable):
        return False  # refused, full, or not answering at start-up: fail fast, one line
    except StorageError:  # still unreachable after the storage layer's own retries
        return True
    except Exception as err:
        return is_transient(err)
    return False


# Tasks that read or write storage: retried on transient faults only, with backoff.
STORAGE_RETRY: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "retries": 3,
    "retry_delay_seconds": [2, 10, 30],
    "retry_condition_fn": transient,
}


@task(timeout_seconds=3600, **STORAGE_RETRY)
def stage_data(
    config: RunConfig,
    resume: bool = True,
    warm_start: str | None = None,
    overwrite: bool = False,
) -> RunFolder:
    """Validate the input, write vocabulary and shards; or reuse a run folder's staged data."""
    logger = get_run_logger()
    return prepare_run(
        config,
        resume=resume,
        overwrite=overwrite,
        warm_start=warm_start,
        log=logger.info,
        warn=logger.warning,  # e.g. no validation data: a WARNING in the UI and on the console
    )


class _PrefectProgress(Callback):
    """Per-epoch progress artifact updates and logs through the run logger."""

    def __init__(self, progress_id: Any, total_epochs: int) -> None:
        self.progress_id = progress_id
        self.total = total_epochs
        self.logger = get_run_logger()

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        if self.progress_id is not None:
            update_progress_artifact(self.progress_id, 100.0 * stats.epoch / self.total)
        extra = f", valid MRR {stats.extra['valid_mrr']:.4f}" if "valid_mrr" in stats.extra else ""
        self.logger.info(
            "epoch %d/%d: loss %.4f, %.0f triples/s%s",
            stats.epoch, self.total, stats.loss, stats.triples_per_s, extra,
            extra={"kgpipe_echo": False},  # the CLI shows epochs with its own display
        )  # fmt: skip


@task(cache_policy=NO_CACHE, timeout_seconds=24 * 3600)
def train_segment(
    run: RunFolder,
    until: int,
    address: str | None,
    restarts: int = 0,
    progress_id: Any = None,
    callbacks: Sequence[Callback] = (),
    metrics_id: Any = None,
    after: SegmentResult | None = None,
) -> SegmentResult:
    """Train from the latest committed checkpoint to epoch ``until`` (a gang on the cluster at
    ``address``, relaunched from checkpoints after faults; else in this process); the
    segment's last epoch is committed. ``callbacks`` are the caller's (the CLI's progress).
    The run's metrics table (``metrics_id``, from :func:`new_metrics_table`; a new one
    without) then shows every epoch so far. What trains and where is logged by the flow's first
    segment; one that goes on ``after`` another logs only what changed (a gang's restart)."""
    logger = get_run_logger()
    ours: list[Callback] = [_PrefectProgress(progress_id, run.config.training.epochs)]
    before = {c.epoch for c in run.checkpoints().committed()}
    if address is None:
        launcher = make_launcher(run, callbacks=[*ours, *callbacks], log=logger.info, after=after)
        try:
            result = launcher.train_until(until)
        finally:
            launcher.close()
    else:
        with connect(address) as client:
            launcher = make_launcher(
                run,
                client=client,
                callbacks=[*ours, *callbacks],
                log=logger.info,
                restarts=restarts,
                after=after,
            )
            result = launcher.train_until(until)
    if result.restarts > restarts:
        logger.warning("%d gang restart(s) in this segment", result.restarts - restarts)
    for ckpt in run.checkpoints().committed():
        if ckpt.epoch not in before:
            emit_event(
                event="kgpipe.checkpoint.committed",
                resource={"prefect.resource.id": f"kgpipe.run.{run.config.run.name}"},
                payload={"epoch": ckpt.epoch, "checkpoint": ckpt.url, "valid_mrr": ckpt.valid_mrr},
            )
    try:  # the table is for reading: a failed update must not fail the trained segment
        if metrics_id is None:
            new_metrics_table(run, result.history)
        else:
            update_metrics_table(metrics_id, result.history)
    except Exception as err:
        logger.warning("metrics table not updated: %s", err)
    return result


@task(cache_policy=NO_CACHE, timeout_seconds=6 * 3600)
def test_on_gang(run: RunFolder, address: str) -> dict[str, Any] | None:
    """A sharded run's test split ranked by a gang on the cluster at ``address``, each rank
    against its own entity shards; None where :func:`evaluate_and_export` ranks it."""
    logger = get_run_logger()
    with connect(address) as client:
        return make_launcher(run, client=client, log=logger.info).test_split()


@task(timeout_seconds=6 * 3600, **STORAGE_RETRY)
def evaluate_and_export(
    run: RunFolder,
    history: list[dict[str, Any]],
    restarts: int,
    seconds: float,
    tested: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Final model from the checkpoints, filtered test evaluation (``tested``: the metrics a
    sharded gang ranked), embeddings export."""
    logger = get_run_logger()
    return finish_run(
        run, history=history, restarts=restarts, seconds=seconds, log=logger.info, tested=tested
    )


@task(timeout_seconds=600, **STORAGE_RETRY)
def publish_report(
    run: RunFolder,
    results: dict[str, Any] | None,
    history: list[dict[str, Any]],
    *,
    seconds: float,
    previous: dict[str, Any] | None = None,
    dashboard: str | None = None,
) -> str:
    """The end-of-run markdown report and its loss/MRR curve: ``report.md`` beside
    ``curves.png`` in the run folder (linked), and a markdown artifact with the curve inlined
    (the Prefect UI cannot reach the run folder)."""
    png = curve_png(history)
    run.store.write_bytes(CURVES, png)

    def report(**curve: Any) -> str:
        return markdown_report(
            run, results, history, seconds=seconds, previous=previous, dashboard=dashboard, **curve
        )

    run.store.write_text(REPORT, report(curve=CURVES))
    create_markdown_artifact(
        key=_key(run, "report"),
        markdown=report(png=png),
        description=f"kgpipe report: {run.config.run.name}",
    )
    return run.store.url_of(REPORT)


@task(cache_policy=NO_CACHE, timeout_seconds=600)
def track_results(
    tracker: RunTracker,
    results: dict[str, Any] | None,
    history: list[dict[str, Any]],
    *,
    seconds: float,
) -> None:
    """The run's MLflow run gets the test metrics, the report and the curve (the run folder's,
    just published) and ends FINISHED; MLflow faults are warnings (the run folder has it all)."""
    tracker.finish(results, history, seconds=seconds, from_folder=True)


def new_progress(run: RunFolder) -> Any:
    return create_progress_artifact(
        progress=100.0 * run.resumed_epoch / max(1, run.config.training.epochs),
        key=_key(run, "progress"),
        description=f"Training progress of {run.config.run.name} (epochs)",
    )


def new_metrics_table(run: RunFolder, history: Sequence[dict[str, Any]] | None = None) -> Any:
    """The run's per-epoch metrics table (one per flow run; its segments update it): the
    committed epochs so far (a resumed run's), or ``history``. Returns the artifact's id."""
    rows = metrics_table(committed_history(run) if history is None else history)
    return create_table_artifact(
        key=_key(run, "metrics"),
        table=rows,
        description=f"Per-epoch metrics of {run.config.run.name}",
    )


def update_metrics_table(artifact_id: Any, history: Sequence[dict[str, Any]]) -> None:
    """Replace the rows of the metrics table ``artifact_id`` (the artifact keeps its id and
    key: the UI shows one table that grows, not one table per segment)."""
    data = json.dumps(metrics_table(history))  # what create_table_artifact stores
    with get_client(sync_client=True) as client:
        client.update_artifact(artifact_id=artifact_id, artifact=ArtifactUpdate(data=data))


def _key(run: RunFolder, what: str) -> str:
    """Artifact keys: lowercase letters, digits and dashes only."""
    name = "".join(c if c.isalnum() else "-" for c in (run.config.run.name or "run").lower())
    return f"kgpipe-{name}-{what}"[:120].strip("-")
