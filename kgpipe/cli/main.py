"""Assembles the subcommands and turns user errors into one line and exit status 2."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType

from kgpipe.errors import KgpipeError

__all__ = ["build_parser", "main"]


def _commands() -> tuple[ModuleType, ...]:
    # each module: NAME, HELP, add_arguments(parser), run(args, console) -> exit status
    from kgpipe.cli import evaluate, export, ls, predict, train

    return (train, evaluate, export, predict, ls)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kgpipe", description="Train knowledge-graph embeddings.")
    sub = p.add_subparsers(dest="command", required=True)
    for module in _commands():
        parser = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(parser)
        parser.set_defaults(func=module.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kgpipe`` console script."""
    from rich.console import Console

    args = build_parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        return int(args.func(args, console))
    except KgpipeError as err:
        from rich.markup import escape

        console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
