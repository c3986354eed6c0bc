"""Rank callbacks for tests: fault injection (fail a rank on purpose) and a look at the model.

Product code has no test switches; a test passes these as ``rank_callbacks`` (shipped to every
rank of a gang by pickling, or run in-process next to the trainer).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import cloudpickle

from kgpipe.training.hooks import Callback, TrainerView
from kgpipe.training.records import EpochStats


class FaultAt(Callback):
    """At step ``step`` of epoch ``epoch`` on rank ``rank``: SIGKILL this (worker) process
    (``kind="kill"``), freeze it with SIGSTOP (``"stop"``: it stops heartbeating) or raise
    (``"raise"``) -- once: a marker file records that it fired (and when, as its last line), so
    the relaunched gang runs clean."""

    def __init__(self, kind: str, *, rank: int, epoch: int, step: int, marker: Path) -> None:
        if kind not in ("kill", "stop", "raise"):
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
        Path(self.marker).write_text(
            f"{self.kind} at {epoch}:{step} on rank {self.rank}\n{time.time()}\n"
        )
        if self.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault at epoch {epoch} step {step}")


class RecordModel(Callback):
    """Writes ``rank:entity rows x width`` of the model it runs next to, at the first epoch's
    end, into ``folder/model-<rank>`` (a rank callback's view has the model)."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        model = trainer.model  # type: ignore[attr-defined]
        rows, width = model.entity.shape
        Path(self.folder, f"model-{trainer.rank}").write_text(f"{trainer.rank}:{rows}x{width}")


class SlowShardWrites(Callback):
    """On rank ``rank``, every checkpoint file write (of ``epochs``, default all) first sleeps
    ``seconds`` (a slow object store), then waits until the file ``wait_for`` exists (up to a
    minute): patched into the rank's process at the start, restored at the end. With ``log``,
    each write appends ``written <epoch> <time>`` to that file when it ends, and each epoch
    ``started <epoch> <time>`` when it starts."""

    def __init__(
        self,
        *,
        rank: int,
        seconds: float,
        log: Path | None = None,
        epochs: tuple[int, ...] | None = None,
        wait_for: Path | None = None,
    ) -> None:
        self.rank = rank
        self.seconds = seconds
        self.log = str(log) if log is not None else None
        self.epochs = epochs
        self.wait_for = str(wait_for) if wait_for is not None else None
        self._original: object = None

    def _note(self, what: str) -> None:
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{what} {time.time()}\n")

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        if trainer.rank == self.rank:
            self._note(f"started {epoch}")

    def on_train_start(self, trainer: TrainerView) -> None:
        if trainer.rank != self.rank:
            return
        from kgpipe.checkpoint import CheckpointStore

        original = CheckpointStore.write_file
        seconds, epochs, wait_for = self.seconds, self.epochs, self.wait_for
        note = self._note

        def slow(store: CheckpointStore, epoch: int, *args: object, **kwargs: object) -> object:
            if epochs is None or epoch in epochs:
                time.sleep(seconds)
                deadline = time.monotonic() + 60
                while wait_for is not None and not os.path.exists(wait_for):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{wait_for} did not appear")
                    time.sleep(0.05)
            out = original(store, epoch, *args, **kwargs)  # type: ignore[arg-type]
            note(f"written {epoch}")
            return out

        self._original = original
        CheckpointStore.write_file = slow  # type: ignore[method-assign,assignment]

    def on_train_end(self, trainer: TrainerView) -> None:
        if self._original is not None:
            from kgpipe.checkpoint import CheckpointStore

            CheckpointStore.write_file = self._original  # type: ignore[method-assign,assignment]
            self._original = None


class PauseAt(Callback):
    """Every rank sleeps ``seconds`` when epoch ``epoch`` starts (so that a background commit
    of the epoch before has surely ended by that epoch's end)."""

    def __init__(self, *, epoch: int, seconds: float) -> None:
        self.epoch = epoch
        self.seconds = seconds

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        if epoch == self.epoch:
            time.sleep(self.seconds)


class FailShardWrite(Callback):
    """On rank ``rank``, the checkpoint file write of epoch ``epoch`` raises ``StorageFull`` (a
    full store): patched into the rank's process at the start, restored at the end."""

    def __init__(self, *, rank: int, epoch: int) -> None:
        self.rank = rank
        self.epoch = epoch
        self._original: object = None

    def on_train_start(self, trainer: TrainerView) -> None:
        if trainer.rank != self.rank:
            return
        from kgpipe.checkpoint import CheckpointStore
        from kgpipe.errors import StorageFull

        original = CheckpointStore.write_file
        failing = self.epoch

        def full(store: CheckpointStore, epoch: int, *args: object, **kwargs: object) -> object:
            if epoch == failing:
                raise StorageFull(f"no room left for epoch {epoch}'s shards (injected)")
            return original(store, epoch, *args, **kwargs)  # type: ignore[arg-type]

        self._original = original
        CheckpointStore.write_file = full  # type: ignore[method-assign,assignment]

    def on_train_end(self, trainer: TrainerView) -> None:
        if self._original is not None:
            from kgpipe.checkpoint import CheckpointStore

            CheckpointStore.write_file = self._original  # type: ignore[method-assign,assignment]
            self._original = None


# ship the classes themselves with pickled callbacks: worker processes need not import this module
class SeesSharedTriples(Callback):
    """At the start of training, each rank writes the names of the shared triples files in its
    machine's folder to ``folder/shared-<rank>`` (whether the gang mapped one copy)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_train_start(self, trainer: TrainerView) -> None:
        from kgpipe.data.shared_triples import shared_folder

        names = sorted(p.name for p in shared_folder().glob("*.npy"))
        Path(self.folder, f"shared-{trainer.rank}").write_text("\n".join(names))


cloudpickle.register_pickle_by_value(__import__(__name__))


class ThreadsSeen(Callback):
    """Writes the rank's torch thread count at each epoch's end to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        import torch

        Path(self.path).write_text(str(torch.get_num_threads()))


class CountSplitRanking(Callback):
    """Counts, on each rank, the blocks of a validation split over the gang's ranks and the
    widest of them (the candidates the rank scored), into ``folder/split-<rank>`` as
    ``calls widest``: a rank that ranked every entity itself would give the same metrics."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)

    def on_train_start(self, trainer: TrainerView) -> None:
        import kgpipe.evaluation as ev

        real, seen = ev.split_block_ranks, [0, 0]

        def counted(block, *args, **kwargs):  # type: ignore[no-untyped-def]
            seen[0] += 1
            seen[1] = max(seen[1], int(block.shape[1]))
            return real(block, *args, **kwargs)

        self._real, self._seen = real, seen
        ev.split_block_ranks = counted

    def on_train_end(self, trainer: TrainerView) -> None:
        import kgpipe.evaluation as ev

        ev.split_block_ranks = self._real  # the worker process runs later gangs
        calls, widest = self._seen
        Path(self.folder, f"split-{trainer.rank}").write_text(f"{calls} {widest}")
