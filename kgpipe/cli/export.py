"""``kgpipe export``: a run's embeddings as Parquet or NumPy files at any URL."""

from __future__ import annotations

import argparse

from rich.console import Console

from kgpipe.export import export_embeddings
from kgpipe.runs.read import load_run

NAME = "export"
HELP = "export embeddings"


def add_arguments(x: argparse.ArgumentParser) -> None:
    x.add_argument("run", help="run folder URL")
    x.add_argument("--format", choices=("parquet", "npy"), default="parquet")
    x.add_argument("--out", required=True, help="output folder URL")


def run(args: argparse.Namespace, console: Console) -> int:
    loaded = load_run(args.run)
    for url in export_embeddings(loaded.model, loaded.vocab, args.out, fmt=args.format):
        console.print(url)
    return 0
