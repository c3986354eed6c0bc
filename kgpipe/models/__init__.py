"""Models: stateless interactions (scoring functions) and the embedding-table model."""

from kgpipe.models.interactions import (
    INTERACTIONS,
    ComplEx,
    DistMult,
    Interaction,
    RotatE,
    TransE,
    get_interaction,
)
from kgpipe.models.model import KGEModel, ModelSpec

__all__ = [
    "INTERACTIONS",
    "ComplEx",
    "DistMult",
    "Interaction",
    "KGEModel",
    "ModelSpec",
    "RotatE",
    "TransE",
    "get_interaction",
]
