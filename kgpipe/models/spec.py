"""The shape and scoring of a model, stored with its tensors (no config types involved)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

__all__ = ["ModelSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model's shapes and scoring (stored with its tensors).

    With ``reciprocal`` the relation table has ``2 * num_relations`` rows: row ``r + R`` is the
    inverse of relation ``r``, and head queries ``(?, r, t)`` are answered as ``(t, r + R, ?)``.
    """

    name: str
    dim: int
    num_entities: int
    num_relations: int
    p: int = 2
    margin: float = 0.0
    reciprocal: bool = False

    @property
    def relation_rows(self) -> int:
        return self.num_relations * (2 if self.reciprocal else 1)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        return cls(**json.loads(text))
