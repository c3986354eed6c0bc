"""Filtered link-prediction evaluation (rank-based), computed in bounded-memory chunks.

Protocol (the standard one): for every evaluation triple ``(h, r, t)`` rank ``t`` among all
entities for the query ``(h, r, ?)`` and ``h`` for ``(?, r, t)``; every *other* entity that forms
a known true triple (train + valid + test) is removed from the candidates ("filtered"); ties get
the mean of the optimistic and pessimistic rank ("realistic" rank,
``1 + #{better} + #{equal}/2``). MRR, MR and Hits@k are averaged over both sides and reported
per side.

On the CPU, against more entities than a block (:data:`BLOCK`, 8,192), a chunk of queries is
scored one block of candidates at a time, and the better and equal candidates are counted per
block. The target's score is checked against its column in its block; where they differ
(another kernel, another rounding) that chunk and the rest are ranked on the whole matrix.
Peak memory: about ``batch_size x BLOCK x 4`` bytes of scores (``x num_entities`` on a fallback),
whatever the size of the evaluation set. A GPU scores the whole matrix (on an H100 blocks made
the FB15k-237 test 2x slower).

A *sampled* mode ranks each query against ``k`` random entities instead of all (not comparable
to published results; labelled ``"candidates": "sampled-k"``): a chunk is scored against the
sample and its own targets only, ``batch_size x (k + batch_size)`` scores. The OGB-style
protocol gives every query its own fixed candidates (:mod:`kgpipe.query_candidates`,
``"per-query-k"``).

*Split over the ranks of a gang* (``part=(rank, world)``, a process group initialised): each
rank scores every query against its own range of entity ids only, counts the better and equal
candidates there (after filtering), and one all-reduce sums the counts into the exact realistic
ranks; the target's score comes from the rank whose range holds it. Each rank computes and holds
``1 / world`` of the score matrix. The result equals the single-process one where a score does
not depend on how many candidates a matrix product computes at once (tested on the CPU; a GPU
library may sum in another order for another shape, which can move exact ties by half a rank).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kgpipe.models.model import KGEModel
from kgpipe.query_candidates import Candidates, count_better, lift_neg_inf, same_scores
from kgpipe.query_candidates import ranks as per_query_ranks

__all__ = [
    "FilterIndex",
    "ProgressFn",
    "evaluate",
    "rank_metrics",
    "realistic_ranks",
    "sample_candidates",
    "split_block_ranks",
    "summarise",
]

HITS_AT = (1, 3, 10)
#: candidates scored at once when ranking against all entities (a block of scores per chunk)
BLOCK = 1 << 13


@dataclass(frozen=True)
class FilterIndex:
    """Known true answers of every ``(anchor, relation)`` query, both sides, in sorted CSR form."""

    num_relations: int
    tail_keys: Tensor  # sorted keys h * R + r
    tails: Tensor  # answers aligned with tail_keys
    head_keys: Tensor  # sorted keys t * R + r
    heads: Tensor

    @classmethod
    def from_triples(cls, triples: Sequence[Tensor], num_relations: int) -> FilterIndex:
        """Index the union of the given ``(n, 3)`` triple sets. Each triple is packed into one
        ``int64`` key ``(h * R + r) * E + t`` where that cannot overflow: deduplicating and
        sorting one key holds a fraction of what a row-wise ``unique`` of ``(n, 3)`` does
        (2.2 GB at peak for 6M triples), and gives the same index."""
        parts = [t for t in triples if t.numel()]  # int32 or int64: widened a column at a time
        if not parts:
            empty = torch.zeros(0, dtype=torch.long)
            return cls(num_relations, empty, empty, empty, empty)
        span = max(int(torch.maximum(p[:, 0].max(), p[:, 2].max())) for p in parts) + 1
        packs = min(int(p.min()) for p in parts) >= 0 and all(
            int(p[:, 1].max()) < num_relations for p in parts
        )  # ids the key can hold, and no overflow
        if not packs or span * num_relations * span >= 1 << 63:  # the rows themselves
            known = torch.unique(torch.cat([p.long() for p in parts]), dim=0)
            h, r, t = known[:, 0], known[:, 1], known[:, 2]
            tk = h * num_relations + r
            to = torch.argsort(tk, stable=True)
            tail_keys, tails = tk[to], t[to]
            del to, tk
        else:  # one key per triple, sorted by (h, r, t) as the rows would be
            key = torch.unique(
                torch.cat(
                    [(p[:, 0].long() * num_relations + p[:, 1]) * span + p[:, 2] for p in parts]
                )
            )
            tail_keys, tails = key // span, key % span  # sorted by h * R + r, then t
            del key
            h, r = tail_keys // num_relations, tail_keys % num_relations
            t = tails
        hk = t * num_relations + r
        ho = torch.argsort(hk, stable=True)
        return cls(num_relations, tail_keys, tails, hk[ho], h[ho])

    def answers(self, side: str, anchors: Tensor, relations: Tensor) -> tuple[Tensor, Tensor]:
        """Pairs ``(query index, entity)`` of every known answer of each query."""
        keys, values = (
            (self.tail_keys, self.tails) if side == "tail" else (self.head_keys, self.heads)
        )
        q = anchors * self.num_relations + relations
        start = torch.searchsorted(keys, q, side="left")
        end = torch.searchsorted(keys, q, side="right")
        counts = end - start
        rows = torch.repeat_interleave(torch.arange(q.shape[0]), counts)
        offsets = torch.repeat_interleave(start - (torch.cumsum(counts, 0) - counts), counts)
        pos = offsets + torch.arange(rows.shape[0])
        return rows, values[pos]


def realistic_ranks(
    scores: Tensor,
    targets: Tensor,
    filter_rows: Tensor,
    filter_cols: Tensor,
    exclude: Tensor | None = None,
) -> Tensor:
    """Filtered realistic ranks ``(b,)`` of ``targets`` in ``scores`` ``(b, n)``.

    ``(filter_rows, filter_cols)`` are positions of known true answers; they (and the target
    itself) are excluded from the comparison, and so are the columns of ``exclude`` (a mask
    over the columns; after the target's score is read). ``scores`` is modified in place; the
    index tensors may live on another device than the scores (they are moved). A NaN score is
    counted against the answer, here and in every ranking (:func:`count_better`).
    """
    dev = scores.device
    targets, filter_rows, filter_cols = targets.to(dev), filter_rows.to(dev), filter_cols.to(dev)
    rows = torch.arange(scores.shape[0], device=dev)
    true = scores[rows, targets].clone()
    lift_neg_inf(scores, true, when=true)
    if exclude is not None:
        scores[:, exclude.to(dev)] = float("-inf")
    scores[filter_rows, filter_cols] = float("-inf")
    scores[rows, targets] = float("-inf")
    col = true.unsqueeze(1)
    better = count_better(scores, col)
    equal = (scores == col).sum(1)
    return 1.0 + better.double() + equal.double() / 2.0


def rank_metrics(ranks: Tensor) -> dict[str, float]:
    """MRR, MR and Hits@1/3/10 of (realistic) ranks."""
    ranks = ranks.double()
    if ranks.numel() == 0:
        return dict.fromkeys(["mrr", "mr", *(f"hits@{k}" for k in HITS_AT)], float("nan"))
    out = {"mrr": float((1.0 / ranks).mean()), "mr": float(ranks.mean())}
    for k in HITS_AT:
        out[f"hits@{k}"] = float((ranks <= k).double().mean())
    return out


ProgressFn = Callable[[int, int], None]


@torch.no_grad()
def evaluate(
    model: KGEModel,
    triples: Tensor,
    filter_index: FilterIndex,
    *,
    batch_size: int = 256,
    sampled: int | None = None,
    generator: torch.Generator | None = None,
    progress: ProgressFn | None = None,
    part: tuple[int, int] = (0, 1),
    candidates: Candidates | None = None,
) -> dict[str, Any]:
    """Filtered link-prediction metrics of ``triples`` ``(n, 3)`` on both sides.

    ``part``: ``(rank, world)`` of a gang whose every rank calls this with the same arguments
    (each scores its range of entities; see the module's notes). ``candidates``: rank each
    query against its own candidates (the OGB-style protocol) instead of all entities. Returns
    ``{"mrr", "mr", "hits@1", "hits@3", "hits@10", "head": {...}, "tail": {...}, "triples",
    "candidates"}``.
    """
    triples = triples.long()
    n = int(triples.shape[0])
    num_entities = model.spec.num_entities
    if part[1] > 1 and (sampled is not None or candidates is not None):
        raise ValueError("sampled and per-query evaluation are not split over ranks")
    if sampled is not None and candidates is not None:
        raise ValueError("choose sampled or per-query candidates, not both")
    sample = None if sampled is None else sample_candidates(num_entities, sampled, generator)
    ranks: dict[str, list[Tensor]] = {"head": [], "tail": []}
    done = 0
    total = 2 * n
    on_cpu = model.entity.device.type == "cpu"
    blocks = [on_cpu and sample is None and num_entities > BLOCK]  # off for good once it fails
    for side in ("tail", "head"):
        for start in range(0, n, batch_size):
            chunk = triples[start : start + batch_size]
            if candidates is not None:
                targets = chunk[:, 2] if side == "tail" else chunk[:, 0]
                drawn = candidates.draw(num_entities, side, targets, start)
                got = per_query_ranks(
                    model, side, chunk, filter_index, drawn, filtered=candidates.filtered
                )
            elif part[1] > 1:
                got = _split_ranks(model, side, chunk, filter_index, part)
            elif sample is not None:
                got = _sampled_ranks(model, side, chunk, filter_index, sample)
            else:
                got = _chunk_ranks(model, side, chunk, filter_index, blocks)
            ranks[side].append(got.cpu())
            done += int(chunk.shape[0])
            if progress is not None:
                progress(done, total)
    if candidates is not None:
        return summarise(ranks, n, candidates.label())
    return summarise(ranks, n, "all" if sample is None else f"sampled-{int(sample.numel())}")


def sample_candidates(
    num_entities: int, k: int, generator: torch.Generator | None = None
) -> Tensor:
    """The ``k`` entities every query of a sampled evaluation is ranked against (with its
    target): a seeded draw (seed 0 unless ``generator``), the same on every rank and call."""
    gen = generator or torch.Generator().manual_seed(0)
    return torch.randperm(num_entities, generator=gen)[: min(k, num_entities)]


def summarise(ranks: dict[str, list[Tensor]], triples: int, candidates: str) -> dict[str, Any]:
    """The metrics of each side's ranks and of both together (what :func:`evaluate` returns)."""
    head = torch.cat(ranks["head"]) if ranks["head"] else torch.zeros(0)
    tail = torch.cat(ranks["tail"]) if ranks["tail"] else torch.zeros(0)
    out: dict[str, Any] = rank_metrics(torch.cat((head, tail)))
    out["head"] = rank_metrics(head)
    out["tail"] = rank_metrics(tail)
    out["triples"] = triples
    out["candidates"] = candidates
    return out


def _scores(
    model: KGEModel, side: str, chunk: Tensor, candidates: slice | Tensor | None = None
) -> Tensor:
    dev = model.entity.device
    h, r, t = chunk[:, 0].to(dev), chunk[:, 1].to(dev), chunk[:, 2].to(dev)
    if side == "tail":
        return model.score_all_tails(h, r, candidates)
    return model.score_all_heads(r, t, candidates)


def _blocked_ranks(model: KGEModel, side: str, chunk: Tensor, index: FilterIndex) -> Tensor | None:
    """This chunk's realistic ranks against all entities, scored :data:`BLOCK` candidates at a
    time (cache-sized blocks, not passes over a ``(b, entities)`` matrix). The target's score
    comes from a product against the targets' rows, checked against its column of its block:
    ``None`` (the caller then scores the whole matrix) wherever they differ. The ranks equal
    :func:`realistic_ranks` on the whole matrix where a block's products round like it (the
    CPU kernels do: tested against brute force; a GPU library may pick a kernel per shape)."""
    dev = model.entity.device
    n = model.spec.num_entities
    targets = (chunk[:, 2] if side == "tail" else chunk[:, 0]).to(dev)
    anchors = chunk[:, 0] if side == "tail" else chunk[:, 2]
    b = chunk.shape[0]
    rows = torch.arange(b, device=dev)
    true = torch.cat([  # (b, BLOCK) products, as the blocks: no (b, b) one (1.5 GiB at b=20k)
        _scores(model, side, chunk, targets[lo : lo + BLOCK]).diagonal(-lo)
        for lo in range(0, b, BLOCK)
    ])  # fmt: skip
    lift = lift_neg_inf(true, when=true)  # an answer at -inf: every block lifted alike
    col = true.unsqueeze(1)
    f_rows, f_cols = index.answers(side, anchors, chunk[:, 1])
    order = torch.argsort(f_cols)
    f_rows, f_cols = f_rows[order].to(dev), f_cols[order].to(dev)
    starts = torch.arange(0, n + BLOCK, BLOCK, device=dev).clamp_(max=n)
    bounds = torch.searchsorted(f_cols, starts).tolist()
    better = torch.zeros(b, dtype=torch.long, device=dev)
    equal = torch.zeros(b, dtype=torch.long, device=dev)
    for k, lo in enumerate(range(0, n, BLOCK)):
        hi = min(lo + BLOCK, n)
        block = _scores(model, side, chunk, slice(lo, hi))
        lift_neg_inf(block, when=lift)
        here = (targets >= lo) & (targets < hi)
        mine, cols = rows[here], targets[here] - lo
        if not same_scores(block[mine, cols], true[mine]):
            return None  # another kernel, another rounding: count against the block's own
        a, z = bounds[k], bounds[k + 1]
        block[f_rows[a:z], f_cols[a:z] - lo] = float("-inf")
        block[mine, cols] = float("-inf")
        better += count_better(block, col)
        equal += (block == col).sum(1)
    return 1.0 + better.double() + equal.double() / 2.0


def _chunk_ranks(
    model: KGEModel,
    side: str,
    chunk: Tensor,
    index: FilterIndex,
    blocks: list[bool],
) -> Tensor:
    """This chunk's realistic ranks on ``side`` against all entities; in blocks while
    ``blocks[0]`` (cleared when a chunk falls back to the whole matrix)."""
    if blocks[0]:
        got = _blocked_ranks(model, side, chunk, index)
        if got is not None:
            return got
        blocks[0] = False  # this device rounds the small product differently: not again
    device = model.entity.device
    h, r, t = chunk[:, 0], chunk[:, 1], chunk[:, 2]
    if side == "tail":
        anchors, targets = h, t
        scores = model.score_all_tails(h.to(device), r.to(device))
    else:
        anchors, targets = t, h
        scores = model.score_all_heads(r.to(device), t.to(device))
    f_rows, f_cols = index.answers(side, anchors, r)
    return realistic_ranks(scores, targets, f_rows, f_cols)


def _sampled_ranks(
    model: KGEModel, side: str, chunk: Tensor, index: FilterIndex, sample: Tensor
) -> Tensor:
    """This chunk's realistic ranks against the ``sample``: the chunk is scored against the
    sample and its targets (read from the same product), and the targets that are not in the
    sample are no candidates."""
    dev = model.entity.device
    anchors, targets = (chunk[:, 0], chunk[:, 2]) if side == "tail" else (chunk[:, 2], chunk[:, 0])
    sample, targets = sample.to(dev), targets.to(dev).contiguous()
    cols = torch.unique(torch.cat((sample, targets)))  # sorted: a column's id by search
    scores = _scores(model, side, chunk, cols)
    f_rows, f_cols = index.answers(side, anchors, chunk[:, 1])
    f_rows, f_cols = f_rows.to(dev), f_cols.to(dev)
    at = torch.searchsorted(cols, f_cols).clamp_(max=cols.numel() - 1)
    scored = cols[at] == f_cols  # known answers outside the columns need no mask
    tcols = torch.searchsorted(cols, targets)
    return realistic_ranks(scores, tcols, f_rows[scored], at[scored], ~torch.isin(cols, sample))


def _split_ranks(
    model: KGEModel, side: str, chunk: Tensor, index: FilterIndex, part: tuple[int, int]
) -> Tensor:
    """This chunk's realistic ranks, each rank of the gang scoring its range of entities."""
    rank, world = part
    n = model.spec.num_entities
    lo, hi = n * rank // world, n * (rank + 1) // world
    dev = model.entity.device
    h, r, t = chunk[:, 0], chunk[:, 1], chunk[:, 2]
    anchors, targets = (h, t) if side == "tail" else (t, h)
    if hi == lo:  # more ranks than entities: nothing to score here, the collectives still run
        block = torch.zeros((chunk.shape[0], 0), dtype=model.entity.dtype, device=dev)
    elif side == "tail":
        block = model.score_all_tails(h.to(dev), r.to(dev), slice(lo, hi))
    else:
        block = model.score_all_heads(r.to(dev), t.to(dev), slice(lo, hi))
    f_rows, f_cols = index.answers(side, anchors, r)

    def locate(ids: Tensor) -> tuple[Tensor, Tensor]:
        return (ids >= lo) & (ids < hi), ids - lo

    return split_block_ranks(block, targets.to(dev), f_rows.to(dev), f_cols.to(dev), locate)


def split_block_ranks(
    block: Tensor,
    targets: Tensor,
    f_rows: Tensor,
    f_cols: Tensor,
    locate: Callable[[Tensor], tuple[Tensor, Tensor]],
    exclude: Tensor | None = None,
) -> Tensor:
    """Realistic ranks from every rank's ``block`` of scores ``(b, its candidates)``: the
    target's score comes from the rank holding it, the better and equal counts (after
    filtering) are summed over the ranks. ``locate(ids)`` says which entity ids are this rank's
    candidates and at which column; ``exclude`` (a mask over the block's columns) takes columns
    out of the candidates after the target's score is read. A collective: every rank calls it
    for the same queries."""
    import torch.distributed as dist

    dev = block.device
    rows = torch.arange(block.shape[0], device=dev)
    own, cols = locate(targets)
    mine, cols = rows[own], cols[own]
    true = torch.zeros(block.shape[0], dtype=block.dtype, device=dev)
    true[mine] = block[mine, cols]  # the target's score, from the rank that has its entity
    dist.all_reduce(true)  # one value and zeros: the sum is that value, exactly
    lift_neg_inf(block, true, when=true)  # the same on every rank (true is reduced)
    if exclude is not None:  # columns that are not candidates (a sampled evaluation)
        block[:, exclude] = float("-inf")
    keep, f_pos = locate(f_cols)
    block[f_rows[keep], f_pos[keep]] = float("-inf")
    block[mine, cols] = float("-inf")
    col = true.unsqueeze(1)
    counts = torch.stack((count_better(block, col), (block == col).sum(1)))
    dist.all_reduce(counts)
    return 1.0 + counts[0].double() + counts[1].double() / 2.0
