"""Scheduled retraining: when the source graph changed, train a new run warm-started from the
series' latest model; when nothing changed, end early as Completed("no change")."""

from __future__ import annotations

import datetime as dt
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from flows.train import train_kge
from kgpipe.config import RunConfig
from kgpipe.run import latest_of_series, record_latest_of_series, source_fingerprint
from tasks.kge import transient


@task(
    cache_policy=NO_CACHE, retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=transient
)
def fingerprint_source(config: RunConfig) -> str:
    """Read and validate the source graph; its content fingerprint."""
    return source_fingerprint(config)


@task(
    cache_policy=NO_CACHE, retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=transient
)
def find_previous(config: RunConfig, series: str) -> dict[str, Any] | None:
    return latest_of_series(config, series)


@task(
    cache_policy=NO_CACHE, retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=transient
)
def record_latest(config: RunConfig, series: str, record: dict[str, Any]) -> None:
    record_latest_of_series(config, series, record)


@flow(name="retrain-kge", log_prints=True, validate_parameters=True)
def retrain_kge(config: RunConfig, force: bool = False) -> State[Any]:
    """Retrain the series ``config.run.name`` (runs are named ``{series}-{UTC timestamp}``)."""
    logger = get_run_logger()
    series = config.run.name or f"{config.model.name}-{config.data.dataset or 'graph'}"
    fingerprint = fingerprint_source(config)
    previous = find_previous(config, series)
    if previous and previous["fingerprint"] == fingerprint and not force:
        logger.info("no change in the source graph since %s; nothing to train", previous["run"])
        return Completed(message="no change", data={"run": previous["run"], "changed": False})
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    run_config = config.model_copy(
        update={"run": config.run.model_copy(update={"name": f"{series}-{stamp}"})}
    )
    warm = previous["run"] if previous else None
    if warm:
        logger.info("source changed: warm start from %s", warm)
    summary = train_kge(run_config, resume=False, warm_start=warm, previous=previous)
    record_latest(
        config,
        series,
        {"run": summary["run"], "fingerprint": fingerprint, "results": summary["results"],
         "url": summary["run"], "previous": warm},
    )  # fmt: skip
    return Completed(message="retrained", data={**summary, "changed": True})
