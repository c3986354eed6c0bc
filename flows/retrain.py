"""Scheduled retraining: when the source graph changed, train a new run warm-started from the
series' latest model; when nothing changed, end early as Completed("no change")."""

from __future__ import annotations

import datetime as dt
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Completed, State

from flows.train import flow_config, train_kge
from kgpipe.config import RunConfig
from tasks.retrain import find_previous, fingerprint_source, record_latest


@flow(name="retrain-kge", log_prints=True, validate_parameters=True)
def retrain_kge(
    config: RunConfig | None = None,
    config_url: str | None = None,
    overrides: list[str] | None = None,
    force: bool = False,
) -> State[Any]:
    """Retrain the series ``config.run.name`` (runs are named ``{series}-{UTC timestamp}``).
    The config is ``config`` or ``config_url`` plus ``overrides``, as for ``train-kge``."""
    logger = get_run_logger()
    config = flow_config(config, config_url, overrides, log=logger.info)
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
