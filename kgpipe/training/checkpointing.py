"""The training callback that commits checkpoints (in-process and on rank 0 of a gang)."""

from __future__ import annotations

from typing import Any

from kgpipe.checkpoint import CheckpointStore, CheckpointWriter
from kgpipe.training.trainer import Callback, EpochStats, Trainer

__all__ = ["CheckpointCallback"]


class CheckpointCallback(Callback):
    """Commits a checkpoint every ``every`` epochs and always at epoch ``until`` (the end of the
    segment being trained), after the other epoch-end callbacks (validation) have run.

    ``meta`` goes into every manifest (config hash, data fingerprint, world size, ...).
    """

    def __init__(
        self,
        checkpoints: CheckpointStore,
        *,
        every: int,
        until: int,
        meta: dict[str, Any],
        background: bool = True,
    ) -> None:
        self.every = every
        self.until = until
        self.meta = meta
        self.writer = CheckpointWriter(checkpoints, background=background)

    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
        if stats.epoch % self.every and stats.epoch != self.until:
            return
        meta = {**self.meta, "valid_mrr": stats.extra.get("valid_mrr")}
        self.writer.submit(trainer.state([*trainer.history, stats]), meta)

    def on_train_end(self, trainer: Trainer) -> None:
        self.writer.wait()

    def close(self) -> None:
        self.writer.close()
