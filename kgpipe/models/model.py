"""A KGE model: an entity table, a relation table and an interaction.

The tables are plain parameters; the trainer gathers the rows a batch touches and updates only
those (see :mod:`kgpipe.training.optim`). Reciprocal models: see :class:`ModelSpec`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kgpipe.config import ModelConfig
from kgpipe.models.interactions import INTERACTIONS, Interaction
from kgpipe.models.spec import ModelSpec

__all__ = ["INIT_BLOCK", "KGEModel", "spec_from_config"]

#: rows per block of the entity table's initial draw (a multiple of 16: torch's normal draw
#: fills 16 values at a time, so blocks draw exactly what one call on the table would)
INIT_BLOCK = 1 << 16


def _draw(
    out: Tensor, init: str, scale: float, shape: tuple[int, ...], gen: torch.Generator
) -> None:
    """Fill ``out`` by ``init`` for a table of ``shape`` (xavier's bound is the table's)."""
    if init == "normal":
        out.normal_(0.0, scale, generator=gen)
    elif init == "uniform":
        out.uniform_(-scale, scale, generator=gen)
    elif init == "xavier":
        bound = math.sqrt(6.0 / (shape[0] + shape[1]))
        out.uniform_(-bound, bound, generator=gen)
    else:
        raise ValueError(f"unknown init {init!r}")


def spec_from_config(cfg: ModelConfig, *, num_entities: int, num_relations: int) -> ModelSpec:
    """The spec of ``cfg`` for a graph of the given size."""
    uses_margin = INTERACTIONS.get(cfg.name).uses_margin
    return ModelSpec(
        name=cfg.name,
        dim=cfg.dim,
        num_entities=num_entities,
        num_relations=num_relations,
        p=cfg.p,
        margin=cfg.margin if uses_margin else 0.0,
        reciprocal=cfg.reciprocal,
    )


class KGEModel(nn.Module):
    """Entity and relation embedding tables scored by a stateless :class:`Interaction`."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        rows: Tensor | None = None,
        tables: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """``tables``: the ``(entity, relation)`` tables to hold as they are (a memory-mapped
        file's, say), instead of zeros; their shapes must be the spec's."""
        super().__init__()
        self.spec = spec
        self.interaction: Interaction = INTERACTIONS.get(spec.name)(p=spec.p, margin=spec.margin)
        #: the entity ids whose rows this model holds, in the order of its table; None: all
        self.rows = rows
        held = spec.num_entities if rows is None else int(rows.numel())
        shapes = ((held, spec.dim), (spec.relation_rows, self.interaction.relation_dim(spec.dim)))
        if tables is None:
            tables = (torch.zeros(shapes[0]), torch.zeros(shapes[1]))
        for name, table, shape in zip(("entity", "relation"), tables, shapes, strict=True):
            if tuple(table.shape) != shape:
                raise ValueError(f"the {name} table is {tuple(table.shape)}, the spec's {shape}")
        self.entity = nn.Parameter(tables[0], requires_grad=False)
        self.relation = nn.Parameter(tables[1], requires_grad=False)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        cfg: ModelConfig,
        *,
        num_entities: int,
        num_relations: int,
        seed: int,
        rows: Tensor | None = None,
    ) -> KGEModel:
        """A freshly initialised model; the draw depends only on ``seed``. With ``rows`` (the
        entity ids of a shard set, in any order) it holds only those rows of the entity table,
        in that order, with the values the whole table would give them."""
        spec = spec_from_config(cfg, num_entities=num_entities, num_relations=num_relations)
        model = cls(spec, rows=rows)
        gen = torch.Generator().manual_seed(seed)
        model.reset_parameters(init=cfg.init, scale=cfg.init_scale, generator=gen)
        return model

    @torch.no_grad()
    def reset_parameters(self, *, init: str, scale: float, generator: torch.Generator) -> None:
        """Draw the entity table, then the relation table, from ``generator``. The entity table
        is drawn in blocks of :data:`INIT_BLOCK` rows (the same values as one draw of the whole
        table): a model holding some rows keeps its own of each block, never the whole table."""
        full = (self.spec.num_entities, self.spec.dim)
        rows = self.rows
        if rows is not None:
            order = torch.argsort(rows)
            by_id = rows[order]
        starts = list(range(0, full[0], INIT_BLOCK))
        if len(starts) > 1 and (full[0] - starts[-1]) * full[1] < 16:
            starts.pop()  # a last block under 16 values would take torch's scalar draw
        for i, start in enumerate(starts):
            stop = starts[i + 1] if i + 1 < len(starts) else full[0]
            if rows is None:
                _draw(self.entity[start:stop], init, scale, full, generator)
                continue
            block = torch.empty(stop - start, full[1])
            _draw(block, init, scale, full, generator)
            lo, hi = torch.searchsorted(by_id, torch.tensor([start, stop]))
            self.entity[order[lo:hi]] = block[by_id[lo:hi] - start]
        if self.interaction.phase_relations:
            self.relation.uniform_(-math.pi, math.pi, generator=generator)
        else:
            _draw(self.relation, init, scale, tuple(self.relation.shape), generator)

    # -- scoring ------------------------------------------------------------------------------
    def _whole(self) -> None:
        if self.rows is not None:
            raise RuntimeError(
                "this model holds a shard set of the entity table: score with the sharded "
                "evaluator (kgpipe.distributed.sharded_eval)"
            )

    def inverse(self, r: Tensor) -> Tensor:
        """Ids of the inverse relations (reciprocal models only)."""
        return r + self.spec.num_relations

    @torch.no_grad()
    def score_triples(self, triples: Tensor) -> Tensor:
        """Scores ``(n,)`` of ``(head, relation, tail)`` id triples ``(n, 3)``."""
        self._whole()
        h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
        e, rel = self.entity, self.relation
        return self.interaction.score(e[h], rel[r], e[t])

    @torch.no_grad()
    def score_all_tails(
        self, h: Tensor, r: Tensor, candidates: slice | Tensor | None = None
    ) -> Tensor:
        """Scores ``(b, num_entities)`` of queries ``(h, r, ?)`` against every entity, or
        ``(b, len)`` against the entities of ``candidates`` (an id range or ids)."""
        self._whole()
        table = self.entity if candidates is None else self.entity[candidates]
        return self.interaction.score_tails(self.entity[h], self.relation[r], table)

    @torch.no_grad()
    def score_all_heads(
        self, r: Tensor, t: Tensor, candidates: slice | Tensor | None = None
    ) -> Tensor:
        """Scores ``(b, num_entities)`` of queries ``(?, r, t)`` against every entity, or
        ``(b, len)`` against the entities of ``candidates`` (an id range or ids)."""
        self._whole()
        if self.spec.reciprocal:
            return self.score_all_tails(t, self.inverse(r), candidates)
        table = self.entity if candidates is None else self.entity[candidates]
        return self.interaction.score_heads(self.relation[r], self.entity[t], table)
