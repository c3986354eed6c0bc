"""Series of runs retrained on a schedule: ``{run.root}/{series}.latest.json`` points at the
series' newest finished run and records the input fingerprint it was trained on."""

from __future__ import annotations

from typing import Any

from kgpipe.config import RunConfig
from kgpipe.data.dataset import load_dataset
from kgpipe.runs.folder import retry_policy
from kgpipe.storage import Store

__all__ = [
    "latest_of_series",
    "record_latest_of_series",
    "source_fingerprint",
    "warm_start_refusal",
]


def _series_store(config: RunConfig) -> Store:
    return Store(config.run.root, config.run.storage_options, retry=retry_policy(config))


def latest_of_series(config: RunConfig, series: str) -> dict[str, Any] | None:
    """The record of the series' latest finished run (``{root}/{series}.latest.json``)."""
    store = _series_store(config)
    rel = f"{series}.latest.json"
    return store.read_json(rel) if store.exists(rel) else None


def record_latest_of_series(config: RunConfig, series: str, record: dict[str, Any]) -> None:
    _series_store(config).write_json(f"{series}.latest.json", record)


def source_fingerprint(config: RunConfig) -> str:
    """The content fingerprint of the configured input (all splits)."""
    return load_dataset(config.data, retry=retry_policy(config)).fingerprint


def warm_start_refusal(config: RunConfig, previous: str) -> str | None:
    """Why the series' previous run at ``previous`` cannot warm-start a run of ``config`` (its
    model is another, or of another dimension: its tables would not fit), or None."""
    from kgpipe.runs.read import open_run

    _, old = open_run(previous, config.run.storage_options)
    was, now = (old.model.name, old.model.dim), (config.model.name, config.model.dim)
    if was != now:
        return f"its model is {was[0]} of dim {was[1]}, this config's {now[0]} of dim {now[1]}"
    return None
