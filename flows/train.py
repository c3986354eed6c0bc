"""The training flow: stage -> cluster -> [train segment -> commit]* -> test -> export -> report.

Thin by design: every step is a task over one library call; the loop, early stopping and the
cluster's life cycle are the flow's. Run it with ``kgpipe train -c CONFIG`` (local, ephemeral
Prefect unless ``PREFECT_API_URL`` is set) or through the deployments in ``prefect.yaml``.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from kgpipe.config import RunConfig
from kgpipe.run import committed_history, segment_ends, should_stop
from tasks.kge import (
    evaluate_and_export,
    new_progress,
    publish_report,
    stage_data,
    start_cluster,
    stop_cluster,
    train_segment,
)


@flow(name="train-kge", log_prints=True, validate_parameters=True)
def train_kge(
    config: RunConfig,
    resume: bool = True,
    warm_start: str | None = None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``config`` end to end. With ``resume`` (default) a run folder of the same name
    continues from its latest committed checkpoint, so a crashed flow run is simply run again."""
    t0 = time.perf_counter()
    logger = get_run_logger()
    run = stage_data(config, resume=resume, warm_start=warm_start)
    progress = new_progress(run)
    cluster = start_cluster(run.config)
    address = cluster["address"] if cluster else None
    history = committed_history(run)
    restarts = 0
    try:
        for end in segment_ends(run.resumed_epoch, run.config):
            segment = train_segment(run, end, address, restarts, progress)
            history, restarts = segment.history, segment.restarts
            if should_stop(history, run.config.evaluation.patience):
                logger.info("early stopping after epoch %d: no better valid MRR", end)
                break
    finally:
        stop_cluster(address)
    results = evaluate_and_export(run, history, restarts, time.perf_counter() - t0)
    report = publish_report(
        run,
        results,
        history,
        seconds=time.perf_counter() - t0,
        previous=previous,
        dashboard=cluster["dashboard"] if cluster else None,
    )
    summary = {
        "run": run.url,
        "report": report,
        "epochs": len(history),
        "restarts": restarts,
        "results": {k: results[k] for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10")}
        if results
        else None,
        "seconds": time.perf_counter() - t0,
    }
    logger.info("done: %s", summary)
    return summary
