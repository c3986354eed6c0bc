"""Penalties on the embedding rows a batch uses, one registered class per
``model.regularizer.type``.

What a penalty applies to follows the interaction's traits, not its name: rows of complex
numbers (``complex_rows``) are penalised through their complex moduli under N3, and relation
rows that are rotation phases (``phase_relations``) are not penalised at all.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from kgpipe.models.interactions import Interaction
from kgpipe.registry import Registry

__all__ = ["REGULARIZERS", "Regularizer"]


class Regularizer:
    """``weight * Σ penalty(row)`` over the head, relation and tail rows of a batch."""

    name: ClassVar[str]

    def __init__(self, interaction: Interaction, *, weight: float = 0.0, p: float = 2.0) -> None:
        self.weight = weight
        self.p = p
        self.complex_rows = interaction.complex_rows
        self.phase_relations = interaction.phase_relations

    @property
    def active(self) -> bool:
        """Whether the penalty is worth computing (a penalty with a positive weight)."""
        return bool(self.weight)

    def penalty(self, x: Tensor) -> Tensor:
        """Per-row penalty ``(b,)`` of rows ``(b, d)``."""
        raise NotImplementedError

    def __call__(self, h: Tensor, r: Tensor, t: Tensor, *, weights: Tensor | None = None) -> Tensor:
        """The weighted penalty of the rows ``(b, d)`` of a batch's triples (per-triple
        ``weights``, e.g. 0 for padding)."""
        if not self.active:
            return h.new_zeros(())
        if self.phase_relations:
            r = r[..., :0]  # phases: nothing to shrink
        per = self.penalty(h) + self.penalty(r) + self.penalty(t)
        if weights is not None:
            per = per * weights
        return self.weight * per.sum()


REGULARIZERS: Registry[Regularizer] = Registry(
    "regularizer", doc="embedding penalties: model.regularizer.type"
)


@REGULARIZERS.register("none")
class NoRegularizer(Regularizer):
    """No penalty."""

    @property
    def active(self) -> bool:
        return False


@REGULARIZERS.register("lp")
class LpRegularizer(Regularizer):
    """``|x|_p^p`` per row (``model.regularizer.p``)."""

    def penalty(self, x: Tensor) -> Tensor:
        return x.abs().pow(self.p).sum(-1)


@REGULARIZERS.register("n3")
class N3Regularizer(Regularizer):
    """Nuclear 3-norm (Lacroix et al. 2018): ``Σ |x_k|³``, over complex moduli for complex rows."""

    def penalty(self, x: Tensor) -> Tensor:
        if self.complex_rows:
            re, im = x.chunk(2, dim=-1)
            return (re * re + im * im).clamp_min(1e-30).pow(1.5).sum(-1)
        return x.abs().pow(3).sum(-1)
