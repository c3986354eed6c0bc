"""Callbacks and the read-only view of training they receive.

A callback never gets the trainer itself, only a :class:`TrainerView`: where training stands
(epoch, step, totals, history). That is all a callback on the driver of a Dask gang can honestly
be given -- the model lives on the ranks -- and the in-process trainer offers the same view, so
a callback behaves alike in both. A *rank callback* runs next to the model (in one process, or
on every rank of a gang) and gets a :class:`RankView`, which adds the model. The run's own
callbacks that need more (validation, checkpoints) are built with it by the trainer factory
(:func:`kgpipe.launch.build.build_trainer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from kgpipe.errors import KgpipeError
from kgpipe.training.records import EpochStats

__all__ = ["Callback", "LiveView", "NotInViewError", "RankView", "TrainerView", "ViewBase"]


@runtime_checkable
class TrainerView(Protocol):
    """Where training stands, read-only."""

    @property
    def epoch(self) -> int:
        """Epochs completed."""

    @property
    def global_step(self) -> int:
        """Steps completed over the whole run."""

    @property
    def epochs(self) -> int:
        """The run's target number of epochs (``training.epochs``)."""

    @property
    def steps_per_epoch(self) -> int: ...

    @property
    def total_steps(self) -> int:
        """``steps_per_epoch * epochs``."""

    @property
    def history(self) -> Sequence[EpochStats]:
        """The epochs completed so far (a resumed run includes those before the resume)."""

    @property
    def rank(self) -> int:
        """This trainer's rank in its gang (0 in one process; 0 on the driver of a gang)."""

    @property
    def world_size(self) -> int: ...


class Callback:
    """Hooks into the training loop; override what you need (all are no-ops)."""

    def on_train_start(self, trainer: TrainerView) -> None:
        """Before the first epoch of a segment."""

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        """Before an epoch (1-based ``epoch``)."""

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        """After a step: ``step`` of ``steps`` in this epoch, the step's mean loss."""

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        """After an epoch; may add to ``stats.extra``."""

    def on_train_end(self, trainer: TrainerView) -> None:
        """After the last epoch of a segment."""


_VIEW_FIELDS = (
    "epoch",
    "global_step",
    "epochs",
    "steps_per_epoch",
    "total_steps",
    "history",
    "rank",
    "world_size",
)


class NotInViewError(KgpipeError, AttributeError):
    """A callback asked for (or tried to set) something its view of training does not offer."""

    def __init__(self, name: str, write: bool = False) -> None:
        if write:
            msg = (
                f"trainer.{name} cannot be set: callbacks get a read-only view of training "
                f"({', '.join(_VIEW_FIELDS)})"
            )
        else:
            msg = (
                f"trainer.{name} is not available to callbacks, which get a read-only view of "
                f"training ({', '.join(_VIEW_FIELDS)}): on a Dask gang the model lives on the "
                "ranks, not where the callback runs. Code that needs the model belongs in a "
                "rank callback (rank_callbacks=...), which runs next to it on every rank and "
                "whose view also has `model`."
            )
        super().__init__(msg)
        self.name, self.write = name, write  # after AttributeError's own init, which sets name

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries (a failing rank)
        return (NotInViewError, (self.name, self.write))


class ViewBase:
    """Turns any attribute outside the view into :class:`NotInViewError`, and any attempt to
    set one (in one process and on a gang alike, so a callback that works in one works in the
    other). Private attributes (``_name``) are the view's own."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotInViewError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):
            raise NotInViewError(name, write=True)
        object.__setattr__(self, name, value)


class LiveView(ViewBase):
    """The view of a trainer in this process (reads through to it)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def epoch(self) -> int:
        return int(self._trainer.epoch)

    @property
    def global_step(self) -> int:
        return int(self._trainer.global_step)

    @property
    def epochs(self) -> int:
        return int(self._trainer.epochs)

    @property
    def steps_per_epoch(self) -> int:
        return int(self._trainer.steps_per_epoch)

    @property
    def total_steps(self) -> int:
        return int(self._trainer.total_steps)

    @property
    def history(self) -> Sequence[EpochStats]:
        return tuple(self._trainer.history)

    @property
    def rank(self) -> int:
        return int(self._trainer.rank)

    @property
    def world_size(self) -> int:
        return int(self._trainer.world_size)


class RankView(LiveView):
    """What a rank callback sees: the view, and the model it runs next to (read it; changing
    its tables changes training)."""

    @property
    def model(self) -> Any:
        return self._trainer.model
