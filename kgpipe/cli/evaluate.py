"""``kgpipe evaluate``: filtered link-prediction metrics of a trained run."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Literal

from kgpipe.cli.arguments import CHECKPOINT_HELP, checkpoint, positive_int, storage_errors, url

if TYPE_CHECKING:
    from rich.console import Console

NAME = "evaluate"
HELP = "filtered link-prediction metrics of a trained run"


def add_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("run", type=url, help="run folder URL")
    e.add_argument("--split", choices=("valid", "test"), default="test", help="default: test")
    e.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="queries ranked at once (default: the run's evaluation.batch_size)",
    )
    e.add_argument(
        "--candidates",
        type=_candidates,
        metavar="K|all",
        default=None,
        help="rank each answer against K candidates of its own (the OGB-style protocol, "
        "evaluation.candidates) or against all entities (default: as the run was evaluated)",
    )
    e.add_argument("--checkpoint", type=checkpoint, metavar="best|latest|N", help=CHECKPOINT_HELP)
    e.add_argument("--json", action="store_true", help="print JSON")


def _candidates(text: str) -> int | Literal["all"]:
    if text == "all":
        return "all"
    return positive_int(text)


def run(args: argparse.Namespace, console: Console) -> int:
    from kgpipe.cli.output import EvalProgress, print_metrics, ranking_word, result_console
    from kgpipe.process import ThreadGovernor, configure
    from kgpipe.runs.read import evaluate_run

    configure(threads=None)
    governor = ThreadGovernor().start()
    bar = None if args.json else EvalProgress(console, f"{args.split} ranking")

    def progress(done: int, total: int) -> None:
        governor.tick()
        if bar is not None:
            bar(done, total)

    with storage_errors(args.run, "read the run"):
        results = evaluate_run(
            args.run,
            split=args.split,
            batch_size=args.batch_size,
            progress=progress,
            checkpoint=args.checkpoint,
            candidates=args.candidates,
        )
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        model = (
            f", checkpoint of epoch {results['checkpoint_epoch']}"
            if "checkpoint_epoch" in results
            else ""
        )
        title = f"{args.split} ({results['triples']} triples, {ranking_word(results)}{model})"
        print_metrics(result_console(), results, title)
        console.print(f"{results['seconds']:.2f} s")
    return 0
