"""Thin Prefect tasks over the kgpipe library: each calls one library step and returns something
small (a staged-run record, a scheduler address, a segment summary, metrics) -- never tensors.

Policies live in the decorators: retries with backoff on transient storage/network errors,
timeouts, and no caching (every task here has side effects in the run folder).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from kgpipe.config import RunConfig
from kgpipe.errors import StorageAccessDenied, StorageError
from kgpipe.run import (
    SegmentResult,
    Session,
    StagedRun,
    finish_run,
    prepare_run,
)
from kgpipe.storage import is_transient
from kgpipe.training import Callback, EpochStats, Trainer

# Extra library callbacks for in-process runs of the flow (the CLI's progress bar).
EXTRA_CALLBACKS: list[Callback] = []

_CLUSTERS: dict[str, Any] = {}  # address -> (context manager, client) of clusters started here
_LOCK = threading.Lock()


def transient(_task: Any, _run: Any, state: Any) -> bool:
    """Retry condition: only object-store and network faults are worth another attempt."""
    try:
        state.result()
    except StorageAccessDenied:
        return False
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
def stage_data(config: RunConfig, resume: bool = True, warm_start: str | None = None) -> StagedRun:
    """Validate the input, write vocabulary and shards; or reuse a run folder's staged data."""
    logger = get_run_logger()
    return prepare_run(config, resume=resume, warm_start=warm_start, log=logger.info)


@task(cache_policy=NO_CACHE, timeout_seconds=600)
def start_cluster(config: RunConfig) -> dict[str, str] | None:
    """Start (LocalCluster / LocalCUDACluster) or connect to the Dask cluster; returns its
    scheduler ``address`` and ``dashboard`` link, or ``None`` when training runs in-process."""
    if not config.distributed.uses_dask:
        return None
    from prefect.settings import PREFECT_API_URL

    from kgpipe.distributed.cluster import open_cluster

    logger = get_run_logger()
    api = PREFECT_API_URL.value()
    cm = open_cluster(
        config.distributed,
        log=logger.info,
        fault=config.fault_tolerance,
        extra_env={"PREFECT_API_URL": api} if api else None,
    )
    client = cm.__enter__()
    address = str(client.scheduler.address)
    with _LOCK:
        _CLUSTERS[address] = (cm, client)
    logger.info("Dask dashboard: %s", client.dashboard_link)
    return {"address": address, "dashboard": str(client.dashboard_link)}


@task(cache_policy=NO_CACHE, timeout_seconds=600)
def stop_cluster(address: str | None) -> None:
    """Close a cluster that :func:`start_cluster` started in this process."""
    with _LOCK:
        entry = _CLUSTERS.pop(address, None) if address else None
    if entry is not None:
        entry[0].__exit__(None, None, None)


@contextlib.contextmanager
def _client(address: str | None) -> Iterator[Any]:
    """The client of the cluster at ``address``: the one :func:`start_cluster` keeps in this
    process, or a new connection (closed afterwards) when the task runs elsewhere."""
    if address is None:
        yield None
        return
    with _LOCK:
        entry = _CLUSTERS.get(address)
    if entry is not None:
        yield entry[1]
        return
    from distributed import Client

    with Client(address, timeout=30) as client:
        yield client


class _PrefectProgress(Callback):
    """Per-epoch progress artifact updates and logs through the run logger."""

    def __init__(self, progress_id: Any, total_epochs: int) -> None:
        self.progress_id = progress_id
        self.total = total_epochs
        self.logger = get_run_logger()

    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
        if self.progress_id is not None:
            update_progress_artifact(self.progress_id, 100.0 * stats.epoch / self.total)
        extra = f", valid MRR {stats.extra['valid_mrr']:.4f}" if "valid_mrr" in stats.extra else ""
        self.logger.info(
            "epoch %d/%d: loss %.4f, %.0f triples/s%s",
            stats.epoch, self.total, stats.loss, stats.triples_per_s, extra,
        )  # fmt: skip


