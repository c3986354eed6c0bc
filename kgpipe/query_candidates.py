"""OGB-style evaluation: each query's answer ranked against its own fixed set of candidates.

Ranking against every entity is exact but costs ``queries x entities`` scores. On graphs of
millions of entities the Open Graph Benchmark's link-prediction tasks (ogbl-wikikg2, ogbl-biokg)
rank each answer against a fixed set of sampled candidates instead. Here:

- each query (a triple of the split, and a side) gets ``k`` candidates drawn uniformly, with
  replacement, from the entities other than its answer, by a generator seeded with ``seed``,
  the split, the side and the triple's position in the split: the same set at every
  validation, in every run with the same seed, whatever the batch size or the number of ranks;
- a candidate that forms a known true triple (train, valid or test) is filtered out, as in the
  full protocol; ties get the realistic rank, ``1 + #better + #equal / 2``;
- every score, the answer's included, is the same pairwise computation
  (``Interaction.score`` on gathered rows, at most :data:`PAIRS` pairs at once), so ties are
  exact, and a sharded gang, whose ranks each score the candidates whose rows they own, counts
  exactly what one process counts. That rests on a pair's score not depending on how many pairs
  one call scores: true of the CPU's row-wise sums (tested, ties included), and of an H100's
  (``bench/gpu_candidates.py``: the same ranks at 3 batch and 3 pair-group sizes, every
  interaction, ties included). The GPU's ranks are not the CPU's to the bit: another library
  rounds differently (0-2 of 4,000 ranks differed).

The numbers are higher than, and not comparable with, ranking against all entities; results
name the protocol (``"candidates": "per-query-k"``).

:class:`FileCandidates` takes each query's candidates from the graph's own files instead (OGB's
``head_neg``/``tail_neg`` arrays, ``data.candidates``), mapped to ids by staging: labelled
``"files-k"``, and not filtered unless asked (OGB's evaluator does not filter). A candidate
that is the answer itself then ties with it (half a place), as in OGB's evaluator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from kgpipe.config import RunConfig
    from kgpipe.models.model import KGEModel

__all__ = [
    "PAIRS",
    "Candidates",
    "FileCandidates",
    "QueryCandidates",
    "count_better",
    "count_ranks",
    "known_mask",
    "lift_neg_inf",
    "pair_scores",
    "ranks",
    "same_scores",
]

#: triples of a split per generator stream (the draws do not depend on the batch size); a
#: chunk draws at most this many rows more than it needs
GROUP = 64
#: (query, candidate) pairs scored at once: bounds the gathered rows to PAIRS x dim floats each
PAIRS = 1 << 15


class FilterIndex(Protocol):
    """The known answers of queries (:class:`kgpipe.evaluation.FilterIndex`)."""

    def answers(self, side: str, anchors: Tensor, relations: Tensor) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class QueryCandidates:
    """``k`` candidates per query of ``split``, drawn from ``seed``."""

    k: int
    seed: int = 0
    split: str = "valid"
    #: candidates that form a known true triple do not count
    filtered = True

    @classmethod
    def from_config(cls, config: RunConfig, split: str) -> QueryCandidates | None:
        ev = config.evaluation
        return None if ev.candidates is None else cls(ev.candidates, ev.candidates_seed, split)

    def label(self) -> str:
        return f"per-query-{self.k}"

    @staticmethod
    def too_many(k: int, num_entities: int) -> str | None:
        """Why ``k`` candidates a query cannot be drawn from ``num_entities`` entities, or None.
        They are drawn with replacement from the entities other than the answer: ``k`` of them
        or more repeat candidates and count them twice (on UMLS's 135 entities ``k = 2000``
        gave a mean rank of 172)."""
        if k < num_entities - 1:
            return None
        return (
            f"{k} candidates a query are not fewer than the {num_entities - 1} other entities of "
            "the graph: rank against all entities instead"
        )

    def draw(self, num_entities: int, side: str, targets: Tensor, start: int) -> Tensor:
        """Candidates ``(b, k)`` of the queries of triples ``start .. start + b`` of the split
        on ``side`` (whose answers are ``targets``): never the answer itself."""
        if num_entities < 2:
            raise ValueError("per-query candidates need a graph of at least 2 entities")
        b = int(targets.shape[0])
        if b == 0:
            return torch.zeros((0, self.k), dtype=torch.long)
        first, last = start // GROUP, (start + b - 1) // GROUP
        parts = []
        for group in range(first, last + 1):
            gen = torch.Generator().manual_seed(self._stream(side, group))
            # a group's first rows, up to the last this chunk needs (the CPU generator fills a
            # tensor in order: these rows are the same as those of the whole group's draw)
            rows = min(GROUP, start + b - group * GROUP)
            parts.append(torch.randint(0, num_entities - 1, (rows, self.k), generator=gen))
        offset = start - first * GROUP
        drawn = torch.cat(parts)[offset : offset + b]
        # from the num_entities - 1 others: ids at or above the answer move up by one
        return drawn + (drawn >= targets.cpu().long().unsqueeze(1)).long()

    def _stream(self, side: str, group: int) -> int:
        key = f"kgpipe-candidates:{self.seed}:{self.split}:{side}:{group}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & (2**63 - 1)


@dataclass(frozen=True, eq=False)
class FileCandidates:
    """The candidates of ``split`` read from files: row ``i`` of ``head``/``tail`` (``(n, k)``
    ids, memory-mapped or in memory) holds the candidates of the split's triple ``i``."""

    split: str
    head: np.ndarray
    tail: np.ndarray
    filtered: bool = False

    def __post_init__(self) -> None:
        if self.head.ndim != 2 or self.head.shape != self.tail.shape:
            raise ValueError(
                f"{self.split} candidates: head {self.head.shape} and tail {self.tail.shape} "
                "must be arrays of the same shape (triples, k)"
            )

    @property
    def k(self) -> int:
        return int(self.head.shape[1])

    @property
    def rows(self) -> int:
        return int(self.head.shape[0])

    def label(self) -> str:
        return f"files-{self.k}"

    def draw(self, num_entities: int, side: str, targets: Tensor, start: int) -> Tensor:
        """Candidates ``(b, k)`` of triples ``start .. start + b`` of the split on ``side``."""
        b = int(targets.shape[0])
        if start + b > self.rows:
            raise ValueError(
                f"{self.split} candidates hold {self.rows} rows, not the {start + b} queried"
            )
        rows = (self.head if side == "head" else self.tail)[start : start + b]
        return torch.from_numpy(np.array(rows, dtype=np.int64))


