"""Hyperparameter search: Optuna's samplers and pruners over kgpipe runs on a Dask cluster.

``tune(base, space, settings)`` creates a study folder and runs the search; ``resume(path)``
continues one. Trials are ordinary kgpipe runs (in the study's ``trials/`` folder); the study
is Optuna's, in its RDB storage (SQLite in the study folder by default). The Prefect flow
(``flows/tune.py``) and ``kgpipe tune`` compose the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.distributed.clusters import CLUSTERS
from kgpipe.errors import ConfigError
from kgpipe.process import check_guarded_script, check_not_reimported
from kgpipe.runs.stage import check_trainable_data
from kgpipe.tune.folder import StudyFolder, create_study_folder, open_study_folder
from kgpipe.tune.results import summarize
from kgpipe.tune.settings import TuneSettings, check_budget, check_storage, parse_duration
from kgpipe.tune.space import SearchSpace
from kgpipe.tune.space_check import check_space
from kgpipe.tune.study import StudyEvent, search_held

__all__ = [
    "SearchSpace",
    "StudyEvent",
    "StudyFolder",
    "TuneSettings",
    "default_space",
    "open_study_folder",
    "parse_duration",
    "prepare_study",
    "run_and_summarize",
    "search_base",
    "trial_length_text",
]


def default_space(model: str) -> SearchSpace:
    """The shipped search space of ``model`` (``kgpipe/tune/spaces/{model}.yaml``)."""
    name = f"{model}.yaml"
    files = resources.files("kgpipe.tune") / "spaces"
    path = files / name
    if not path.is_file():
        have = sorted(
            p.name.removesuffix(".yaml") for p in files.iterdir() if p.name.endswith(".yaml")
        )
        raise ConfigError(
            f"no shipped search space for model {model!r} (have: {', '.join(have)}); give a search space"
        )
    return SearchSpace.from_yaml(path.read_text(encoding="utf-8"), source=f"default space ({name})")


def prepare_study(
    base: RunConfig, space: SearchSpace | None, settings: TuneSettings
) -> StudyFolder:
    """Check the search and create its study folder (nothing is written on a bad input)."""
    check_not_reimported("a search")
    if settings.cluster in CLUSTERS:
        check_guarded_script(f"a search on the {settings.cluster} Dask cluster")
    check_budget(settings)
    base = search_base(base)
    space = space or default_space(base.model.name)
    check_space(space, base)
    if settings.storage:
        check_storage(settings.storage, name=settings.name)
    if base.training.epochs < 1:
        raise ConfigError(
            "a search needs training.epochs >= 1: a trial of 0 epochs validates nothing"
        )
    # the graph must read: a bad line failed every trial, each reading the whole graph again,
    # and left a study folder behind
    check_trainable_data(base)
    return create_study_folder(base, space, settings)


#: validations a trial makes at most when the base config does not say (``evaluation.every``)
VALIDATIONS = 5


def search_base(base: RunConfig) -> RunConfig:
    """The base config a search runs: a search selects on validation and its pruner acts at
    each one, so a base that does not validate (``evaluation.every: 0``, the default) validates
    at most :data:`VALIDATIONS` times a trial: every ``ceil(training.epochs / 5)`` epochs (a run
    also validates at its last epoch). So does a base whose ``evaluation.every`` is not below
    its ``training.epochs`` (the shipped UMLS config's 25 under ``--set training.epochs=2``):
    its trials would validate only at their end, where no pruner acts."""
    if 0 < base.evaluation.every < base.training.epochs:
        return base
    every = max(1, -(-base.training.epochs // VALIDATIONS))
    evaluation = base.evaluation.model_copy(update={"every": every})
    return base.model_copy(update={"evaluation": evaluation})


def trial_length_text(base: RunConfig) -> str:
    """How long a trial of ``base`` is and how often it validates, for a study's first line."""
    epochs, every = base.training.epochs, base.evaluation.every
    length = "1 epoch" if epochs == 1 else f"{epochs} epochs"
    return f"trials of {length} validated every " + ("epoch" if every == 1 else f"{every} epochs")


def run_and_summarize(
    folder: StudyFolder,
    *,
    on_event: Callable[[StudyEvent], None] | None = None,
    log: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the search of ``folder`` to its budget, then write what it found (results.json).
    ``log`` gets what the search does, ``warn`` what goes wrong without stopping it (a
    tracking server that does not answer); both default to ``log``."""
    t0 = time.perf_counter()
    with folder.lease():  # held until the winner is tested: no other search trims it
        study = search_held(folder, on_event=on_event, log=log, warn=warn)
        return summarize(
            folder,
            study,
            seconds=time.perf_counter() - t0,
            test=folder.settings.test_best,
            log=log,
            warn=warn,
            lease=False,
        )
