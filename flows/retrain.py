"""Scheduled retraining: when the source graph changed, train a new run warm-started from the
series' latest model; when nothing changed, end early as Completed("no change")."""

from __future__ import annotations

import datetime as dt
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Completed, State

from flows.train import flow_config, train_kge
from kgpipe.config import RunConfig, config_hash, config_hashes
from tasks.retrain import find_previous, fingerprint_source, record_latest, warm_start_problem


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
    recipe = config_hash(config)  # a series whose config changed retrains (records before: not)
    known = (None, *config_hashes(config))  # (a record of an older kgpipe's hash: the same)
    same_recipe = previous is not None and previous.get("config_hash") in known
    if previous and previous["fingerprint"] == fingerprint and same_recipe and not force:
        logger.info("no change in the source graph since %s; nothing to train", previous["run"])
        return Completed(message="no change", data={"run": previous["run"], "changed": False})
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    run_config = config.model_copy(
        update={"run": config.run.model_copy(update={"name": f"{series}-{stamp}"})}
    )
    warm = previous["run"] if previous else None
    refused = warm_start_problem(config, warm) if warm else None
    if warm and refused:  # the series' model changed: a fresh start, not a failing run a night
        logger.warning("not warm-starting from %s (%s): training from scratch", warm, refused)
        warm = None
    elif warm:
        logger.info(
            "%s changed: warm start from %s", "the source" if same_recipe else "the config", warm
        )
    summary = train_kge(run_config, resume=False, warm_start=warm, previous=previous)
    trained = summary["fingerprint"]  # staging reads the source again: what it trained on
    if trained != fingerprint:
        logger.warning("the source graph changed while this run staged it; recorded: the "
                       "graph it trained on (%s)", trained[:12])  # fmt: skip
    record_latest(
        config,
        series,
        {"run": summary["run"], "fingerprint": trained, "results": summary["results"],
         "url": summary["run"], "previous": warm, "config_hash": recipe},
    )  # fmt: skip
    return Completed(message="retrained", data={**summary, "changed": True})
