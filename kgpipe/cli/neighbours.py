"""``kgpipe neighbours``: the entities nearest to one entity in embedding space."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from kgpipe.cli.arguments import (
    CHECKPOINT_HELP,
    PREFIX_HELP,
    checkpoint,
    positive_int,
    prefix,
    storage_errors,
    url,
)

if TYPE_CHECKING:
    from rich.console import Console

NAME = "neighbours"
HELP = "the entities nearest to an entity in embedding space"

METRIC_HELP = (
    "cosine (default): cosine similarity of the stored rows, higher is nearer; it ignores the "
    "rows' norms. model: the geometry of the model's score -- TransE: L_p distance ||a - b||_p "
    "(the run's model.p), RotatE: sum_k |a_k - b_k| over complex components (distances, lower "
    "is nearer); DistMult: dot product a.b, ComplEx: Re<a, conj(b)> (= the dot product of the "
    "stored [re|im] rows; higher is nearer, and large-norm entities come first)"
)


def add_arguments(n: argparse.ArgumentParser) -> None:
    n.add_argument("run", type=url, help="run folder URL")
    n.add_argument("--entity", required=True, help="entity label (forms: see --prefix)")
    n.add_argument("--top", type=positive_int, default=10, help="neighbours shown (default 10)")
    n.add_argument("--metric", choices=("cosine", "model"), default="cosine", help=METRIC_HELP)
    n.add_argument(
        "--prefix", type=prefix, action="append", default=[], metavar="NAME=NS", help=PREFIX_HELP
    )
    n.add_argument("--checkpoint", type=checkpoint, metavar="best|latest|N", help=CHECKPOINT_HELP)
    n.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape
    from rich.table import Table

    from kgpipe.cli.output import result_console
    from kgpipe.runs.neighbours import nearest_entities
    from kgpipe.runs.read import load_run

    with storage_errors(args.run, "read the run"):
        loaded = load_run(args.run, checkpoint=args.checkpoint)
    vocab = loaded.vocab
    entity = vocab.find_entity(args.entity, dict(args.prefix))
    found = nearest_entities(loaded.model, entity, args.top, measure=args.metric)
    key = "distance" if not found.higher_is_nearer else found.measure
    rows = [
        {"rank": i, "entity": vocab.entities[e], key: v}
        for i, (e, v) in enumerate(zip(found.ids, found.values, strict=True), 1)
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    order = "higher is nearer" if found.higher_is_nearer else "lower is nearer"
    table = Table(
        title=escape(f"top {len(rows)} neighbours of {vocab.entities[entity]}"),
        caption=f"{found.measure}: {order}",
    )
    table.add_column("#", justify="right")
    table.add_column("entity")
    table.add_column(found.measure, justify="right")
    for row in rows:
        table.add_row(str(row["rank"]), escape(str(row["entity"])), f"{row[key]:.4f}")
    result_console().print(table)
    return 0
