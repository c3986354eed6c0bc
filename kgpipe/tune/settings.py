"""How a search runs: its budget, sampler, pruner, cluster and where its study lives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from kgpipe.config.base import Frozen
from kgpipe.errors import ConfigError

__all__ = [
    "TuneSettings",
    "check_budget",
    "check_storage",
    "make_pruner",
    "make_sampler",
    "parse_duration",
    "redact_url",
]

_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$"
)
_SECONDS = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")


def parse_duration(text: str | float | int) -> float:
    """Seconds of ``2h``, ``90m``, ``1h30m``, ``45s`` or a plain number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    elif _SECONDS.match(str(text)):  # a plain number; after a unit one needs its own (1h30m)
        seconds = float(str(text))
    else:
        match = _DURATION.match(str(text))
        if not match or not any(match.groups()):
            raise ConfigError(
                f"{text!r} is not a duration (e.g. 2h, 90m, 1h30m, 3600; each number after "
                "the first needs its unit)"
            )
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise ConfigError(f"a duration must be positive, not {text!r}")
    return seconds


class TuneSettings(Frozen):
    """A hyperparameter search (``kgpipe tune``); kept in the study folder for ``--resume``."""

    name: str | None = Field(
        default=None,
        description="Study name (its folder under `root`). Default: tune-{model}-{dataset}-{UTC time}.",
    )
    root: str = Field(default="./studies", description="Local folder holding study folders.")
    trials: int | None = Field(
        default=30,
        ge=1,
        description="Trials in the study in all (a resumed study counts those it has).",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Start no trial after this many seconds of this invocation."
    )
    workers: int = Field(default=1, ge=1, description="Trials run at once (one per Dask worker).")
    cluster: str = Field(
        default="local", description="`local` (LocalCluster) or a scheduler address."
    )
    threads_per_worker: int | None = Field(
        default=None, ge=1, description="torch threads per trial (default: cores // workers)."
    )
    trial_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Stop a trial that trains longer than this (it counts as pruned, at its last "
        "validation; one that never validated counts as the worst). Default: no limit.",
    )
    seed: int = Field(default=0, description="Seed of the sampler.")
    startup_trials: int | None = Field(
        default=None,
        ge=0,
        description="Random trials before TPE takes over (default: max(5, trials // 5)).",
    )
    pruner: Literal["median", "asha", "hyperband", "none"] = Field(
        default="median",
        description="Stop poor trials at a validation: median rule, asynchronous successive "
        "halving (ASHA), Hyperband, or never.",
    )
    prune_warmup: int = Field(
        default=1,
        ge=0,
        description="Validations every trial completes before it may be pruned (median).",
    )
    prune_reduction: int = Field(
        default=3,
        ge=2,
        description="ASHA/Hyperband: 1 trial in this many goes on at each rung (rungs at the "
        "first validation epoch times powers of this factor).",
    )
    storage: str | None = Field(
        default=None,
        description="Optuna RDB URL of the study (default: sqlite in the study folder; give a "
        "database URL such as postgresql://... when the workers do not share this disk).",
    )
    test_best: bool = Field(default=True, description="Evaluate the best trial on test at the end.")
    base_trial: bool = Field(
        default=True,
        description="A new study's first trial trains the base config's own values (those the "
        "space can draw), so the search measures where it started; a search that keeps that "
        "trial to the end (not pruned, not stopped) never reports a best below it.",
    )
    keep_trials: Literal["best", "all"] = Field(
        default="best",
        description="What finished trials keep: `best` -- the best trial so far keeps its whole "
        "run folder, the others their config and metrics only (their model, "
        "checkpoints, embeddings and staged data are removed: a search of many trials on a "
        "large graph would otherwise fill the disk); `all` -- every trial keeps everything.",
    )
    trial_retries: int = Field(
        default=2,
        ge=0,
        description="Re-runs of a trial whose worker died (it resumes its checkpoint).",
    )
    max_failures: int | None = Field(
        default=5,
        ge=1,
        description="Stop the search when this many trials in a row failed (a base config "
        "whose data cannot be read fails every trial at once); none: never stop for failures.",
    )

    @field_validator("root")
    @classmethod
    def _local(cls, value: str) -> str:
        if "://" in value and not value.startswith("file://"):
            raise ValueError("the study folder must be on a local disk (its database is SQLite)")
        return value.removeprefix("file://")

    @field_validator("storage")
    @classmethod
    def _absolute_sqlite(cls, value: str | None) -> str | None:
        """A relative SQLite path is read from the current directory: made absolute when the
        study is set up, so that a resume from another directory opens the same database (it
        created an empty one there and lost the study's trials)."""
        if not value or not value.startswith("sqlite:"):
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(value)
        except (ArgumentError, ValueError):
            return value  # refused with its own message where it is opened
        db = url.database
        if not db or db == ":memory:" or db.startswith("file:") or Path(db).is_absolute():
            return value
        return url.set(database=str(Path(db).resolve())).render_as_string(hide_password=False)

    def startup(self) -> int:
        if self.startup_trials is not None:
            return self.startup_trials
        return max(5, (self.trials or 25) // 5)


def make_sampler(settings: TuneSettings, *, offset: int = 0) -> Any:
    """TPE after a random start-up phase; multivariate with groups (conditional spaces) and the
    constant liar (several trials running at once do not all explore the same spot).
    ``offset`` (the trials a resumed study has) moves the seed, so that a resumed study does
    not draw its first run's random start-up values again."""
    import warnings

    import optuna

    with warnings.catch_warnings():  # `multivariate` and `group` are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            n_startup_trials=settings.startup(),
            seed=(settings.seed + offset) % 2**32,
            multivariate=True,
            group=True,
            constant_liar=True,
        )


def make_pruner(settings: TuneSettings, *, first_step: int = 1, max_step: int = 100) -> Any:
    """The pruner, stepping in epochs: ``first_step`` is the first validation epoch."""
    import optuna

    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    if settings.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=first_step,
            max_resource=max_step,
            reduction_factor=settings.prune_reduction,
        )
    if settings.pruner == "asha":
        # rungs at first_step * r**k epochs: a trial goes on past a rung while it is in the top
        # 1/r of the trials that reached it (the first trial at a rung always does)
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=first_step, reduction_factor=settings.prune_reduction
        )
    return optuna.pruners.MedianPruner(
        n_startup_trials=max(3, settings.workers),
        # Optuna prunes at step >= n_warmup_steps: +1 spares the first `prune_warmup` validations
        n_warmup_steps=first_step * settings.prune_warmup + 1,
        interval_steps=1,
    )


def check_budget(settings: Any) -> None:
    if settings.trials is None and settings.timeout_s is None:
        raise ConfigError("a search needs a budget: a number of trials, a timeout, or both")


def redact_url(url: str) -> str:
    """A database URL with its password masked (for messages and results)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an SQLAlchemy URL: shown as given, it has no password part
        return url


def check_storage(url: str, *, name: str | None = None) -> None:
    """Open the study database at ``url`` once (a missing driver, a wrong host, a path that
    cannot be created: one line, before the study folder is written); a new study ``name``
    must not be taken there (a shared database holds several studies)."""
    import optuna

    try:
        storage = optuna.storages.RDBStorage(url)
        taken = name is not None and name in optuna.study.get_all_study_names(storage)
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"{redact_url(url)}: cannot open the study's database ({first})"
        ) from None
    if taken:
        raise ConfigError(
            f"{redact_url(url)} has a study named {name!r} already: choose another name, or "
            "resume its study folder"
        )
