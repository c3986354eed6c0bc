"""``kgpipe predict``: the top-scored tails of (head, relation, ?) or heads of (?, relation, tail)."""

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
from kgpipe.errors import KgpipeError

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from kgpipe.data.vocab import Vocabulary

NAME = "predict"
HELP = "top-scored tails (--head) or heads (--tail)"


def add_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("run", type=url, help="run folder URL")
    q.add_argument("--head", help="head entity label: predict tails (forms: see --prefix)")
    q.add_argument("--tail", help="tail entity label: predict heads (forms: see --prefix)")
    q.add_argument("--relation", required=True, help="relation label (forms: see --prefix)")
    q.add_argument("--top", type=positive_int, default=10, help="answers shown (default 10)")
    q.add_argument(
        "--filter-known",
        action="store_true",
        help="leave out answers already in the graph (the run's train, valid and test triples)",
    )
    q.add_argument("--no-known", action="store_true", help="do not mark triples seen in train")
    q.add_argument(
        "--prefix", type=prefix, action="append", default=[], metavar="NAME=NS", help=PREFIX_HELP
    )
    q.add_argument("--checkpoint", type=checkpoint, metavar="best|latest|N", help=CHECKPOINT_HELP)
    q.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, console: Console) -> int:
    import torch
    from rich.markup import escape
    from rich.table import Table

    from kgpipe.cli.output import result_console
    from kgpipe.data.vocab import Vocabulary
    from kgpipe.export_shards import ShardedEmbeddings
    from kgpipe.runs.folder import EMBEDDINGS, VOCAB
    from kgpipe.runs.read import (
        check_not_trimmed,
        final_model,
        known_triples,
        load_run,
        open_run,
    )

    if (args.head is None) == (args.tail is None):
        raise KgpipeError(
            "give exactly one of --head (to predict tails) or --tail (to predict heads)"
        )
    with storage_errors(args.run, "read the run"):
        sharded, model = None, None
        if args.checkpoint is not None:  # the committed checkpoint asked for
            loaded = load_run(args.run, checkpoint=args.checkpoint)
            store, vocab, model = loaded.store, loaded.vocab, loaded.model
        else:  # a sharded run's export is read part by part; others read the model file
            store, config = open_run(args.run)
            check_not_trimmed(store)
            vocab = Vocabulary.read(store.url_of(VOCAB))
            sharded = ShardedEmbeddings.open(store.url_of(EMBEDDINGS))
            model = None if sharded is not None else final_model(store, config)
    prefixes = dict(args.prefix)
    rel = vocab.find_relation(args.relation, prefixes)
    if args.head is not None:
        anchor_id = vocab.find_entity(args.head, prefixes)
        side, col, other = "tail", 2, 0
        query = f"({vocab.entities[anchor_id]}, {vocab.relations[rel]}, ?)"
    else:
        anchor_id = vocab.find_entity(args.tail, prefixes)
        side, col, other = "head", 0, 2
        query = f"(?, {vocab.relations[rel]}, {vocab.entities[anchor_id]})"

    def answers(triples: torch.Tensor) -> set[int]:
        mask = (triples[:, 1] == rel) & (triples[:, other] == anchor_id)
        return set(triples[mask, col].tolist())

    in_train: set[int] = set()
    known: set[int] = set()
    if args.filter_known or not args.no_known:
        with storage_errors(args.run, "read the run's staged triples"):
            staged = known_triples(store)
        in_train = answers(staged[0])
        if args.filter_known:
            known = set().union(*(answers(t) for t in staged))
        for what in _untrained(staged[0], anchor_id, rel, vocab):
            console.print(
                f"[yellow]warning:[/] {escape(what)} is in none of the run's training triples "
                "(only in valid or test, kept by data.unseen: keep): its embedding was never "
                "trained, so these scores mean nothing",
                highlight=False,
                soft_wrap=True,
            )
    if sharded is not None:
        with storage_errors(args.run, "read the run's embeddings"):
            values, indices = sharded.top(anchor_id, rel, side, args.top, known)
    else:
        assert model is not None
        a, r = torch.tensor([anchor_id]), torch.tensor([rel])
        scores = (
            model.score_all_tails(a, r)[0] if side == "tail" else model.score_all_heads(r, a)[0]
        )
        if known:
            scores[list(known)] = float("-inf")
        top = torch.topk(scores, min(args.top, scores.numel() - len(known)))
        values, indices = top.values.tolist(), top.indices.tolist()
    title = f"top {args.top} {side}s for {query}"
    if args.filter_known:
        title += f", {len(known)} known left out"
    table = Table(title=escape(title))  # labels are text, not rich markup: "x[/y]"
    table.add_column("#", justify="right")
    table.add_column(side)
    table.add_column("score", justify="right")
    marked = not args.no_known and not args.filter_known  # filtered: none is in train
    if marked:
        table.add_column("in train")
    rows: list[dict[str, object]] = []
    for i, (s, e) in enumerate(zip(values, indices, strict=True), 1):
        label = vocab.entities[e]
        rows.append({"rank": i, side: label, "score": s})
        if marked or args.filter_known:  # looked up (--no-known read nothing: false is a guess)
            rows[-1]["known"] = e in in_train
        table.add_row(
            str(i), escape(label), f"{s:.4f}", *(["yes" if e in in_train else ""] * marked)
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        result_console().print(table)
    return 0


def _untrained(train: torch.Tensor, entity: int, relation: int, vocab: Vocabulary) -> list[str]:
    """The query's entity and relation where no training triple holds them: their rows are the
    model's initial values (valid and test terms are in the vocabulary under
    ``data.unseen: keep``, the default)."""
    out = []
    if not bool(((train[:, 0] == entity) | (train[:, 2] == entity)).any()):
        out.append(f"entity {vocab.entities[entity]!r}")
    if not bool((train[:, 1] == relation).any()):
        out.append(f"relation {vocab.relations[relation]!r}")
    return out
