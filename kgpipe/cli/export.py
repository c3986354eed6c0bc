"""``kgpipe export``: a run's embeddings as Parquet or NumPy files at any URL."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kgpipe.cli.arguments import CHECKPOINT_HELP, checkpoint, storage_errors, url

if TYPE_CHECKING:
    from rich.console import Console

NAME = "export"
HELP = "export embeddings"


def add_arguments(x: argparse.ArgumentParser) -> None:
    x.add_argument("run", type=url, help="run folder URL")
    x.add_argument(
        "--format", choices=("parquet", "npy"), default="parquet", help="default: parquet"
    )
    x.add_argument("--out", type=url, required=True, help="output folder URL")
    x.add_argument("--checkpoint", type=checkpoint, metavar="best|latest|N", help=CHECKPOINT_HELP)


def run(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from kgpipe.export import export_embeddings
    from kgpipe.runs.read import load_run

    with storage_errors(args.run, "read the run"):
        loaded = load_run(args.run, checkpoint=args.checkpoint)
    if loaded.checkpoint is not None:
        console.print(f"the model of the checkpoint of epoch {loaded.checkpoint.epoch}")
    with storage_errors(args.out, "write the export"):
        written = export_embeddings(loaded.model, loaded.vocab, args.out, fmt=args.format)
    for written_url in written:
        console.print(escape(written_url), highlight=False)
    return 0
