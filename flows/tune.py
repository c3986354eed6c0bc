"""The hyperparameter search flow ``tune-kge``: prepare (or resume) a study -> run its trials on
a Dask cluster -> summarize (test the winner) -> publish.

Thin by design: the search is :mod:`kgpipe.tune`'s (Optuna's sampler and pruner over ordinary
kgpipe runs, one per trial, on a Dask LocalCluster the search task holds for its length); the
flow resolves its parameters, calls the library and shows the search in the Prefect UI: a
trials table and a progress bar updated as trials finish, then a summary with the best-so-far
and importance plots, the best config and its test metrics.

Usage (the ``tune`` deployment of ``prefect.yaml``, or in-process)::

    prefect deployment run 'tune-kge/tune' --param trials=20 --param timeout=2h \\
        --param 'overrides=["training.epochs=30"]' --param study=umls-complex-search
    # the same again (e.g. after the flow run was killed): the study resumes -- finished trials
    # are kept, interrupted ones continue from their checkpoints, none is repeated; with a
    # bigger `trials`, only the difference is sampled
    prefect deployment run 'tune-kge/tune' --param study=umls-complex-search --param trials=40

    from flows.tune import tune_kge
    tune_kge(config_url="configs/umls-complex.yaml", space_url="space.yaml", trials=8, workers=2)

Parameters: the base config as for ``train-kge`` (``config`` or ``config_url``, plus
``overrides``); the search space (``space_url``, a YAML file, or ``space``, the same as data;
neither: the model's shipped space, ``kgpipe/tune/spaces/``); the budget (``trials`` in the
study in all, ``timeout`` such as ``2h`` after which no trial starts, ``workers`` trials at
once); ``study``, the study folder: a name under ``root`` or a path (a new study is created, an
existing one resumed with its own base config and space). Without ``study`` the study is named
after the flow run (``tune-MODEL-DATASET-RUNNAME-ID``), so a retry of the same flow run resumes
it too. ``pruner``, ``prune_warmup``, ``seed`` and ``storage`` (an Optuna database URL; default:
SQLite in the study folder) are the new study's; ``cluster`` (``local`` or a scheduler
address), ``threads_per_worker`` and ``keep_trials`` may change on a resume. A resume given
``trials`` and/or ``timeout`` runs on that budget alone (``timeout`` alone: more time, no trial
limit); given neither, it keeps the study's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from pydantic import ValidationError

from flows.params import deployment_defaults, flow_run_tag
from flows.train import flow_config
from kgpipe.config import RunConfig
from kgpipe.distributed.clusters import is_address
from kgpipe.errors import ConfigError
from kgpipe.tune import SearchSpace, TuneSettings, parse_duration
from kgpipe.tune.folder import STUDY
from kgpipe.tune.space import read_space
from tasks.tune import (
    new_trials_progress,
    new_trials_table,
    open_or_prepare_study,
    publish_summary,
    run_search,
    summarize_study,
)

__all__ = ["flow_settings", "flow_space", "run_overrides", "study_location", "tune_kge"]

Pruner = Literal["median", "asha", "hyperband", "none"]
_TEST_KEYS = ("mrr", "mr", "hits@1", "hits@3", "hits@10")


@flow(name="tune-kge", log_prints=True, validate_parameters=True)
def tune_kge(
    config: RunConfig | None = None,
    config_url: str | None = None,
    overrides: list[str] | None = None,
    space_url: str | None = None,
    space: dict[str, Any] | None = None,
    trials: int | None = None,
    timeout: str | float | None = None,
    workers: int | None = None,
    study: str | None = None,
    root: str = "./studies",
    pruner: Pruner = "median",
    seed: int = 0,
    trial_timeout: str | float | None = None,
    base_trial: bool = True,
    storage: str | None = None,
    prune_warmup: int = 1,
    cluster: str | None = None,
    threads_per_worker: int | None = None,
    keep_trials: Literal["all", "best"] | None = None,
) -> dict[str, Any]:
    """Search the hyperparameters of the base config (``config`` or ``config_url``, plus
    ``overrides``, as for ``train-kge``) over a search space (``space_url``: a YAML file;
    ``space``: the same as data; neither: the model's shipped space) on a Dask cluster of
    ``workers`` trials at once, up to ``trials`` trials in the study (``timeout``, e.g. ``2h``:
    no trial starts after it; ``trial_timeout``, e.g. ``10m``: a trial training longer counts
    as pruned at its last validation), then test the best trial. ``base_trial``: a new study's
    trial 0 trains the base config's own values. ``study``: the study folder (a name
    under ``root``, or a path); an existing one is resumed -- run the flow again with the same
    ``study`` to continue a killed search or to add trials. ``storage``: the new study's
    Optuna database URL (default: SQLite in the study folder; a password in it is kept with
    the flow run's parameters and shown in the UI, so prefer a URL whose driver reads it
    elsewhere, such as PostgreSQL's ``~/.pgpass``); ``prune_warmup``: validations
    the median rule spares; ``cluster``: ``local`` or a Dask scheduler address;
    ``threads_per_worker``: torch threads per trial; ``keep_trials``: ``best`` frees the disk
    of the trials that lost. A bad config, space or budget fails the run before any work."""
    t0 = time.perf_counter()
    logger = get_run_logger()
    defaults = deployment_defaults()  # {} outside a deployment
    overrides = run_overrides(config, config_url, overrides, defaults, log=logger.info)
    base = flow_config(config, config_url, overrides, log=logger.info)
    search_space = flow_space(space_url, space)
    settings = flow_settings(
        base, study=study, root=root, trials=trials, timeout=timeout, workers=workers,
        pruner=pruner, seed=seed, trial_timeout=trial_timeout, base_trial=base_trial,
        storage=storage, prune_warmup=prune_warmup, cluster=cluster,
        threads_per_worker=threads_per_worker, keep_trials=keep_trials,
    )  # fmt: skip
    given = {"trials": trials, "timeout_s": timeout, "workers": workers}
    given |= {"trial_timeout_s": trial_timeout, "cluster": cluster}
    given |= {"threads_per_worker": threads_per_worker, "keep_trials": keep_trials}
    budget = {k: getattr(settings, k) for k, v in given.items() if v not in (None, "")}
    if settings.name and (Path(settings.root) / settings.name / STUDY).exists():
        # a resumed study keeps its own budget but for what this run gives: a deployment's
        # default (trials: 12) is not given (it cut a 40-trial study to 12 on resume)
        for key, param in (("trials", trials), ("workers", workers), ("timeout_s", timeout)):
            if key in budget and param == defaults.get(key.removesuffix("_s")):
                del budget[key]
    folder = open_or_prepare_study(base, search_space, settings, budget)
    table = new_trials_table(folder)  # one table per flow run, updated as trials finish
    progress = new_trials_progress(folder)
    # the study's lease, from the search until the winner is tested: a search of the same
    # study started between the two tasks could otherwise trim the winner's checkpoints
    with folder.lease():
        seconds = run_search(folder, table, progress, held=True)
        results = summarize_study(folder, seconds, held=True)
    publish_summary(folder, results)
    best = results.get("best")
    summary = {
        "study": str(folder.path.resolve()),
        "results": str(folder.file("results.json").resolve()),
        "trials": results.get("trials", {}),
        "best": None
        if not best
        else {
            "trial": best["trial"],
            "valid_mrr": best["valid_mrr"],
            "values": best.get("values", {}),
            "config": best.get("config"),
            "test": {k: v for k, v in (best.get("test") or {}).items() if k in _TEST_KEYS} or None,
        },
        "seconds": time.perf_counter() - t0,
    }
    logger.info("done: %s", summary)
    return summary


def run_overrides(
    config: RunConfig | None,
    config_url: str | None,
    overrides: list[str] | None,
    defaults: dict[str, Any],
    *,
    log: Callable[[str], None] = print,
) -> list[str] | None:
    """The overrides for this run's base config: a deployment's default overrides (the `tune`
    deployment's short trials) shape its default config, and are not applied to a config the
    run gives itself (they replaced the user's epochs)."""
    own = config is not None or config_url != defaults.get("config_url")
    if overrides and overrides == defaults.get("overrides") and own:
        log(f"not applying the deployment's default overrides {overrides} to this run's config")
        return None
    return overrides


def flow_space(space_url: str | None, space: dict[str, Any] | None) -> SearchSpace | None:
    """The search space of the parameters (None: the model's shipped space); a bad file, key
    or distribution raises :class:`~kgpipe.errors.ConfigError` (one line)."""
    if space_url and space is not None:
        raise ConfigError("give either space or space_url, not both (or neither: the model's "
                          "shipped search space)")  # fmt: skip
    if space is not None:
        return SearchSpace.from_mapping(space, source="space")
    if not space_url:
        return None
    try:
        return read_space(space_url)
    except (OSError, ValueError) as err:  # an unreadable URL (ConfigError passes through)
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{space_url}: cannot read the search space ({err})") from None


def study_location(study: str | None, root: str) -> tuple[str, str | None]:
    """``(root, name)`` of the study folder: ``study`` is a name under ``root`` or a path (with
    a ``/``; its parent is then the root); None: the name is the flow run's (see
    :func:`flow_settings`)."""
    if study is None:
        return root, None
    text = study.removeprefix("file://").rstrip("/" + os.sep)
    head, sep, name = text.replace(os.sep, "/").rpartition("/")
    if name in ("", ".", ".."):
        raise ConfigError(f"study: {study!r} does not name a study folder")
    if not sep:
        return root, name
    return head or "/", name


def flow_settings(
    base: RunConfig,
    *,
    study: str | None,
    root: str,
    trials: int | None,
    timeout: str | float | None,
    workers: int | None,
    pruner: Pruner,
    seed: int,
    trial_timeout: str | float | None = None,
    base_trial: bool = True,
    storage: str | None = None,
    prune_warmup: int = 1,
    cluster: str | None = None,
    threads_per_worker: int | None = None,
    keep_trials: Literal["all", "best"] | None = None,
) -> TuneSettings:
    """The search's settings from the flow's parameters; a bad value raises ConfigError. A new
    study without ``trials`` gets 30, or none with only a ``timeout``; without ``workers``, 1
    (a resumed study keeps its own unless given: ``StudyFolder.with_settings``)."""
    where, name = study_location(study, root)
    if name is None:
        name = _flow_run_study_name(base)
    if prune_warmup != 1 and pruner != "median":
        raise ConfigError("prune_warmup: for the median rule (pruner: median) only")
    if cluster not in (None, "", "local") and not is_address(str(cluster)):
        raise ConfigError(
            f"cluster: {cluster!r} is neither 'local' nor a Dask scheduler address "
            "(such as tcp://host:8786)"
        )
    optional: dict[str, Any] = {
        "storage": storage or None,
        "cluster": cluster or None,
        "threads_per_worker": threads_per_worker,
        "keep_trials": keep_trials,
    }
    try:
        return TuneSettings(
            name=name,
            root=where,
            trials=trials if trials is not None else (None if timeout else 30),
            timeout_s=None if timeout in (None, "") else parse_duration(timeout),
            workers=workers or 1,
            pruner=pruner,
            prune_warmup=prune_warmup,
            seed=seed,
            trial_timeout_s=None if trial_timeout in (None, "") else parse_duration(trial_timeout),
            base_trial=base_trial,
            **{k: v for k, v in optional.items() if v is not None},
        )
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in err.errors()
        )
        raise ConfigError(f"search settings: {problems}") from None


def _flow_run_study_name(base: RunConfig) -> str | None:
    """``tune-MODEL-DATASET-RUNNAME-ID`` of this flow run (the same for a retry of it, which
    then resumes the study); None outside a flow run (the library's timestamped name)."""
    tag = flow_run_tag()
    return None if tag is None else f"tune-{base.model.name}-{base.data.dataset or 'custom'}-{tag}"
