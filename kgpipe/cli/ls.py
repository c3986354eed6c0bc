"""``kgpipe ls``: every registry -- the names a config may use -- with one line on each."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from kgpipe.cli.orchestrators import GROUP, NONE, orchestrator_names

if TYPE_CHECKING:
    from rich.console import Console

    from kgpipe.registry import Registry

NAME = "ls"
HELP = "list the registered models, losses, modes, optimisers, schedules, formats, clusters, ..."


def registries() -> tuple[tuple[str, Registry[Any]], ...]:
    """Every registry of the library, with the config key that names its entries (imported
    when asked for: they import torch)."""
    from kgpipe.data.formats import FORMATS
    from kgpipe.distributed.clusters import CLUSTERS
    from kgpipe.models.interactions import INTERACTIONS
    from kgpipe.training.losses import LOSSES
    from kgpipe.training.optim import OPTIMIZERS
    from kgpipe.training.regularizers import REGULARIZERS
    from kgpipe.training.schedules import SCHEDULES
    from kgpipe.training.steps import STEPS

    return (
        ("model.name", INTERACTIONS),
        ("training.mode", STEPS),
        ("training.loss", LOSSES),
        ("training.optimizer", OPTIMIZERS),
        ("training.schedule", SCHEDULES),
        ("model.regularizer.type", REGULARIZERS),
        ("data.format", FORMATS),
        ("distributed.cluster", CLUSTERS),
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def listing() -> dict[str, dict[str, str]]:
    """``{config key: {name: description}}`` of every registry, and the orchestrators."""
    out = {key: {n: reg.describe(n) for n in reg} for key, reg in registries()}
    out["kgpipe train --orchestrator"] = {
        n: "the plain library loop in this process" if n == NONE else f"entry point ({GROUP})"
        for n in orchestrator_names()
    }
    return out


def run(args: argparse.Namespace, console: Console) -> int:
    data = listing()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    out = Console()  # a listing goes to stdout (the console of progress and errors is stderr)
    for key, entries in data.items():
        table = Table(title=key, title_justify="left", show_header=False, box=None)
        table.add_column("name", style="bold")
        table.add_column("description")
        for name, doc in entries.items():
            table.add_row(name, doc)
        out.print(table)
        out.print()
    return 0
