"""Shared-negative sampling: chunks of positives score one shared set of negatives.

Heads are corrupted for half of each batch and tails for the other half; every chunk of
``chunk_size`` positives shares ``negatives`` random entities, scored with one matrix product
(the PyTorch-BigGraph / DGL-KE trick). In a step-synchronised gang the chunks of a global batch
are dealt to the ranks (chunk ``i`` to rank ``i mod W``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from kgpipe.training.optim import RowGrad
from kgpipe.training.records import StepResult
from kgpipe.training.steps.base import STEPS, StepKit, StepStrategy

__all__ = ["NegativeSampling"]


@STEPS.register("negative_sampling")
class NegativeSampling(StepStrategy):
    """Shared negatives: chunks of positives score one set of random entities each."""

    def __init__(
        self, kit: StepKit, train: Tensor, *, chunk_size: int = 256, negatives: int = 256
    ) -> None:
        super().__init__(kit, train)
        self.chunk_size = chunk_size
        self.negatives = negatives

    def draw(self, batch_size: int, gen: torch.Generator) -> Tensor:
        """The shared negatives ``(chunks, n)`` of a global batch.

        The whole global batch's negatives are drawn in one call, so the draw does not depend on
        how a distributed run later splits the chunks across ranks; drawn with the CPU generator
        wherever training runs, so every device sees the same draws.
        """
        c = self.chunk_size
        n_tail = (batch_size + 1) // 2
        n_chunks = math.ceil(n_tail / c) + math.ceil((batch_size - n_tail) / c)
        return torch.randint(
            0, self.kit.spec.num_entities, (n_chunks, self.negatives), generator=gen
        ).to(self.kit.device)

    def _side_chunks(self, batch: Tensor, num_chunks: int) -> tuple[Tensor, Tensor]:
        """Pad a side's positives to ``num_chunks`` chunks: triples ``(c, C, 3)``, weights."""
        c = self.chunk_size
        n = batch.shape[0]
        pad = num_chunks * c - n
        weights = torch.ones(num_chunks * c, device=self.kit.device)
        if pad:
            batch = torch.cat((batch, batch[:1].expand(pad, 3)))
            weights[n:] = 0.0
        return batch.view(num_chunks, c, 3), weights

    def _my_chunks(
        self, batch: Tensor, negatives: Tensor
    ) -> Iterator[tuple[str, Tensor, Tensor, Tensor, Tensor]]:
        """This part's chunks of each side: ``(side, triples (nc, C, 3), weights (nc * C,),
        negatives (nc, n), global chunk ids)`` -- chunk ``i`` of the global batch goes to part
        ``i mod count``."""
        c = self.chunk_size
        n_tail = (batch.shape[0] + 1) // 2
        sides = [("tail", batch[:n_tail]), ("head", batch[n_tail:])]
        chunk_counts = [math.ceil(s.shape[0] / c) for _, s in sides]
        assert sum(chunk_counts) == negatives.shape[0], "one negative set per chunk"
        index, count = self.kit.part
        chunk_off = 0
        for (side, pos), n_chunks in zip(sides, chunk_counts, strict=True):
            if not n_chunks:
                continue
            triples, weights = self._side_chunks(pos, n_chunks)
            ids = torch.arange(n_chunks, device=self.kit.device)
            mine = ids[(ids + chunk_off) % count == index]
            chunk_ids = (chunk_off + mine).cpu()
            chunk_neg = negatives[chunk_off + mine]
            chunk_off += n_chunks
            if not mine.numel():
                continue
            yield (
                side,
                triples[mine],
                weights.view(n_chunks, c)[mine].reshape(-1),
                chunk_neg,
                chunk_ids,
            )

    def touched(self, batch: Tensor, draws: Tensor | None) -> Tensor:
        assert draws is not None, "negative sampling needs the step's negatives"
        ids = [batch.new_zeros(0)]
        for _side, triples, _w, chunk_neg, _ids in self._my_chunks(batch, draws):
            ids += [triples[..., 0].reshape(-1), triples[..., 2].reshape(-1), chunk_neg.reshape(-1)]
        return torch.cat(ids)

    def gradients(
        self,
        batch: Tensor,
        draws: Tensor | None,
        *,
        global_step: int,
        global_queries: int,
        global_batch: int,
    ) -> StepResult:
        assert draws is not None, "negative sampling needs the step's negatives"
        negatives = draws
        kit = self.kit
        inter, spec = kit.interaction, kit.spec
        c, n = self.chunk_size, negatives.shape[1]
        ent_table, rel_table = kit.tables["entity"], kit.tables["relation"]
        widths = (ent_table.shape[1], rel_table.shape[1])

        # Every use of a table is its own autograd leaf gathered with index_select: backward then
        # stops at the gathered rows, and one index_add_ per table coalesces their gradients.
        # (Letting autograd scatter into one leaf costs a zero-filled table copy per use.)
        leaves: dict[str, list[tuple[Tensor, Tensor]]] = {"entity": [], "relation": []}

        def gather(table: str, ids: Tensor, shape: tuple[int, ...]) -> Tensor:
            src = ent_table if table == "entity" else rel_table
            leaf = src.index_select(0, ids.reshape(-1)).requires_grad_(True)
            leaves[table].append((ids.reshape(-1), leaf))
            return leaf.view(*shape, -1)

        total = ent_table.new_zeros(())
        loss_sum = 0.0
        regularize = kit.regularizer.active
        queries = 0
        for side, triples, weights, chunk_neg, chunk_ids in self._my_chunks(batch, negatives):
            nc = int(chunk_ids.numel())
            masks = (
                kit.dropout.chunk_masks(global_step, chunk_ids, c, n, widths, kit.device)
                if kit.dropout is not None
                else None
            )
            queries += int(weights.sum())
            h = gather("entity", triples[..., 0], (nc, c))
            t = gather("entity", triples[..., 2], (nc, c))
            rel_ids = triples[..., 1]
            if side == "head" and spec.reciprocal:
                rel_ids = rel_ids + spec.num_relations  # head queries use the inverse relation
            r = gather("relation", rel_ids, (nc, c))
            cand = gather("entity", chunk_neg, (nc, n))
            h_raw, r_raw, t_raw = h, r, t  # regularised before dropout
            if masks is not None:
                h, t, cand, r = h * masks[0], t * masks[1], cand * masks[2], r * masks[3]
            with kit.scoring():
                if side == "tail":
                    pos_score = inter.score(h, r, t)
                    neg_score = inter.score_tails(h, r, cand)
                elif spec.reciprocal:
                    pos_score = inter.score(t, r, h)
                    neg_score = inter.score_tails(t, r, cand)
                else:
                    pos_score = inter.score(h, r, t)
                    neg_score = inter.score_heads(r, t, cand)
            pos_score, neg_score = pos_score.float(), neg_score.float()
            per = kit.loss.negative_sampling(pos_score.reshape(-1), neg_score.reshape(-1, n))
            weighted = (per * weights).sum()
            total = total + weighted / global_queries
            loss_sum += float(weighted.detach())
            if regularize:
                flat = (nc * c, -1)
                reg = kit.regularizer(
                    h_raw.reshape(flat), r_raw.reshape(flat), t_raw.reshape(flat), weights=weights
                )
                total = total + reg / global_batch
        if leaves["entity"]:
            total.backward()
        grads = {name: self._coalesce(uses, name) for name, uses in leaves.items()}
        return StepResult(loss_sum=loss_sum, queries=queries, grads=grads)

    def _coalesce(self, uses: list[tuple[Tensor, Tensor]], table: str) -> RowGrad:
        """Sum the gradients of gathered rows per unique row id."""
        if not uses:  # this part had no work in this step
            return self.kit.empty_grad(table)
        ids = torch.cat([i for i, _ in uses])
        rows, inv, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        values = torch.cat(
            [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for _, leaf in uses]
        )
        out = values.new_zeros(rows.shape[0], values.shape[1])
        out.index_add_(0, inv, values)
        return RowGrad(rows, out, counts)
