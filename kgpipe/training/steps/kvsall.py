"""KvsAll: every ``(anchor, relation, side)`` query of the training triples scores all entities
against a multi-hot target of all its true answers. An epoch steps over queries, not triples.

In a step-synchronised gang the queries of a global batch are split between the ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kgpipe.training.records import StepResult
from kgpipe.training.steps.base import STEPS, StepKit, StepStrategy, row_grad

__all__ = ["KvsAll", "KvsAllIndex"]


class KvsAllIndex:
    """Training queries ``(anchor, relation, side)`` with their true answers in CSR form."""

    def __init__(self, train: Tensor, num_relations: int, reciprocal: bool) -> None:
        h, r, t = train[:, 0].long(), train[:, 1].long(), train[:, 2].long()
        if reciprocal:
            anchors = torch.cat((h, t))
            rels = torch.cat((r, r + num_relations))
            answers = torch.cat((t, h))
            sides = torch.zeros(anchors.shape[0], dtype=torch.long, device=train.device)
            nrel = 2 * num_relations
        else:
            anchors = torch.cat((h, t))
            rels = torch.cat((r, r))
            answers = torch.cat((t, h))
            sides = torch.cat((torch.zeros_like(h), torch.ones_like(t)))
            nrel = num_relations
        key = (sides * (int(anchors.max()) + 1) + anchors) * nrel + rels
        order = torch.argsort(key, stable=True)
        key, answers = key[order], answers[order]
        _, counts = torch.unique_consecutive(key, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        o = order[first]
        self.anchor = anchors[o]
        self.relation = rels[o]
        self.side = sides[o]
        self.offsets = torch.cat(
            (torch.zeros(1, dtype=torch.long, device=train.device), torch.cumsum(counts, 0))
        )
        self.answers = answers

    def __len__(self) -> int:
        return int(self.anchor.shape[0])

    @property
    def mean_answers(self) -> float:
        """The training triples a query covers, on average (at least 1)."""
        return self.answers.shape[0] / max(len(self), 1)

    def pairs(self, queries: Tensor) -> tuple[Tensor, Tensor]:
        """``(row, answer)`` of every true answer of the query ids ``queries``: ``row`` is the
        query's position in ``queries``."""
        start, end = self.offsets[queries], self.offsets[queries + 1]
        counts = end - start
        dev = queries.device
        row = torch.repeat_interleave(torch.arange(queries.shape[0], device=dev), counts)
        pos = torch.repeat_interleave(start - torch.cumsum(counts, 0) + counts, counts)
        pos = pos + torch.arange(row.shape[0], device=dev)
        return row, self.answers[pos]

    def labels(self, queries: Tensor, num_entities: int) -> Tensor:
        """Multi-hot targets ``(b, num_entities)`` of the query ids ``queries``."""
        row, answer = self.pairs(queries)
        out = torch.zeros(queries.shape[0], num_entities, device=queries.device)
        out[row, answer] = 1.0
        return out


@STEPS.register("kvsall")
class KvsAll(StepStrategy):
    """Every (anchor, relation, side) query against all entities, all its answers true."""

    all_entities = True

    def __init__(
        self, kit: StepKit, train: Tensor, *, chunk_size: int = 256, negatives: int = 256
    ) -> None:
        super().__init__(kit, train)
        self.index = KvsAllIndex(train, kit.spec.num_relations, kit.spec.reciprocal)

    def examples(self) -> int:
        return len(self.index)

    def batch(self, ids: Tensor) -> Tensor:
        return ids.long()  # a batch of query ids

    def triples_covered(self, examples: int) -> int:
        # an epoch over every query covers the training triples; a capped one is counted in
        # queries, since queries do not map onto triples
        return int(self.train.shape[0]) if examples >= len(self.index) else examples

    def gradients(
        self,
        batch: Tensor,
        draws: Tensor | None,
        *,
        global_step: int,
        global_queries: int,
        global_batch: int,
    ) -> StepResult:
        kit = self.kit
        queries = self.my_part(batch)
        inter, idx = kit.interaction, self.index
        ent_rows, ent = kit.all_entities()
        anchors, rels, sides = idx.anchor[queries], idx.relation[queries], idx.side[queries]
        rel_rows, rel_leaf, rel_inv = kit.gather("relation", rels)
        ent_leaf, rel = ent, rel_leaf
        penalty = None
        if kit.regularizer.active:  # on the triples the queries cover, before dropout
            row, answer = idx.pairs(queries)
            penalty = kit.regularizer(ent[anchors[row]], rel[rel_inv[row]], ent[answer])
        if kit.dropout is not None:
            ent, rel = kit.dropout.tables(
                global_step, ent, rel_leaf, rel_rows, tuple(kit.tables["relation"].shape)
            )
        a, r = ent[anchors], rel[rel_inv]
        tail = (sides == 0).nonzero().squeeze(-1)
        head = (sides == 1).nonzero().squeeze(-1)
        order = torch.cat((tail, head))
        labels = idx.labels(queries[order], ent.shape[0])
        with kit.scoring():
            scores = torch.cat(
                (
                    inter.score_tails(a[tail], r[tail], ent),
                    inter.score_heads(r[head], a[head], ent),
                )
            ).float()
        loss = kit.loss.against_all(scores, labels).sum()
        total = loss / global_queries
        if penalty is not None:  # a mean per covered triple, as the other modes' per positive
            total = total + penalty / (global_queries * idx.mean_answers)
        total.backward()
        return StepResult(
            loss_sum=float(loss.detach()),
            queries=int(queries.shape[0]),
            grads={
                "entity": row_grad(ent_rows, ent_leaf),
                "relation": row_grad(rel_rows, rel_leaf),
            },
        )
