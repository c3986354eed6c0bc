"""``kgpipe predict``: the top-scored tails of (head, relation, ?) or heads of (?, relation, tail)."""

from __future__ import annotations

import argparse
import json

import torch
from rich.console import Console
from rich.table import Table

from kgpipe.data.dataset import load_dataset
from kgpipe.errors import KgpipeError
from kgpipe.runs.read import load_run

NAME = "predict"
HELP = "top-scored tails (--head) or heads (--tail)"


def add_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("run", help="run folder URL")
    q.add_argument("--head", help="head entity label: predict tails")
    q.add_argument("--tail", help="tail entity label: predict heads")
    q.add_argument("--relation", required=True, help="relation label")
    q.add_argument("--top", type=int, default=10)
    q.add_argument("--no-known", action="store_true", help="do not mark triples seen in train")
    q.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, console: Console) -> int:
    if (args.head is None) == (args.tail is None):
        raise KgpipeError(
            "give exactly one of --head (to predict tails) or --tail (to predict heads)"
        )
    loaded = load_run(args.run)
    vocab, model = loaded.vocab, loaded.model
    r = torch.tensor([vocab.relation_id(args.relation)])
    if args.head is not None:
        anchor = torch.tensor([vocab.entity_id(args.head)])
        scores = model.score_all_tails(anchor, r)[0]
        known_col = 2
    else:
        anchor = torch.tensor([vocab.entity_id(args.tail)])
        scores = model.score_all_heads(r, anchor)[0]
        known_col = 0
    known: set[int] = set()
    if not args.no_known:
        train = load_dataset(loaded.config.data).train
        other = 0 if known_col == 2 else 2
        mask = (train[:, 1] == r) & (train[:, other] == anchor)
        known = set(train[mask, known_col].tolist())
    top = torch.topk(scores, min(args.top, scores.numel()))
    side = "tail" if args.head is not None else "head"
    query = (
        f"({args.head}, {args.relation}, ?)"
        if args.head is not None
        else f"(?, {args.relation}, {args.tail})"
    )
    table = Table(title=f"top {args.top} {side}s for {query}")
    table.add_column("#", justify="right")
    table.add_column(side)
    table.add_column("score", justify="right")
    table.add_column("in train")
    rows = []
    for i, (s, e) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True), 1):
        label = vocab.entities[e]
        rows.append({"rank": i, side: label, "score": s, "known": e in known})
        table.add_row(str(i), label, f"{s:.4f}", "yes" if e in known else "")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        console.print(table)
    return 0