#: the candidate sets of a split: drawn from a seed, or read from files
Candidates = QueryCandidates | FileCandidates


def pair_scores(
    model: KGEModel, side: str, anchor_rows: Tensor, relations: Tensor, candidate_rows: Tensor
) -> Tensor:
    """Scores ``(n,)`` of ``n`` (query, candidate) pairs given as rows: ``(anchor, r, candidate)``
    for tail queries, ``(candidate, r, anchor)`` for head queries (``(anchor, r^-1,
    candidate)`` in a reciprocal model, as its full ranking scores them)."""
    inter, rel = model.interaction, model.relation
    if side == "tail":
        return inter.score(anchor_rows, rel[relations], candidate_rows)
    if model.spec.reciprocal:
        return inter.score(anchor_rows, rel[model.inverse(relations)], candidate_rows)
    return inter.score(candidate_rows, rel[relations], anchor_rows)


def known_mask(
    index: FilterIndex,
    side: str,
    anchors: Tensor,
    relations: Tensor,
    candidates: Tensor,
    num_entities: int,
) -> Tensor:
    """``(b, k)``: which candidates form a known true triple with their query (filtered out)."""
    rows, cols = index.answers(side, anchors.cpu(), relations.cpu())
    keys = rows * num_entities + cols
    mine = torch.arange(candidates.shape[0]).unsqueeze(1) * num_entities + candidates.cpu()
    return torch.isin(mine, keys)


