"""What training produces: per-step results of a rank and per-epoch statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kgpipe.training.optim import RowGrad

__all__ = ["EpochStats", "StepResult"]


@dataclass
class StepResult:
    """What one rank computed for one step."""

    loss_sum: float  # sum of per-query losses of this rank (before normalisation)
    queries: int  # queries this rank scored
    grads: dict[str, RowGrad]


@dataclass
class EpochStats:
    """Per-epoch numbers; callbacks may add entries to ``extra`` (e.g. validation metrics)."""

    epoch: int
    loss: float
    triples: int
    seconds: float
    lr: float
    steps: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def triples_per_s(self) -> float:
        return self.triples / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "loss": self.loss,
            "triples": self.triples,
            "triples_per_s": self.triples_per_s,
            "seconds": self.seconds,
            "lr": self.lr,
            "steps": self.steps,
        }
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> EpochStats:
        """Inverse of :meth:`as_dict` (``triples_per_s`` is derived, so dropped)."""
        s = dict(row)
        s.pop("triples_per_s", None)
        core = {k: s.pop(k) for k in ("epoch", "loss", "triples", "seconds", "lr", "steps")}
        return cls(**core, extra=s)
