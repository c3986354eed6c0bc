"""Assembles the subcommands and turns user errors into one line and exit status 2."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Sequence
from types import ModuleType

from kgpipe.cli.signals import Terminated, resend_swallowed_signals
from kgpipe.errors import KgpipeError

__all__ = ["build_parser", "main"]


def _commands() -> tuple[ModuleType, ...]:
    # each module: NAME, HELP, add_arguments(parser), run(args, console) -> exit status
    from kgpipe.cli import config, evaluate, export, ls, neighbours, predict, synth, train, tune

    return (train, tune, evaluate, export, predict, neighbours, synth, ls, config)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kgpipe")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kgpipe", description="Train knowledge-graph embeddings.")
    p.add_argument("--version", action="version", version=f"kgpipe {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for module in _commands():
        parser = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(parser)
        parser.set_defaults(func=module.run)
    return p


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kgpipe`` console script. Exit status: 0, 2 for a user's error
    (one line, no traceback), 130 after Ctrl-C / SIGINT, 143 after SIGTERM."""
    from rich.console import Console

    args = build_parser().parse_args(argv)
    console = Console(stderr=True, log_path=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # a log file: lines as the messages are, not wrapped at 80
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        with resend_swallowed_signals():  # a signal whose exception was swallowed: sent again
            return int(args.func(args, console))
    except KgpipeError as err:
        from rich.markup import escape

        console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    except BrokenPipeError:  # `kgpipe config --defaults | head`: the reader left, say nothing
        import sys

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:  # a storage fault no layer named (a run root that is a file, a
        # missing bucket): one line with the path the system gave, not a traceback
        from rich.markup import escape

        console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except Terminated:
        console.print("terminated")
        return 143
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
