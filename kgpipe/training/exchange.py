"""How the ranks of a gang combine their work: the interface, and the identity of one process.

The distributed exchanges (gradient sums every step, model averaging every epoch) are in
:mod:`kgpipe.distributed.comm`.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from kgpipe.training.optim import RowGrad, RowOptimizer

__all__ = ["Exchange", "Trainable"]


class Trainable(Protocol):
    """What an exchange may touch of the trainer it is bound to."""

    @property
    def tables(self) -> dict[str, Tensor]: ...

    @property
    def optimizer(self) -> RowOptimizer: ...


class Exchange:
    """How a gang of ranks combines its work (the identity in one process)."""

    def bind(self, trainer: Trainable) -> None:
        """Called once by the trainer that uses this exchange."""

    def loaded(self, trainer: Trainable) -> None:
        """Called after the trainer loaded a state (a resume) into its tables."""

    def agree_steps(self, steps: int) -> int:
        """A count of steps every rank goes on with (the steps per epoch the learning-rate
        schedules count with; the global step after an epoch), given this rank's own: the
        same where the ranks share each global batch."""
        return steps

    def pull(
        self, strategy: Any, batch: Tensor, draws: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """Before a step: make the rows the step's share touches available to ``strategy``
        (a sharded table fetches them from their owners); returns the batch and draws in the
        ids the strategy then computes with (the identity when every rank holds every row)."""
        return batch, draws

    def step(self, grads: dict[str, RowGrad]) -> dict[str, RowGrad]:
        """Combine the ranks' row gradients of one step (step-level synchronisation)."""
        return grads

    def squared_norm(self, grads: dict[str, RowGrad]) -> float:
        """The squared norm of the whole step's gradient (for clipping), from what
        :meth:`step` returned."""
        return sum(float(g.values.pow(2).sum()) for g in grads.values())

    def epoch_end(
        self, trainer: Trainable, loss_sum: float, queries: int, triples: int
    ) -> tuple[float, int, int]:
        """Combine models after an epoch (epoch-level synchronisation); return the global
        ``(loss_sum, queries, triples)`` of the epoch."""
        return loss_sum, queries, triples

    def pop_stats(self) -> dict[str, Any]:
        """Communication statistics since the last call (seconds, bytes sent, ...)."""
        return {}
