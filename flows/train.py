"""The training flow: stage -> cluster -> [train segment -> commit]* -> test -> export -> report
(-> MLflow, under ``tracking.backend: mlflow``: the flow is the driver that logs).

Thin by design: every step is a task over one library call; the segment plan (where segments
end, early stopping) is the library's (:func:`kgpipe.runs.segments.drive_segments`), and the
flow holds the Dask cluster open with ``with`` for the length of the training. Run it with
``kgpipe train -c CONFIG`` (local, ephemeral Prefect unless ``PREFECT_API_URL`` is set) or
through the deployments in ``prefect.yaml``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from prefect import Flow, flow, get_run_logger
from prefect.artifacts import update_progress_artifact
from prefect.settings import PREFECT_API_URL

from flows.params import deployment_defaults, flow_run_tag, resolve_config
from kgpipe.config import RunConfig
from kgpipe.errors import ConfigError
from kgpipe.launch.dask import open_run_cluster
from kgpipe.runs.folder import RunFolder, run_store
from kgpipe.runs.lease import check_handle
from kgpipe.runs.segments import SegmentResult, drive_segments
from kgpipe.runs.stage import run_lease
from kgpipe.tracking import check_tracking, track_run
from kgpipe.training.hooks import Callback
from tasks.kge import (
    evaluate_and_export,
    new_metrics_table,
    new_progress,
    publish_report,
    stage_data,
    test_on_gang,
    track_results,
    train_segment,
)

__all__ = ["build_train_flow", "flow_config", "train_kge"]

# a `lease` that is no longer its caller's: most likely a flow run re-run by hand
_LEASE_HINT = ": a flow run re-run with the `lease` of an earlier run? Run it without `lease`"


def build_train_flow(callbacks: Sequence[Callback] = ()) -> Flow[..., dict[str, Any]]:
    """The ``train-kge`` flow; ``callbacks`` (e.g. the CLI's progress bar) follow its training
    wherever it runs. The deployed flow is :data:`train_kge` (no extra callbacks)."""

    @flow(name="train-kge", log_prints=True, validate_parameters=True)
    def train_kge(
        config: RunConfig | None = None,
        config_url: str | None = None,
        overrides: list[str] | None = None,
        resume: bool = True,
        warm_start: str | None = None,
        previous: dict[str, Any] | None = None,
        overwrite: bool = False,
        lease: str | None = None,
    ) -> dict[str, Any]:
        """Train ``config`` end to end. With ``resume`` (default) a run folder of the same name
        continues from its latest committed checkpoint, so a crashed flow run is simply run
        again; ``overwrite`` replaces it instead. The flow takes the run folder's lease (one
        writer per run folder) unless its caller holds it already (``lease``: its ``NUMBER/TOKEN``).

        Instead of ``config``: ``config_url``, a config file (relative to the flow run's working
        directory, or any fsspec URL). ``overrides`` (``key.path=value``, as ``kgpipe train
        --set``) apply to either; a bad file, key or value fails the run before any work."""
        t0 = time.perf_counter()
        logger = get_run_logger()
        config = flow_config(config, config_url, overrides, log=logger.info)
        config = _named(config) if resume else config.with_run_name()
        check_tracking(config.tracking)  # an MLflow server that does not answer: before any work
        with contextlib.ExitStack() as held:
            if lease is None:  # a second flow run of the same run.name is refused here
                lease = held.enter_context(run_lease(config, holder=_holder())).handle
            else:  # the caller holds it ("NUMBER/TOKEN")
                check_handle(run_store(config), lease, hint=_LEASE_HINT)
            run = stage_data(config, resume=resume, warm_start=warm_start, overwrite=overwrite)
            run.lease = lease
            tracker = held.enter_context(track_run(run, log=logger.info, warn=logger.warning))
            ours = [*callbacks, tracker] if tracker is not None else list(callbacks)
            results, history, restarts, report = _train_and_finish(
                run, t0, previous=previous, callbacks=ours
            )
            if tracker is not None:  # test metrics, then the report and curve just published
                track_results(tracker, results, history, seconds=time.perf_counter() - t0)
        summary = {
            "run": run.url,
            "fingerprint": run.fingerprint,  # of the data it staged and trained on
            "report": report,
            "epochs": len(history),
            "restarts": restarts,
            "results": {k: results[k] for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10")}
            if results
            else None,
            "seconds": time.perf_counter() - t0,
        }
        logger.info("done: %s", summary, extra={"kgpipe_echo": False})  # the CLI prints its own
        return summary

    return train_kge


def flow_config(
    config: RunConfig | None,
    config_url: str | None,
    overrides: Sequence[str] | None,
    *,
    log: Callable[[str], None] | None = None,
) -> RunConfig:
    """The flow run's config from its parameters (:func:`flows.params.resolve_config`); a
    config error is raised as one line, the flow run's state message."""
    try:
        return resolve_config(config, config_url, overrides, defaults=deployment_defaults, log=log)
    except ConfigError as err:
        raise ConfigError(" ".join(str(err).split())) from None


