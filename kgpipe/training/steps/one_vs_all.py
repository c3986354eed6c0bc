"""1-vs-all: each positive ``(h, r, t)`` scores its tail query ``(h, r, ?)`` and its head query
``(?, r, t)`` against every entity, with the true answer as the target.

In a step-synchronised gang the rows of a global batch are split between the ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kgpipe.training.losses import linear_softmax_cross_entropy
from kgpipe.training.records import StepResult
from kgpipe.training.steps.base import STEPS, StepStrategy, row_grad

__all__ = ["OneVsAll"]


@STEPS.register("1vsall")
class OneVsAll(StepStrategy):
    """Every positive's tail and head query against all entities (softmax or BCE)."""

    all_entities = True

    def global_queries(self, batch_size: int) -> int:
        return 2 * batch_size  # a tail and a head query per positive

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
        batch = self.my_part(batch)
        inter, spec, reg = kit.interaction, kit.spec, kit.regularizer
        h_id, r_id, t_id = batch[:, 0], batch[:, 1], batch[:, 2]
        ent_rows, ent = kit.all_entities()
        rel_ids = torch.cat((r_id, r_id + spec.num_relations)) if spec.reciprocal else r_id
        rel_rows, rel, rel_inv = kit.gather("relation", rel_ids)
        b = batch.shape[0]
        # regularised before dropout (gathered only when there is a penalty), as a mean over the
        # queries' triples: (h, r, t) and (t, r⁻¹, h) where the head query is an inverse one
        reg_rows = None
        if reg.active and spec.reciprocal:
            anchors, answers = torch.cat((h_id, t_id)), torch.cat((t_id, h_id))
            reg_rows = (ent[anchors], rel[rel_inv], ent[answers])
        elif reg.active:
            reg_rows = (ent[h_id], rel[rel_inv], ent[t_id])
        ent_leaf, rel_leaf = ent, rel
        if kit.dropout is not None:
            ent, rel = kit.dropout.tables(
                global_step, ent, rel, rel_rows, tuple(kit.tables["relation"].shape)
            )
        h, t = ent[h_id], ent[t_id]
        r = rel[rel_inv[:b]]
        targets = torch.cat((t_id, h_id))
        if spec.reciprocal and kit.loss.softmax and inter.bilinear:
            # scores and loss fused, block by block: no (2b, E) score matrix
            queries = inter.tail_query(  # type: ignore[attr-defined]
                torch.cat((h, t)), torch.cat((r, rel[rel_inv[b:]]))
            )
            loss = linear_softmax_cross_entropy(
                queries,
                ent,
                targets,
                label_smoothing=kit.loss.label_smoothing,
                dtype=torch.bfloat16 if kit.bf16 else None,
                block=max(64, min(1024, (1 << 23) // ent.shape[0])),
            )
        else:
            # Tail queries (h, r, ?) then head queries (?, r, t); the loss takes all 2b rows at
            # once (slicing the score matrix would cost a zero-filled copy of it in backward).
            with kit.scoring():
                if spec.reciprocal:  # head queries as (t, r⁻¹, ?): one product for both
                    scores = inter.score_tails(
                        torch.cat((h, t)), torch.cat((r, rel[rel_inv[b:]])), ent
                    )
                else:
                    scores = torch.cat((inter.score_tails(h, r, ent), inter.score_heads(r, t, ent)))
            loss = kit.loss.against_all(
                scores if kit.loss.softmax else scores.float(), targets
            ).sum()
        total = loss / global_queries
        if reg_rows is not None:
            triples = 2 if spec.reciprocal else 1  # penalised per positive
            total = total + reg(*reg_rows) / (global_batch * triples)
        total.backward()
        return StepResult(
            loss_sum=float(loss.detach()),
            queries=2 * b,
            grads={
                "entity": row_grad(ent_rows, ent_leaf),
                "relation": row_grad(rel_rows, rel_leaf),
            },
        )
