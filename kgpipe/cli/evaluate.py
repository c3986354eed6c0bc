"""``kgpipe evaluate``: filtered link-prediction metrics of a trained run."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from kgpipe.cli.output import EvalProgress, print_metrics
from kgpipe.process import ThreadGovernor, configure
from kgpipe.runs.read import evaluate_run

NAME = "evaluate"
HELP = "filtered link-prediction metrics of a trained run"


def add_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("run", help="run folder URL")
    e.add_argument("--split", choices=("valid", "test"), default="test")
    e.add_argument("--batch-size", type=int, default=None, help="queries ranked at once")
    e.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, console: Console) -> int:
    configure(threads=None)
    governor = ThreadGovernor().start()
    bar = None if args.json else EvalProgress(console, f"{args.split} ranking")

    def progress(done: int, total: int) -> None:
        governor.tick()
        if bar is not None:
            bar(done, total)

    results = evaluate_run(
        args.run, split=args.split, batch_size=args.batch_size, progress=progress
    )
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_metrics(console, results, f"{args.split} ({results['triples']} triples, filtered)")
        console.print(f"{results['seconds']:.2f} s")
    return 0
