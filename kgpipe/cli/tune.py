"""``kgpipe tune``: a hyperparameter search over a base config, run by the library directly
(Optuna trials on a local Dask cluster; the Prefect flow of the same search is ``tune-kge``);
``--resume`` continues a study folder."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from kgpipe.cli.arguments import non_negative_int, positive_int, storage_errors, url
from kgpipe.cli.tune_progress import (
    TuneProgress,
    finished_trials,
    header_text,
    print_summary,
    short_names,
    study_so_far,
    study_spent,
    trials_text,
)
from kgpipe.errors import ConfigError, SearchStopped

if TYPE_CHECKING:
    from kgpipe.tune import StudyFolder, TuneSettings

__all__ = ["HELP", "NAME", "TuneProgress", "add_arguments", "run", "short_names"]

NAME = "tune"
HELP = "search hyperparameters: train trials of a base config over a search space"
PRUNERS = ("median", "asha", "hyperband", "none")
#: the options of a new study; a resumed one keeps what it was created with
NEW_STUDY_ONLY = (
    ("space", "-s/--space"),
    ("set", "--set"),
    ("name", "--name"),
    ("root", "--root"),
    ("pruner", "--pruner"),
    ("prune_warmup", "--prune-warmup"),
    ("seed", "--seed"),
    ("storage", "--storage"),
    ("no_test", "--no-test"),
    ("no_base_trial", "--no-base-trial"),
)


# -- argument types: a bad value is argparse's one-line usage error ---------------------------


def duration(text: str) -> float:
    """``2h``, ``90m``, ``1h30m``, ``45s`` or seconds: positive."""
    from kgpipe.tune.settings import parse_duration

    try:
        return parse_duration(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def cluster_address(text: str) -> str:
    """``local`` or a Dask scheduler address."""
    from kgpipe.distributed.clusters import is_address

    if text == "local" or is_address(text):
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither `local` nor a scheduler address (tcp://host:8786)"
    )


def study_name(text: str) -> str:
    """A folder name (under ``--root``): not empty, no path separator."""
    if not text.strip() or text in (".", "..") or any(c in text for c in "/\\\0"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a study name (a folder name under --root, without '/')"
        )
    return text


def local_folder(text: str) -> str:
    """A study folder, or the folder of study folders: on a local disk."""
    url(text)
    if "://" in text and not text.startswith("file://"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: study folders are on a local disk (a study's database is SQLite in it)"
        )
    return text.removeprefix("file://")


def seed(text: str) -> int:
    """The sampler's seed: 0 to 2**32 - 1 (numpy's range)."""
    value = non_negative_int(text)
    if value >= 2**32:
        raise argparse.ArgumentTypeError(f"must be below 2**32, not {text!r}")
    return value


def database_url(text: str) -> str:
    """An SQLAlchemy database URL of a dialect that is installed."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(text).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a database URL (e.g. sqlite:////abs/path/study.db, "
            "postgresql://user@host/db)"
        ) from None
    return text