@task(cache_policy=NO_CACHE, timeout_seconds=24 * 3600)
def train_segment(
    run: StagedRun,
    until: int,
    address: str | None,
    restarts: int = 0,
    progress_id: Any = None,
) -> SegmentResult:
    """Train from the latest committed checkpoint to epoch ``until`` (the gang launch on Dask,
    relaunched from checkpoints after faults); the segment's last epoch is committed."""
    logger = get_run_logger()
    callbacks: list[Callback] = [_PrefectProgress(progress_id, run.config.training.epochs)]
    before = {c.epoch for c in run.checkpoints().committed()}
    with _client(address) as client:
        session = Session(
            run,
            callbacks=[*callbacks, *EXTRA_CALLBACKS],
            client=client,
            log=logger.info,
            restarts=restarts,
        )
        try:
            result = session.train_until(until)
        finally:
            session.close()
    if result.restarts > restarts:
        logger.warning("%d gang restart(s) in this segment", result.restarts - restarts)
    for ckpt in run.checkpoints().committed():
        if ckpt.epoch not in before:
            emit_event(
                event="kgpipe.checkpoint.committed",
                resource={"prefect.resource.id": f"kgpipe.run.{run.config.run.name}"},
                payload={"epoch": ckpt.epoch, "checkpoint": ckpt.url, "valid_mrr": ckpt.valid_mrr},
            )
    create_table_artifact(
        key=_key(run, "metrics"),
        table=[_row(h) for h in result.history],
        description=f"Per-epoch metrics of {run.config.run.name} (after epoch {result.epoch})",
    )
    return result


@task(timeout_seconds=6 * 3600, **STORAGE_RETRY)
def evaluate_and_export(
    run: StagedRun, history: list[dict[str, Any]], restarts: int, seconds: float
) -> dict[str, Any] | None:
    """Final model from the checkpoints, filtered test evaluation, embeddings export."""
    logger = get_run_logger()
    return finish_run(run, history=history, restarts=restarts, seconds=seconds, log=logger.info)


@task(timeout_seconds=600, **STORAGE_RETRY)
def publish_report(
    run: StagedRun,
    results: dict[str, Any] | None,
    history: list[dict[str, Any]],
    *,
    seconds: float,
    previous: dict[str, Any] | None = None,
    dashboard: str | None = None,
) -> str:
    """The end-of-run markdown report (with the loss/MRR curve, also written to the run folder)."""
    from kgpipe.report import curve_png, markdown_report

    png = curve_png(history)
    run.store.write_bytes("curves.png", png)
    text = markdown_report(
        run, results, history, seconds=seconds, previous=previous, png=png, dashboard=dashboard
    )
    run.store.write_text("report.md", text)
    create_markdown_artifact(
        key=_key(run, "report"), markdown=text, description=f"kgpipe report: {run.config.run.name}"
    )
    return run.store.url_of("report.md")


def new_progress(run: StagedRun) -> Any:
    return create_progress_artifact(
        progress=100.0 * run.resumed_epoch / max(1, run.config.training.epochs),
        key=_key(run, "progress"),
        description=f"Training progress of {run.config.run.name} (epochs)",
    )


def _key(run: StagedRun, what: str) -> str:
    """Artifact keys: lowercase letters, digits and dashes only."""
    name = "".join(c if c.isalnum() else "-" for c in (run.config.run.name or "run").lower())
    return f"kgpipe-{name}-{what}"[:120].strip("-")


def _row(h: dict[str, Any]) -> dict[str, Any]:
    keys = ("epoch", "loss", "triples_per_s", "seconds", "valid_mrr", "valid_hits@10",
            "world_size", "bytes_sent", "restarts")  # fmt: skip
    return {k: (round(h[k], 6) if isinstance(h[k], float) else h[k]) for k in keys if k in h}


__all__: Sequence[str] = [
    "EXTRA_CALLBACKS",
    "evaluate_and_export",
    "new_progress",
    "publish_report",
    "stage_data",
    "start_cluster",
    "stop_cluster",
    "train_segment",
]
