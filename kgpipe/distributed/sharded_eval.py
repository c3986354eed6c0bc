"""Filtered ranking over a sharded entity table: every rank scores the queries against its own
rows, and the counts are summed into the exact realistic ranks.

The query's anchor rows (``h`` of ``(h, r, ?)``, ``t`` of ``(?, r, t)``) are fetched from their
owners once per chunk (a few rows per query); the score matrix a rank computes is ``chunk x its
rows``, so memory per rank is bounded by its share of the entities. The counting is the same as
the range-split validation of a replicated gang (:func:`kgpipe.evaluation.split_block_ranks`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kgpipe.distributed.sharded import ShardedExchange
from kgpipe.evaluation import (
    FilterIndex,
    ProgressFn,
    sample_candidates,
    split_block_ranks,
    summarise,
)
from kgpipe.models.model import KGEModel

__all__ = ["evaluate_sharded"]


@torch.no_grad()
def evaluate_sharded(
    model: KGEModel,
    exchange: ShardedExchange,
    triples: Tensor,
    filter_index: FilterIndex,
    *,
    batch_size: int = 256,
    sampled: int | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Filtered metrics of ``triples`` on both sides, like :func:`~kgpipe.evaluation.evaluate`
    (``sampled``: against the target and the same ``sampled`` entities, those of one process);
    a collective: every rank of the gang calls it with the same triples."""
    triples = triples.long()
    locate = exchange.index.locate
    comm = exchange.comm
    # the validation's fetches are not the next epoch's training traffic
    counters = (comm.seconds, comm.bytes_sent, comm.calls)
    try:
        return _evaluate(
            model, exchange, triples, filter_index, batch_size, sampled, progress, locate
        )
    finally:
        comm.seconds, comm.bytes_sent, comm.calls = counters


def _evaluate(
    model: KGEModel,
    exchange: ShardedExchange,
    triples: Tensor,
    filter_index: FilterIndex,
    batch_size: int,
    sampled: int | None,
    progress: ProgressFn | None,
    locate: Any,
) -> dict[str, Any]:
    n = int(triples.shape[0])
    spec, inter = model.spec, model.interaction
    dev = model.entity.device
    exclude: Tensor | None = None
    candidates = "all"
    if sampled is not None:  # this rank's rows that are not in the sample
        sample = sample_candidates(spec.num_entities, sampled)
        chosen = torch.zeros(spec.num_entities, dtype=torch.bool)
        chosen[sample] = True
        exclude = (~chosen[exchange.own.cpu()]).to(dev)
        candidates = f"sampled-{int(sample.numel())}"

    ranks: dict[str, list[Tensor]] = {"head": [], "tail": []}
    done = 0
    for side in ("tail", "head"):
        for start in range(0, n, batch_size):
            chunk = triples[start : start + batch_size]
            h, r, t = chunk[:, 0], chunk[:, 1], chunk[:, 2]
            anchors, targets = (h, t) if side == "tail" else (t, h)
            ids, inv = torch.unique(anchors, return_inverse=True)
            rows = exchange.fetch(ids.to(dev))[inv.to(dev)]
            rd = r.to(dev)
            if side == "tail":
                block = inter.score_tails(rows, model.relation[rd], model.entity)
            elif spec.reciprocal:
                block = inter.score_tails(
                    rows, model.relation[rd + spec.num_relations], model.entity
                )
            else:
                block = inter.score_heads(model.relation[rd], rows, model.entity)
            f_rows, f_cols = filter_index.answers(side, anchors, r)
            got = split_block_ranks(
                block.float(), targets.to(dev), f_rows.to(dev), f_cols.to(dev), locate, exclude
            )
            ranks[side].append(got.cpu())
            done += int(chunk.shape[0])
            if progress is not None:
                progress(done, 2 * n)
    return summarise(ranks, n, candidates)