def count_better(block: Tensor, true: Tensor) -> Tensor:
    """Per row, the columns of ``block`` that rank above the answer's score ``true`` (a column
    of ``(b, 1)``), where masked columns (known answers, the target, non-candidates) hold
    ``-inf``. NaN counts against the answer: a NaN candidate is better, and a NaN answer ranks
    below every column that is not masked (every comparison with NaN is false, which ranked a
    diverged model's answers first)."""
    # the columns not at or below the answer: NaN on either side compares false, so it counts
    # (one comparison, as the plain `>` count: a score block is the evaluation's hot path)
    better = block.shape[1] - (block <= true).sum(1)
    lost = true.isnan().squeeze(1)
    if bool(lost.any()):  # a NaN answer: every column but the masked ones
        better[lost] = (block[lost] != float("-inf")).sum(1)
    return better


def lift_neg_inf(*scores: Tensor, when: Tensor | bool) -> bool:
    """Where an answer scores -inf or NaN (``when``: the answers' scores, or whether one did;
    a diverging model), raise every -inf in ``scores`` (in place) to the lowest finite value
    and return True: an answer at -inf then ties with the candidates at -inf and ranks above
    the masked columns, which hold -inf (they counted as its ties), and a NaN answer ranks
    below them (as below every candidate), whatever else its batch holds. Applied before
    masking, to the answers' scores and every block they are ranked in."""
    if isinstance(when, Tensor):
        when = bool((torch.isneginf(when) | torch.isnan(when)).any())
    for t in scores if when else ():
        t.clamp_(min=torch.finfo(t.dtype).min)  # NaN stays NaN
    return when


def same_scores(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same scores exactly, NaN as NaN (``torch.equal`` says
    a NaN answer differs from itself, which sent its whole evaluation to the slower path)."""
    return torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)


def count_ranks(scores: Tensor, excluded: Tensor) -> tuple[Tensor, Tensor]:
    """Better and equal candidates per query: ``scores`` ``(b, 1 + k)`` holds the answer's
    score in column 0; ``excluded`` ``(b, k)`` marks candidates that do not count."""
    if lift_neg_inf(when=scores[:, 0]):  # an answer at -inf or NaN: lift a copy
        lift_neg_inf(scores := scores.clone(), when=True)
    true = scores[:, :1]
    others = scores[:, 1:].masked_fill(excluded.to(scores.device), float("-inf"))
    return count_better(others, true), (others == true).sum(1)


def ranks(
    model: KGEModel,
    side: str,
    chunk: Tensor,
    index: FilterIndex,
    candidates: Tensor,
    *,
    filtered: bool = True,
) -> Tensor:
    """Realistic ranks ``(b,)`` of this chunk's answers among their own ``candidates``
    ``(b, k)``, by a model that holds the whole entity table (``filtered``: candidates that
    form a known true triple do not count)."""
    model._whole()  # a sharded model scores with kgpipe.distributed.sharded_eval
    dev = model.entity.device
    h, r, t = chunk[:, 0], chunk[:, 1], chunk[:, 2]
    anchors, targets = (h, t) if side == "tail" else (t, h)
    ids = torch.cat((targets.unsqueeze(1), candidates), 1)
    b, c = ids.shape
    flat = ids.reshape(-1).to(dev)
    query = torch.arange(b, device=dev).repeat_interleave(c)
    anchors_d, relations_d = anchors.to(dev), r.to(dev)
    parts = []
    for lo in range(0, b * c, PAIRS):
        q, e = query[lo : lo + PAIRS], flat[lo : lo + PAIRS]
        rows = model.entity[anchors_d[q]]
        parts.append(pair_scores(model, side, rows, relations_d[q], model.entity[e]))
    scores = torch.cat(parts).view(b, c) if parts else torch.zeros((b, c), device=dev)
    if filtered:
        excluded = known_mask(index, side, anchors, r, candidates, model.spec.num_entities)
    else:
        excluded = torch.zeros(candidates.shape, dtype=torch.bool)
    better, equal = count_ranks(scores, excluded)
    return 1.0 + better.double() + equal.double() / 2.0
