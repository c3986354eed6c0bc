"""Filtered ranking over a sharded entity table: every rank scores the queries against its own
rows, and the counts are summed into the exact realistic ranks.

The query's anchor rows (``h`` of ``(h, r, ?)``, ``t`` of ``(?, r, t)``) are fetched from their
owners once per chunk (a few rows per query); the score matrix a rank computes is ``chunk x its
rows``, so memory per rank is bounded by its share of the entities. The counting is the same as
the range-split validation of a replicated gang (:func:`kgpipe.evaluation.split_block_ranks`).

Per-query candidates (the OGB-style protocol, :mod:`kgpipe.query_candidates`): every rank draws
the same candidates, scores the pairs whose candidate row it owns, and the answer's score (from
its owner) and the better and equal counts are summed over the ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
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
from kgpipe.query_candidates import (
    PAIRS,
    QueryCandidates,
    count_ranks,
    known_mask,
    pair_scores,
)

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
    candidates: QueryCandidates | None = None,
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
        if candidates is not None:
            return _per_query(
                model, exchange, triples, filter_index, batch_size, candidates, progress
            )
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
    for side, _start, r, anchors, targets, rows in _queries(
        exchange, triples, batch_size, dev, progress
    ):
        rd = r.to(dev)
        if side == "tail":
            block = inter.score_tails(rows, model.relation[rd], model.entity)
        elif spec.reciprocal:
            block = inter.score_tails(rows, model.relation[rd + spec.num_relations], model.entity)
        else:
            block = inter.score_heads(model.relation[rd], rows, model.entity)
        f_rows, f_cols = filter_index.answers(side, anchors, r)
        got = split_block_ranks(
            block.float(), targets.to(dev), f_rows.to(dev), f_cols.to(dev), locate, exclude
        )
        ranks[side].append(got.cpu())
    return summarise(ranks, n, candidates)


def _per_query(
    model: KGEModel,
    exchange: ShardedExchange,
    triples: Tensor,
    filter_index: FilterIndex,
    batch_size: int,
    candidates: QueryCandidates,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    import torch.distributed as dist

    n = int(triples.shape[0])
    num_entities = model.spec.num_entities
    dev = model.entity.device
    ranks: dict[str, list[Tensor]] = {"head": [], "tail": []}
    for side, start, r, anchors, targets, rows in _queries(
        exchange, triples, batch_size, dev, progress
    ):
        drawn = candidates.draw(num_entities, side, targets, start)
        ids = torch.cat((targets.unsqueeze(1), drawn), 1).to(dev)
        b, c = ids.shape
        own, pos = exchange.index.locate(ids.reshape(-1))
        pairs = own.nonzero().squeeze(1)
        rd = r.to(dev)
        scores = torch.zeros(b * c, dtype=torch.float32, device=dev)
        for lo in range(0, int(pairs.numel()), PAIRS):  # bounded gathers, as in one process
            some = pairs[lo : lo + PAIRS]
            query = some // c
            got = pair_scores(model, side, rows[query], rd[query], model.entity[pos[some]])
            scores[some] = got.float()
        scores = scores.view(b, c)
        owned = own.view(b, c)
        true = torch.where(owned[:, 0], scores[:, 0], torch.zeros_like(scores[:, 0]))
        dist.all_reduce(true)  # one value and zeros: the sum is that value, exactly
        scores[:, 0] = true
        known = known_mask(filter_index, side, anchors, r, drawn, num_entities).to(dev)
        better, equal = count_ranks(scores, known | ~owned[:, 1:])
        counts = torch.stack((better, equal))
        dist.all_reduce(counts)
        ranks[side].append((1.0 + counts[0].double() + counts[1].double() / 2.0).cpu())
    return summarise(ranks, n, candidates.label())


def _queries(
    exchange: ShardedExchange,
    triples: Tensor,
    batch_size: int,
    dev: torch.device,
    progress: ProgressFn | None,
) -> Iterator[tuple[str, int, Tensor, Tensor, Tensor, Tensor]]:
    """Each chunk of queries, tail side then head side: ``(side, start, relations, anchors,
    targets, the anchors' rows)``, the rows fetched from their owners (a collective: every
    rank iterates the same chunks); ``progress`` after each chunk."""
    n = int(triples.shape[0])
    done = 0
    for side in ("tail", "head"):
        for start in range(0, n, batch_size):
            chunk = triples[start : start + batch_size]
            h, r, t = chunk[:, 0], chunk[:, 1], chunk[:, 2]
            anchors, targets = (h, t) if side == "tail" else (t, h)
            ids, inv = torch.unique(anchors, return_inverse=True)
            rows = exchange.fetch(ids.to(dev))[inv.to(dev)]
            yield side, start, r, anchors, targets, rows
            done += int(chunk.shape[0])
            if progress is not None:
                progress(done, 2 * n)
