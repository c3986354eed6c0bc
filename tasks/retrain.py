"""Thin Prefect tasks of scheduled retraining (see ``flows/retrain.py``)."""

from __future__ import annotations

from typing import Any

from prefect import task

from kgpipe.config import RunConfig
from kgpipe.runs.series import (
    latest_of_series,
    record_latest_of_series,
    source_fingerprint,
    warm_start_refusal,
)
from tasks.kge import STORAGE_RETRY

__all__ = ["find_previous", "fingerprint_source", "record_latest", "warm_start_problem"]


@task(timeout_seconds=3600, **STORAGE_RETRY)
def fingerprint_source(config: RunConfig) -> str:
    """Read and validate the source graph; its content fingerprint."""
    return source_fingerprint(config)


@task(timeout_seconds=600, **STORAGE_RETRY)
def find_previous(config: RunConfig, series: str) -> dict[str, Any] | None:
    """The record of the series' latest finished run, if any."""
    return latest_of_series(config, series)


@task(timeout_seconds=600, **STORAGE_RETRY)
def record_latest(config: RunConfig, series: str, record: dict[str, Any]) -> None:
    """Point the series at its newest run."""
    record_latest_of_series(config, series, record)


@task(timeout_seconds=600, **STORAGE_RETRY)
def warm_start_problem(config: RunConfig, previous: str) -> str | None:
    """Why the previous run cannot warm-start this config's model (None: it can)."""
    return warm_start_refusal(config, previous)