def add_arguments(t: argparse.ArgumentParser) -> None:
    what = t.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "-c", "--config", type=url, metavar="URL", help="the base config (any fsspec URL)"
    )
    what.add_argument(
        "--resume",
        type=local_folder,
        metavar="STUDY",
        help="continue this study folder: its finished trials are kept, the trials that were "
        "running are continued, and only what the budget has left is sampled",
    )
    budget = t.add_argument_group(
        "budget (a resumed study keeps its own unless --trials or --timeout is given: then "
        "the ones given are its whole budget, and one not given is no limit)"
    )
    budget.add_argument(
        "--trials",
        type=positive_int,
        metavar="N",
        help="trials in the study in all, those of earlier runs included (default: 30; none "
        "with only --timeout)",
    )
    budget.add_argument(
        "--timeout",
        type=duration,
        metavar="DURATION",
        help="start no trial after this long (2h, 90m, 1h30m, 45s or seconds)",
    )
    budget.add_argument(
        "--workers", type=positive_int, metavar="W", help="trials run at once (default: 1)"
    )
    budget.add_argument(
        "--cluster",
        type=cluster_address,
        metavar="ADDRESS",
        help="run the trials on a running Dask scheduler (tcp://host:8786) instead of a "
        "LocalCluster; its workers need --storage unless they share this disk",
    )
    budget.add_argument(
        "--threads-per-worker",
        type=positive_int,
        metavar="N",
        help="torch threads per trial (default: cores // workers)",
    )
    budget.add_argument(
        "--trial-timeout",
        type=duration,
        metavar="DURATION",
        help="stop a trial that trains longer than this; it counts as pruned at its last "
        "validation (default: no limit)",
    )
    new = t.add_argument_group("a new study (-c)")
    new.add_argument(
        "-s",
        "--space",
        type=url,
        metavar="URL",
        help="search space YAML (config key -> distribution); default: the model's shipped "
        "space (kgpipe/tune/spaces/MODEL.yaml)",
    )
    new.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        help="override a value of the base config (repeatable)",
    )
    new.add_argument(
        "--name",
        type=study_name,
        metavar="NAME",
        help="the study's folder name (default: tune-MODEL-DATASET-UTCTIME)",
    )
    new.add_argument(
        "--root",
        type=local_folder,
        metavar="DIR",
        help="local folder of study folders (default: ./studies)",
    )
    new.add_argument(
        "--pruner",
        choices=PRUNERS,
        help="stop poor trials at a validation: the median rule (default), asynchronous "
        "successive halving (asha), Hyperband or never",
    )
    new.add_argument(
        "--prune-warmup",
        type=non_negative_int,
        metavar="N",
        help="validations a trial completes before the median rule may stop it (default: 1)",
    )
    new.add_argument("--seed", type=seed, metavar="N", help="seed of the sampler (default: 0)")
    new.add_argument(
        "--storage",
        type=database_url,
        metavar="URL",
        help="Optuna database URL (default: SQLite in the study folder)",
    )
    new.add_argument(
        "--no-test",
        action="store_true",
        default=None,
        help="do not evaluate the best trial on test at the end",
    )
    new.add_argument(
        "--no-base-trial",
        action="store_true",
        default=None,
        help="do not start with a trial of the base config's own values (trial 0 by default)",
    )
    new.add_argument(
        "--keep-trials",
        choices=("best", "all"),
        help="best (default): a finished trial other than the best so far keeps only its "
        "config and metrics; all: every trial keeps its model and checkpoints",
    )
    loud = t.add_mutually_exclusive_group()
    loud.add_argument(
        "-q", "--quiet", action="store_true", help="only the final summary (and warnings)"
    )
    loud.add_argument("-v", "--verbose", action="store_true", help="also the search's log lines")


# -- the command ------------------------------------------------------------------------------


def _read_space(where: str) -> Any:
    from kgpipe.tune.space import read_space

    with storage_errors(where, "read the search space"):
        return read_space(where)


def _settings(args: argparse.Namespace) -> TuneSettings:
    from pydantic import ValidationError

    from kgpipe.tune import TuneSettings

    given = {
        "trials": args.trials,
        "timeout_s": args.timeout,
        "workers": args.workers,
        "trial_timeout_s": args.trial_timeout,
        "cluster": args.cluster,
        "threads_per_worker": args.threads_per_worker,
        "name": args.name,
        "root": args.root,
        "pruner": args.pruner,
        "prune_warmup": args.prune_warmup,
        "seed": args.seed,
        "storage": args.storage,
        "test_best": False if args.no_test else None,
        "base_trial": False if args.no_base_trial else None,
        "keep_trials": args.keep_trials,
    }
    kwargs = {k: v for k, v in given.items() if v is not None}
    if args.timeout is not None and args.trials is None:
        kwargs["trials"] = None  # a time budget only
    try:
        return TuneSettings(**kwargs)
    except ValidationError as err:
        e = err.errors()[0]
        raise ConfigError(f"{'.'.join(map(str, e['loc']))}: {e['msg']}") from None