def _named(config: RunConfig) -> RunConfig:
    """``config`` with its run name: a config without one is named after the flow run
    (``MODEL-DATASET-RUNNAME-ID``), so that a retry of the flow run resumes its folder (a
    timestamped name started every retry anew, and `resume` did nothing). Only for a flow
    that resumes: without, a retry under the same name would find the folder it made."""
    tag = flow_run_tag() if config.run.name is None else None
    if tag is None:
        return config.with_run_name()
    name = f"{config.model.name}-{config.data.dataset or 'custom'}-{tag}"
    return config.model_copy(update={"run": config.run.model_copy(update={"name": name})})


def _holder() -> str:
    """This flow run, as a second writer of its run folder is told."""
    from prefect.runtime import flow_run

    return f"Prefect flow run {flow_run.name} ({flow_run.id})"


def _train_and_finish(
    run: RunFolder,
    t0: float,
    *,
    previous: dict[str, Any] | None,
    callbacks: Sequence[Callback],
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int, str]:
    """Cluster -> [train segment -> commit]* -> test -> export -> report (under the lease)."""
    logger = get_run_logger()
    progress = new_progress(run)
    metrics = new_metrics_table(run)  # one table per flow run, updated after each segment
    dashboard: str | None = None
    with contextlib.ExitStack() as stack:
        address: str | None = None
        if run.config.distributed.uses_dask:
            api = PREFECT_API_URL.value()
            client = stack.enter_context(
                open_run_cluster(
                    run.config,
                    # workers report to this flow's API, not a temporary server of their own
                    extra_env={"PREFECT_API_URL": api} if api else None,
                    log=logger.info,
                )
            )
            address, dashboard = str(client.scheduler.address), str(client.dashboard_link)
        last: list[SegmentResult] = []  # the segment before, whose launcher said what trains

        def segment(until: int) -> SegmentResult:
            result = train_segment(
                run, until, address, last[-1].restarts if last else 0, progress,
                callbacks=callbacks, metrics_id=metrics, after=last[-1] if last else None,
            )  # fmt: skip
            last[:] = [result]
            return result

        history, restarts = drive_segments(run, segment, log=logger.info)
        # trained: early stopping (or a resume of a run it had ended) ends before the last epoch
        update_progress_artifact(progress, 100.0)
        # a sharded run's test split, ranked by its gang while the cluster is up; a failed
        # task leaves it to evaluate_and_export (the run is trained already)
        tested = None
        if address is not None and run.config.distributed.strategy == "sharded":
            ranked = test_on_gang(run, address, return_state=True)
            tested = ranked.result() if ranked.is_completed() else None
    results = evaluate_and_export(run, history, restarts, time.perf_counter() - t0, tested)
    report = publish_report(
        run,
        results,
        history,
        seconds=time.perf_counter() - t0,
        previous=previous,
        dashboard=dashboard,
    )
    return results, history, restarts, report


train_kge = build_train_flow()
