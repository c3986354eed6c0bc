"""Embedding dropout: inverted-dropout multipliers, drawn per step from seeded generators.

Masks are drawn on the CPU from a generator seeded by ``(seed, stream, global step, key)``: a
step's masks do not depend on the device, on how ranks split the step, or on a resume.
Negative-sampling chunks draw one generator per global chunk id (so a rank drawing only its own
chunks gets the same masks); all-entity steps draw one mask of each table per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kgpipe.training.rng import derive_seed

__all__ = ["Dropout", "keep_mask"]

# Tag that keeps dropout draws apart from every other seed derived from (seed, ...).
_DROPOUT_STREAM = 0xD20
_TABLE_KEY = 0x7FFFFFFF  # the key of the per-step table masks (chunk keys are chunk ids)


def keep_mask(gen: torch.Generator, shape: tuple[int, ...], p: float) -> Tensor:
    """Inverted-dropout multipliers of ``shape``: 0 with probability ``p``, else ``1/(1-p)``."""
    return (torch.rand(shape, generator=gen) >= p).float().div_(1.0 - p)


class Dropout:
    """Dropout of entity and relation rows with probabilities ``entity`` and ``relation``."""

    def __init__(self, *, entity: float, relation: float, seed: int, stream: int) -> None:
        self.entity = entity
        self.relation = relation
        self.seed = seed
        self.stream = stream

    def generator(self, global_step: int, key: int) -> torch.Generator:
        seed = derive_seed(self.seed, self.stream, global_step, key, _DROPOUT_STREAM)
        return torch.Generator().manual_seed(seed)

    def chunk_masks(
        self,
        global_step: int,
        chunk_ids: Tensor,
        c: int,
        n: int,
        widths: tuple[int, int],
        device: torch.device,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Multipliers for the heads, tails, negatives ``(k, c|n, d)`` and relations of the
        negative-sampling chunks with global ids ``chunk_ids`` (one generator per chunk);
        ``widths`` are the entity and relation row widths."""
        pe, pr = self.entity, self.relation
        de, dr = widths
        parts: list[list[Tensor]] = [[], [], [], []]
        for g in chunk_ids.tolist():
            gen = self.generator(global_step, int(g))
            draws = (
                keep_mask(gen, (c, de), pe),
                keep_mask(gen, (c, de), pe),
                keep_mask(gen, (n, de), pe),
            )
            for i, m in enumerate((*draws, keep_mask(gen, (c, dr), pr))):
                parts[i].append(m)
        h, t, neg, r = (torch.stack(p).to(device) for p in parts)
        return h, t, neg, r

    def tables(
        self,
        global_step: int,
        ent: Tensor,
        rel: Tensor,
        rel_rows: Tensor,
        rel_shape: tuple[int, ...],
    ) -> tuple[Tensor, Tensor]:
        """The whole entity table and the gathered relation rows with this step's dropout (one
        mask per step for every rank, so the ranks of a split step agree)."""
        gen = self.generator(global_step, _TABLE_KEY)
        ent = ent * keep_mask(gen, tuple(ent.shape), self.entity).to(ent.device)
        rel_mask = keep_mask(gen, rel_shape, self.relation)
        return ent, rel * rel_mask.to(rel.device)[rel_rows]
