"""``kgpipe train``: a run, through the Prefect flow by default or the plain library loop."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from kgpipe.cli.orchestrators import NONE, load_orchestrator
from kgpipe.cli.signals import Terminated
from kgpipe.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from kgpipe.config import RunConfig
    from kgpipe.training.hooks import Callback

NAME = "train"
HELP = "train a model and write a run folder"
DEFAULT_ORCHESTRATOR = "prefect"


def add_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("-c", "--config", required=True, help="YAML config (any fsspec URL)")
    t.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE", help="override a config value"
    )
    existing = t.add_mutually_exclusive_group()
    existing.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    existing.add_argument(
        "--resume",
        action="store_true",
        help="continue the run folder's latest committed checkpoint (a fresh run if none)",
    )
    t.add_argument(
        "--orchestrator",
        metavar="NAME",
        default=None,
        help=f"who runs the training: {DEFAULT_ORCHESTRATOR} (the Prefect flow train-kge, the "
        f"default where installed) or {NONE} (the plain library loop); `kgpipe ls` lists them",
    )
    t.add_argument(
        "--no-prefect",
        action="store_true",
        help=f"the same as --orchestrator {NONE}",
    )
    loud = t.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    loud.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also Prefect's own log lines (task states, ...; always in the Prefect UI)",
    )


def _orchestrator(args: argparse.Namespace) -> str:
    who = NONE if args.no_prefect else str(args.orchestrator or DEFAULT_ORCHESTRATOR)
    if args.no_prefect and args.orchestrator not in (None, NONE):
        raise ConfigError(
            f"--no-prefect and --orchestrator {args.orchestrator} contradict each other "
            f"(--no-prefect is --orchestrator {NONE})"
        )
    return who


def _resume_command(args: argparse.Namespace, config: RunConfig) -> str:
    """The command that continues this run: the same config and --set items, the run's name
    (a timestamped one, where the config names none) and --resume."""
    import shlex

    sets = [s for s in args.set or [] if s.split("=", 1)[0].strip() != "run.name"]
    words = ["kgpipe", "train", "-c", args.config]
    for item in [*sets, f"run.name={config.run.name}"]:
        words += ["--set", item]
    if args.no_prefect:
        words.append("--no-prefect")
    elif args.orchestrator:
        words += ["--orchestrator", args.orchestrator]
    return shlex.join([*words, "--resume"])


def _stopped_hint(args: argparse.Namespace, config: RunConfig) -> str:
    """How to go on after an interrupt: from the last checkpoint; from the start when there
    is none yet; staging again when staging had not finished (best effort: a store that does
    not answer gets the usual hint)."""
    again = _resume_command(args, config)
    try:
        from kgpipe.checkpoint import CheckpointStore
        from kgpipe.runs.folder import DATA, run_store

        store = run_store(config)
        if not store.exists(DATA):  # written last by staging
            return f"stopped before training began; to start again: {again}"
        if not CheckpointStore(store).committed():
            return f"stopped before its first checkpoint; to train it from the start: {again}"
    except Exception:
        pass
    return f"to go on from its last checkpoint: {again}"


def run(args: argparse.Namespace, console: Console) -> int:
    # imported here, not above: `kgpipe --help` and usage errors do not wait for torch; and
    # the config is read before the pipeline (Dask, pyarrow, ...) is imported, so that a
    # config error does not wait for those either
    from rich.markup import escape

    from kgpipe.config import load_config

    config = load_config(args.config, args.set or [])
    who = _orchestrator(args)
    if args.resume:
        config.check_resumable()
    config = config.with_run_name()  # named here: an interrupted run says how to go on

    from kgpipe.cli.output import EvalProgress, TrainProgress, print_metrics, ranking_word
    from kgpipe.pipeline import train

    if args.resume:
        from kgpipe.runs.folder import CONFIG, run_store

        store = run_store(config)
        if not store.exists(CONFIG):  # a mistyped name would train a whole run unannounced
            console.print(
                f"[yellow]warning:[/] no run at {escape(store.url)} to resume: a new run starts",
                highlight=False,
                soft_wrap=True,
            )
    progress = None if args.quiet else TrainProgress(console)
    callbacks: list[Callback] = [] if progress is None else [progress]
    log = None if args.quiet else (lambda m: console.log(escape(m), highlight=False))
    if args.verbose and who == NONE and log is not None:
        log(f"(-v adds Prefect's log lines; --orchestrator {NONE} runs without Prefect)")
    t0 = time.perf_counter()
    try:
        if who == NONE:
            result = train(
                config,
                callbacks=callbacks,
                overwrite=args.overwrite,
                resume=args.resume,
                log=log,
                eval_progress=None if args.quiet else EvalProgress(console, "test ranking"),
                holder="kgpipe train",
            )
            url, results = result.url, result.results
        else:
            orchestrate = load_orchestrator(who)
            url, results = orchestrate(
                config,
                resume=args.resume,
                overwrite=args.overwrite,
                callbacks=callbacks,
                log=log,
                # only when asked: an orchestrator written before `verbose` still runs
                **({"verbose": True} if args.verbose else {}),
            )
    except (KeyboardInterrupt, Terminated):
        if progress is not None:
            progress.close()
            progress = None
        console.print(escape(_stopped_hint(args, config)), soft_wrap=True)
        raise
    finally:
        if progress is not None:
            progress.close()
    if results is not None:
        title = f"test ({results['triples']} triples, {ranking_word(results)})"
        print_metrics(console, results, title)
    console.print(escape(f"run folder: {url}  ({time.perf_counter() - t0:.1f} s)"))
    return 0
