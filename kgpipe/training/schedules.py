"""Learning-rate schedules, one registered class per ``training.schedule``.

A schedule gives the rate of each (0-based) global step. Every schedule starts with the linear
warm-up of ``training.warmup_steps``. The plateau schedule also follows the validations: the
loop hands it the valid MRRs of the history (:meth:`Schedule.observe`) at every epoch start.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import torch

from kgpipe.registry import Registry

__all__ = ["SCHEDULES", "Schedule", "lr_at", "plateau_lr"]


class Schedule(ABC):
    """The learning rate over ``total_steps`` steps from ``base``, after a linear warm-up."""

    name: ClassVar[str]
    #: the rate depends on validation results (the run must validate; resume rules tighten)
    follows_validation: ClassVar[bool] = False
    #: a step's rate does not depend on the run's length, so a finished run may be resumed
    #: with more epochs and end as a run started with that many would
    extendable: ClassVar[bool] = True

    def __init__(
        self,
        *,
        base: float,
        warmup_steps: int,
        total_steps: int,
        factor: float = 0.5,
        patience: int = 2,
        threshold: float = 1e-4,
        min_lr: float = 0.0,
    ) -> None:
        """Every schedule takes the ``training.plateau`` options (only plateau uses them)."""
        self.base = base
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def observe(self, valid_mrrs: Sequence[float]) -> None:  # noqa: B027 -- optional hook
        """The valid MRRs of the run so far (called at every epoch start and after a resume)."""

    @abstractmethod
    def rate(self, step: int) -> float:
        """The learning rate of global ``step``."""


SCHEDULES: Registry[Schedule] = Registry(
    "schedule", doc="learning-rate schedules: training.schedule"
)


def lr_at(step: int, *, base: float, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Learning rate of (0-based) ``step``: linear warm-up, then constant/cosine/linear decay."""
    if warmup_steps and step < warmup_steps:
        return base * (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return base
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return base * (1.0 - progress)
    raise ValueError(f"unknown schedule {schedule!r}")


class _Decay(Schedule):
    def rate(self, step: int) -> float:
        return lr_at(
            step,
            base=self.base,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            schedule=self.name,
        )


@SCHEDULES.register("constant")
class Constant(_Decay):
    """The peak rate throughout (after warm-up)."""


@SCHEDULES.register("cosine")
class Cosine(_Decay):
    """Cosine decay towards 0, reached just after the last step."""

    extendable = False


@SCHEDULES.register("linear")
class Linear(_Decay):
    """Linear decay towards 0, reached just after the last step (which runs at
    base / (steps after warm-up))."""

    extendable = False


def plateau_lr(
    base: float,
    scores: Sequence[float],
    *,
    factor: float,
    patience: int,
    threshold: float,
    min_lr: float = 0.0,
) -> float:
    """The learning rate after the validation ``scores`` so far (higher is better) under
    torch's ``ReduceLROnPlateau`` (mode max, relative threshold, no cooldown), starting at
    ``base``.

    The rate is a function of the validation history alone, which checkpoints carry: a resumed
    run, and every rank of a gang, arrive at the same rate without a scheduler state of their
    own. torch's scheduler is replayed on a stand-in optimiser so its rule is used as is.
    """
    holder = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        holder,
        mode="max",
        factor=factor,
        patience=patience,
        threshold=threshold,
        threshold_mode="rel",
        min_lr=min_lr,
    )
    for score in scores:
        scheduler.step(float(score))
    return float(holder.param_groups[0]["lr"])


@SCHEDULES.register("plateau")
class Plateau(Schedule):
    """Cut by ``plateau.factor`` when the valid MRR stalls (torch's ReduceLROnPlateau)."""

    follows_validation = True

    def __init__(
        self,
        *,
        base: float,
        warmup_steps: int,
        total_steps: int,
        factor: float = 0.5,
        patience: int = 2,
        threshold: float = 1e-4,
        min_lr: float = 0.0,
    ) -> None:
        super().__init__(base=base, warmup_steps=warmup_steps, total_steps=total_steps)
        self.factor, self.patience, self.threshold, self.min_lr = (
            factor,
            patience,
            threshold,
            min_lr,
        )
        self.current = base

    def observe(self, valid_mrrs: Sequence[float]) -> None:
        self.current = plateau_lr(
            self.base,
            valid_mrrs,
            factor=self.factor,
            patience=self.patience,
            threshold=self.threshold,
            min_lr=self.min_lr,
        )

    def rate(self, step: int) -> float:
        return lr_at(
            step,
            base=self.current,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            schedule="constant",
        )
