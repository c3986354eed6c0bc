"""``kgpipe synth``: a synthetic graph with planted structure, for scale tests
(:mod:`kgpipe.data.synth`), and the settings that train on it."""

from __future__ import annotations

import argparse
import math
import time
from typing import TYPE_CHECKING

from kgpipe.cli.arguments import non_negative_int, positive_int, storage_errors, url

if TYPE_CHECKING:
    from rich.console import Console

    from kgpipe.data.synth import SynthResult

NAME = "synth"
HELP = "generate a synthetic graph with planted structure (train/valid/test files) for scale tests"


def _number(text: str, lo: float, hi: float, *, below_hi: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < lo or value > hi or (below_hi and value == hi):
        upper = f"below {hi:g}" if below_hi else f"{hi:g}"
        raise argparse.ArgumentTypeError(f"must be from {lo:g} to {upper}, not {text!r}")
    return value


def probability(text: str) -> float:
    """A number from 0 to 1."""
    return _number(text, 0.0, 1.0)


def split_fraction(text: str) -> float:
    """A fraction from 0 to below 0.5 (of ``data.split``'s range)."""
    return _number(text, 0.0, 0.5, below_hi=True)


def exponent(text: str) -> float:
    """A power-law exponent from 0 (uniform) to 10."""
    return _number(text, 0.0, 10.0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=url, metavar="OUT", help="output folder (a path or any fsspec URL)")
    p.add_argument("--entities", type=positive_int, required=True, metavar="N")
    p.add_argument("--relations", type=positive_int, required=True, metavar="R")
    p.add_argument("--edges", type=positive_int, required=True, metavar="E",
                   help="edges drawn (duplicates included), over all three splits")  # fmt: skip
    p.add_argument("--seed", type=non_negative_int, default=0, help="default: 0")
    p.add_argument("--clusters", type=positive_int, metavar="K",
                   help="latent clusters (at most N); default: about sqrt(N), at most 1,000")  # fmt: skip
    p.add_argument("--noise", type=probability, default=0.1, metavar="P",
                   help="share of tails drawn from all entities, not the mapped cluster; "
                   "default: 0.1")  # fmt: skip
    p.add_argument("--exponent", type=exponent, default=1.1, metavar="A",
                   help="power-law exponent of entity and relation popularity; default: 1.1")  # fmt: skip
    p.add_argument("--valid", type=split_fraction, default=0.01, metavar="F",
                   help="fraction of validation edges (0: no file); default: 0.01")  # fmt: skip
    p.add_argument("--test", type=split_fraction, default=0.01, metavar="F",
                   help="fraction of test edges (0: no file); default: 0.01")  # fmt: skip
    p.add_argument("--format", choices=("tsv", "parquet"), default="tsv", help="default: tsv")
    p.add_argument("--chunk-edges", type=positive_int, default=1 << 20, metavar="C",
                   help="edges generated and written at a time (memory); the output does not "
                   "depend on it; default: 1048576")  # fmt: skip
    p.add_argument("--overwrite", action="store_true",
                   help="replace a graph (synth.json, split files) already in OUT")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def training_lines(result: SynthResult) -> list[str]:
    """The ``--set`` options and the YAML ``data`` section that train on ``result``."""
    # an empty split's file is no input kgpipe takes ("no triples found"): left out
    settings = [(split, f) for split, f in result.files.items() if result.triples.get(split, 1)]
    if result.record["format"] == "tsv":
        settings.append(("header", "false"))
    sets = " ".join(f"--set data.{k}={v}" for k, v in settings)
    return [
        "train on it: kgpipe train -c CONFIG " + sets,
        "or in the config:",
        "data:",
        *(f"  {k}: {v}" for k, v in settings),
    ]


def run(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from kgpipe.data.synth import SynthSpec, write_synth

    spec = SynthSpec(
        entities=args.entities,
        relations=args.relations,
        edges=args.edges,
        seed=args.seed,
        clusters=args.clusters,
        noise=args.noise,
        exponent=args.exponent,
        valid=args.valid,
        test=args.test,
    )
    live = console.is_terminal and not args.quiet
    bar = Progress(
        TextColumn("[bold]synth"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not live,
    )
    task = bar.add_task("edges", total=spec.edges)
    t0 = time.perf_counter()
    with bar, storage_errors(args.out, "write the graph"):
        result = write_synth(
            spec,
            args.out,
            fmt=args.format,
            chunk_edges=args.chunk_edges,
            overwrite=args.overwrite,
            progress=lambda done, total: bar.update(task, completed=done),
        )
    seconds = time.perf_counter() - t0
    if args.quiet:
        return 0
    parts = ", ".join(f"{s} {n:,}" for s, n in result.triples.items() if s in result.files)
    console.print(
        f"wrote {spec.edges:,} edges ({parts}) to {escape(result.url)} in {seconds:.1f} s "
        f"({spec.edges / max(seconds, 1e-9):,.0f} edges/s)",
        highlight=False,
        soft_wrap=True,
    )
    for split in result.files:
        if not result.triples[split]:
            console.print(f"note: {split} is empty: too few edges for its fraction")
    for line in training_lines(result):
        print(line)
    return 0
