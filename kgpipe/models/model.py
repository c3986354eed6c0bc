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

__all__ = ["KGEModel", "spec_from_config"]


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

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.interaction: Interaction = INTERACTIONS.get(spec.name)(p=spec.p, margin=spec.margin)
        self.entity = nn.Parameter(torch.zeros(spec.num_entities, spec.dim), requires_grad=False)
        self.relation = nn.Parameter(
            torch.zeros(spec.relation_rows, self.interaction.relation_dim(spec.dim)),
            requires_grad=False,
        )

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls, cfg: ModelConfig, *, num_entities: int, num_relations: int, seed: int
    ) -> KGEModel:
        """A freshly initialised model; the draw depends only on ``seed``."""
        model = cls(spec_from_config(cfg, num_entities=num_entities, num_relations=num_relations))
        gen = torch.Generator().manual_seed(seed)
        model.reset_parameters(init=cfg.init, scale=cfg.init_scale, generator=gen)
        return model

    @torch.no_grad()
    def reset_parameters(self, *, init: str, scale: float, generator: torch.Generator) -> None:
        for table in (self.entity, self.relation):
            if table is self.relation and self.interaction.phase_relations:
                table.uniform_(-math.pi, math.pi, generator=generator)
            elif init == "normal":
                table.normal_(0.0, scale, generator=generator)
            elif init == "uniform":
                table.uniform_(-scale, scale, generator=generator)
            elif init == "xavier":
                bound = math.sqrt(6.0 / (table.shape[0] + table.shape[1]))
                table.uniform_(-bound, bound, generator=generator)
            else:
                raise ValueError(f"unknown init {init!r}")

    # -- scoring ------------------------------------------------------------------------------
    def inverse(self, r: Tensor) -> Tensor:
        """Ids of the inverse relations (reciprocal models only)."""
        return r + self.spec.num_relations

    @torch.no_grad()
    def score_triples(self, triples: Tensor) -> Tensor:
        """Scores ``(n,)`` of ``(head, relation, tail)`` id triples ``(n, 3)``."""
        h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
        e, rel = self.entity, self.relation
        return self.interaction.score(e[h], rel[r], e[t])

    @torch.no_grad()
    def score_all_tails(self, h: Tensor, r: Tensor, candidates: slice | None = None) -> Tensor:
        """Scores ``(b, num_entities)`` of queries ``(h, r, ?)`` against every entity, or
        ``(b, len)`` against the entities of the id range ``candidates``."""
        table = self.entity if candidates is None else self.entity[candidates]
        return self.interaction.score_tails(self.entity[h], self.relation[r], table)

    @torch.no_grad()
    def score_all_heads(self, r: Tensor, t: Tensor, candidates: slice | None = None) -> Tensor:
        """Scores ``(b, num_entities)`` of queries ``(?, r, t)`` against every entity, or
        ``(b, len)`` against the entities of the id range ``candidates``."""
        if self.spec.reciprocal:
            return self.score_all_tails(t, self.inverse(r), candidates)
        table = self.entity if candidates is None else self.entity[candidates]
        return self.interaction.score_heads(self.relation[r], self.entity[t], table)
