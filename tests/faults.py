"""Fault injection for the fault-tolerance tests: rank callbacks that fail a rank on purpose.

Product code has no test switches; a test passes these as ``rank_callbacks`` (shipped to every
rank of a gang by pickling, or run in-process), and they act on one rank at one step.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import cloudpickle

from kgpipe.training.hooks import Callback, TrainerView


class FaultAt(Callback):
    """At step ``step`` of epoch ``epoch`` on rank ``rank``: SIGKILL this (worker) process
    (``kind="kill"``) or raise (``"raise"``) -- once: a marker file records that it fired, so
    the relaunched gang runs clean."""

    def __init__(self, kind: str, *, rank: int, epoch: int, step: int, marker: Path) -> None:
        if kind not in ("kill", "raise"):
            raise ValueError(kind)
        self.kind = kind
        self.rank = rank
        self.at = (epoch, step)
        self.marker = str(marker)

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        if trainer.rank != self.rank or (epoch, step) != self.at or os.path.exists(self.marker):
            return
        Path(self.marker).write_text(f"{self.kind} at {epoch}:{step} on rank {self.rank}\n")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault at epoch {epoch} step {step}")


# ship the class itself with the pickled callback: worker processes need not import this module
cloudpickle.register_pickle_by_value(__import__(__name__))
