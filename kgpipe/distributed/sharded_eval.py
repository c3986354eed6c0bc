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
    BLOCK,
    FilterIndex,
    ProgressFn,
    sample_candidates,
    split_block_ranks,
    summarise,
)
from kgpipe.models.model import KGEModel
from kgpipe.query_candidates import (
    PAIRS,
    Candidates,
    count_better,
    count_ranks,
    known_mask,
    lift_neg_inf,
    pair_scores,
    same_scores,
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
    candidates: Candidates | None = None,
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
    spec = model.spec
    dev = model.entity.device
    in_sample: Tensor | None = None
    candidates = "all"
    if sampled is not None:  # which of this rank's rows are in the sample
        sample = sample_candidates(spec.num_entities, sampled)
        chosen = torch.zeros(spec.num_entities, dtype=torch.bool)
        chosen[sample] = True
        in_sample = chosen[exchange.own.cpu()].to(dev)
        candidates = f"sampled-{int(sample.numel())}"

    ranks: dict[str, list[Tensor]] = {"head": [], "tail": []}
    # as one process counts on the CPU; off for good once a chunk's check failed (every rank
    # learns it from the same all-reduce, so all of them stop trying together)
    blocks = in_sample is None and dev.type == "cpu"
    for side, _start, r, anchors, targets, rows in _queries(
        exchange, triples, batch_size, dev, progress
    ):
        rd = r.to(dev)
        f_rows, f_cols = filter_index.answers(side, anchors, r)
        f_rows, f_cols, targets = f_rows.to(dev), f_cols.to(dev), targets.to(dev)
        got = None
        if in_sample is not None:
            got = _sampled_ranks(model, side, rows, rd, targets, f_rows, f_cols, locate, in_sample)
        elif blocks:
            got = _blocked_ranks(model, side, rows, rd, targets, f_rows, f_cols, locate)
            blocks = got is not None
        if got is None:  # the whole (chunk x own rows) matrix
            block = _scores(model, side, rows, rd, model.entity)
            got = split_block_ranks(block.float(), targets, f_rows, f_cols, locate)
        ranks[side].append(got.cpu())
    return summarise(ranks, n, candidates)


def _scores(model: KGEModel, side: str, rows: Tensor, rd: Tensor, table: Tensor) -> Tensor:
    """Scores ``(queries, table rows)`` of the queries whose anchors' rows are ``rows``."""
    spec, inter = model.spec, model.interaction
    if side == "tail":
        return inter.score_tails(rows, model.relation[rd], table)
    if spec.reciprocal:
        return inter.score_tails(rows, model.relation[rd + spec.num_relations], table)
    return inter.score_heads(model.relation[rd], rows, table)


def _sampled_ranks(
    model: KGEModel,
    side: str,
    rows: Tensor,
    rd: Tensor,
    targets: Tensor,
    f_rows: Tensor,
    f_cols: Tensor,
    locate: Any,
    in_sample: Tensor,
) -> Tensor:
    """The chunk's ranks against the sample, as one process ranks them: each rank scores its
    rows that are in the sample or a target of the chunk (the target's score is read from its
    owner's product, then the targets outside the sample are no candidates). A collective."""
    own, local = locate(targets)
    cols = torch.unique(torch.cat((in_sample.nonzero().squeeze(1), local[own])))  # local rows
    if cols.numel():
        block = _scores(model, side, rows, rd, model.entity[cols]).float()
    else:  # none of the sample's or targets' rows here: the collectives still run
        block = torch.zeros((rows.shape[0], 0), dtype=torch.float32, device=rows.device)

    def columns(ids: Tensor) -> tuple[Tensor, Tensor]:  # (scored here, column)
        held, at = locate(ids)
        if not cols.numel():
            return torch.zeros_like(held), at
        pos = torch.searchsorted(cols, at.contiguous()).clamp_(max=cols.numel() - 1)
        return held & (cols[pos] == at), pos

    return split_block_ranks(block, targets, f_rows, f_cols, columns, ~in_sample[cols])


def _blocked_ranks(
    model: KGEModel,
    side: str,
    rows: Tensor,
    rd: Tensor,
    targets: Tensor,
    f_rows: Tensor,
    f_cols: Tensor,
    locate: Any,
) -> Tensor | None:
    """The chunk's ranks counted :data:`~kgpipe.evaluation.BLOCK` of this rank's rows at a time
    (cache-sized passes instead of passes over a ``(chunk, own rows)`` matrix), as one process
    counts on the CPU: the target's score from a small product on the rank that owns it, checked
    against its column of the block. A collective; None on every rank (each then scores its
    whole matrix) where any rank's check failed (a kernel that rounds another way)."""
    import torch.distributed as dist

    dev = rows.device
    b = rows.shape[0]
    own, cols = locate(targets)
    mine, tcols = torch.arange(b, device=dev)[own], cols[own]
    true = torch.zeros(b, dtype=torch.float32, device=dev)
    # every query against the targets it holds (the blocks' row count), BLOCK targets at a
    # time: no (b, targets) matrix
    for lo in range(0, int(mine.numel()), BLOCK):
        some = mine[lo : lo + BLOCK]
        small = _scores(model, side, rows, rd, model.entity[tcols[lo : lo + BLOCK]]).float()
        true[some] = small[some, torch.arange(some.numel(), device=dev)]
    dist.all_reduce(true)  # one value and zeros: the sum is that value, exactly
    lift = lift_neg_inf(true, when=true)  # an answer at -inf: every block lifted alike
    col = true.unsqueeze(1)
    keep, f_pos = locate(f_cols)
    f_rows, f_pos = f_rows[keep], f_pos[keep]
    order = torch.argsort(f_pos)
    f_rows, f_pos = f_rows[order], f_pos[order]
    n = int(model.entity.shape[0])
    starts = torch.arange(0, n + BLOCK, BLOCK, device=dev).clamp_(max=n)
    bounds = torch.searchsorted(f_pos, starts).tolist()
    counts = torch.zeros(3, b, dtype=torch.long, device=dev)  # better, equal, check failed
    for k, lo in enumerate(range(0, n, BLOCK)):
        hi = min(lo + BLOCK, n)
        block = _scores(model, side, rows, rd, model.entity[lo:hi]).float()
        lift_neg_inf(block, when=lift)
        here = (tcols >= lo) & (tcols < hi)
        m_rows, m_cols = mine[here], tcols[here] - lo
        if not same_scores(block[m_rows, m_cols], true[m_rows]):
            counts[2] = 1
            break
        a, z = bounds[k], bounds[k + 1]
        block[f_rows[a:z], f_pos[a:z] - lo] = float("-inf")
        block[m_rows, m_cols] = float("-inf")
        counts[0] += count_better(block, col)
        counts[1] += (block == col).sum(1)
    dist.all_reduce(counts)
    if bool(counts[2].any()):
        return None
    return 1.0 + counts[0].double() + counts[1].double() / 2.0


def _per_query(
    model: KGEModel,
    exchange: ShardedExchange,
    triples: Tensor,
    filter_index: FilterIndex,
    batch_size: int,
    candidates: Candidates,
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
        if candidates.filtered:
            known = known_mask(filter_index, side, anchors, r, drawn, num_entities).to(dev)
        else:
            known = torch.zeros(drawn.shape, dtype=torch.bool, device=dev)
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