def _new_study(args: argparse.Namespace) -> StudyFolder:
    from kgpipe.config import load_config
    from kgpipe.tune import prepare_study

    if args.prune_warmup is not None and (args.pruner or "median") != "median":
        raise ConfigError("--prune-warmup: for the median rule (--pruner median) only")
    base = load_config(args.config, args.set or [])
    space = _read_space(args.space) if args.space is not None else None
    settings = _settings(args)  # prepare_study opens a --storage database first (one line)
    with storage_errors(settings.root, "create the study folder"):
        return prepare_study(base, space, settings)


def _resumed_study(args: argparse.Namespace) -> StudyFolder:
    from kgpipe.tune import open_study_folder

    given = [flag for dest, flag in NEW_STUDY_ONLY if getattr(args, dest) not in (None, [])]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: for a new study (-c) only; a resumed study keeps its base "
            "config, space and settings (the budget options change its budget)"
        )
    with storage_errors(args.resume, "open the study folder"):
        folder = open_study_folder(args.resume)
        return folder.with_settings(
            trials=args.trials,
            timeout_s=args.timeout,
            workers=args.workers,
            trial_timeout_s=args.trial_timeout,
            cluster=args.cluster,
            threads_per_worker=args.threads_per_worker,
            keep_trials=args.keep_trials,
        )


def _resume_hint(folder: StudyFolder) -> str:
    again = f"kgpipe tune --resume {shlex.quote(str(folder.path))}"
    return f"the study is kept: continue it with `{again}` (its running trials are continued)"


def run(args: argparse.Namespace, console: Console) -> int:
    from kgpipe.cli.signals import Terminated
    from kgpipe.tune import run_and_summarize

    resumed = args.resume is not None
    folder = _resumed_study(args) if resumed else _new_study(args)
    states, best = study_so_far(folder) if resumed else (None, None)
    # --keep-trials given to a spent study: its search trims at once, then summarizes again
    if states is not None and args.keep_trials is None and study_spent(folder, states, best):
        if not args.quiet:
            console.print(
                escape(
                    f"study {folder.path} has its {trials_text(finished_trials(states))}: nothing to run "
                    "(give it a budget: --trials N in all, or --timeout for more time)"
                ),
                highlight=False,
                soft_wrap=True,
            )
        print_summary(console, folder, json.loads(folder.file("results.json").read_text()))
        return 0
    log = (lambda m: console.log(escape(m), highlight=False)) if args.verbose else None

    def warn(message: str) -> None:  # what goes wrong without stopping the search: always shown
        console.log(f"[yellow]warning:[/] {escape(message)}", highlight=False)

    progress = None
    if not args.quiet:
        console.print(escape(header_text(folder, states)), highlight=False, soft_wrap=True)
        if not resumed and folder.settings.base_trial and not args.verbose:  # -v: logged
            text = folder.space.base_trial_text(folder.base)
            console.print(escape(text), highlight=False, soft_wrap=True)
        progress = TuneProgress(
            console,
            keys=folder.space.keys(),
            trials=folder.settings.trials,
            timeout_s=folder.settings.timeout_s,
            finished=finished_trials(states or {}),
            best=best,
        )
        progress.start()
    try:
        results = run_and_summarize(folder, on_event=progress, log=log, warn=warn)
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        console.print(
            f"interrupted: {escape(_resume_hint(folder))}", highlight=False, soft_wrap=True
        )
        return 130
    except Terminated:
        if progress is not None:
            progress.close()
        console.print(escape(_resume_hint(folder)), highlight=False, soft_wrap=True)
        raise
    except SearchStopped as err:
        again = f"kgpipe tune --resume {shlex.quote(str(folder.path))}"
        raise SearchStopped(f"{err} (`{again}`)") from None
    finally:
        if progress is not None:
            progress.close()
    print_summary(console, folder, results)
    return 0
