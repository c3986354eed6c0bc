"""Assembles the subcommands and turns user errors into one line and exit status 2."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kgpipe.cli.signals import Terminated, resend_swallowed_signals
from kgpipe.errors import KgpipeError

if TYPE_CHECKING:
    from rich.console import Console

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


def _console() -> Console:
    """The console of progress, log lines and errors (stderr). For a log file or a pipe its
    log lines are ``[time] message``, as the messages are: Rich's log table padded every line
    to the width with spaces and broke long ones at it (``grep`` missed their words)."""
    import datetime as dt

    from rich.console import Console

    class PlainLog(Console):
        def log(self, *objects: Any, sep: str = " ", end: str = "\n", **kw: Any) -> None:
            stamp = dt.datetime.now().strftime("[%X]")
            indent = "\n" + " " * (len(stamp) + 1)  # a message's next lines under its first
            objects = tuple(o.replace("\n", indent) if isinstance(o, str) else o for o in objects)
            self.print(stamp, *objects, sep=sep, end=end, soft_wrap=True,
                       highlight=kw.get("highlight"), markup=kw.get("markup"))  # fmt: skip

    console = Console(stderr=True, log_path=False)
    if console.is_terminal:
        return console
    # what is not a log line (a table) is not wrapped at 80 either
    width = None if "COLUMNS" in os.environ else 160
    return PlainLog(stderr=True, log_path=False, width=width)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kgpipe`` console script. Exit status: 0, 2 for a user's error
    (one line, no traceback), 130 after Ctrl-C / SIGINT, 143 after SIGTERM."""
    args = build_parser().parse_args(argv)
    console = _console()
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
