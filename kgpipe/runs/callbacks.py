"""The callbacks that write a run's records: metrics, validation, checkpoints.

The factory (:func:`kgpipe.launch.build.build_trainer`) builds them with what they need (the
model to validate, the trainer's state to commit) and puts them in their one fixed order, after
the thread governor's ticker (which records the epoch's thread count): validation (it adds
``valid_*`` to the epoch's stats), then the checkpoint (its manifest records them), then the
metrics and progress that report the epoch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from torch import Tensor

from kgpipe.checkpoint import Checkpoint, CheckpointStore, TrainState
from kgpipe.config import RunConfig
from kgpipe.errors import KgpipeError
from kgpipe.evaluation import FilterIndex, evaluate
from kgpipe.models.model import KGEModel
from kgpipe.query_candidates import Candidates
from kgpipe.runs.folder import METRICS
from kgpipe.runs.segments import validation_due
from kgpipe.storage import Store
from kgpipe.training.hooks import Callback, TrainerView
from kgpipe.training.records import EpochStats

__all__ = [
    "BackgroundCommits",
    "CheckpointCallback",
    "CheckpointWriter",
    "MetricsWriter",
    "Validation",
]

log = logging.getLogger("kgpipe.checkpoint")
T = TypeVar("T")


class MetricsWriter(Callback):
    """Rewrites ``metrics.jsonl`` after every epoch (object stores cannot append)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lines: list[str] = []

    def reset(self, history: Sequence[EpochStats | dict[str, Any]]) -> None:
        """Start again from a checkpoint's history (epochs after it are trained again)."""
        self.lines = [json.dumps(h.as_dict() if isinstance(h, EpochStats) else h) for h in history]

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        self.lines.append(json.dumps(stats.as_dict()))
        self.store.write_text(METRICS, "\n".join(self.lines) + "\n")


class Validation(Callback):
    """Filtered validation of ``model`` when due; adds ``valid_*`` entries to the epoch stats.

    ``tick`` is called between evaluation chunks (the thread governor's, so that a long
    validation adapts to a neighbour too). ``part``: ``(rank, world)`` when every rank of a
    gang validates, each scoring its range of entities (:func:`~kgpipe.evaluation.evaluate`).
    ``evaluator`` replaces that function (same keywords; a sharded gang's scores its shards)."""

    def __init__(
        self,
        model: KGEModel,
        valid: Tensor,
        index: FilterIndex,
        config: RunConfig,
        *,
        tick: Callable[[], None] | None = None,
        part: tuple[int, int] = (0, 1),
        evaluator: Callable[..., dict[str, Any]] | None = None,
        candidates: Candidates | None = None,
    ) -> None:
        self.model = model
        self.part = part
        self.evaluator = evaluator
        self.valid = valid
        self.index = index
        self.cfg = config.evaluation
        self.candidates = candidates
        self.total_epochs = config.training.epochs
        self.tick = tick

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        if not validation_due(stats.epoch, self.cfg.every, self.total_epochs):
            return
        if self.valid.numel() == 0:
            return
        t0 = time.perf_counter()
        tick = self.tick
        progress = (lambda _done, _total: tick()) if tick is not None else None
        if self.evaluator is not None:
            m = self.evaluator(
                self.valid,
                self.index,
                batch_size=self.cfg.batch_size,
                sampled=self.cfg.sampled,
                progress=progress,
                candidates=self.candidates,
            )
        else:
            m = evaluate(
                self.model,
                self.valid,
                self.index,
                batch_size=self.cfg.batch_size,
                sampled=self.cfg.sampled,
                progress=progress,
                part=self.part,
                candidates=self.candidates,
            )
        keys = ("mrr", "mr", "hits@1", "hits@3", "hits@10")
        stats.extra.update({f"valid_{k}": m[k] for k in keys})
        stats.extra["valid_candidates"] = m["candidates"]
        stats.extra["valid_ranks"] = self.part[1]  # ranks that shared the scoring
        stats.extra["valid_seconds"] = time.perf_counter() - t0


class CheckpointCallback(Callback):
    """Commits a checkpoint every ``every`` epochs and always at epoch ``until`` (the end of the
    segment being trained), after the validation has run.

    ``state`` gives the trainer's resumable state for a history; ``meta`` goes into every
    manifest (config hash, data fingerprint, world size, ...).
    """

    def __init__(
        self,
        checkpoints: CheckpointStore,
        state: Callable[[Sequence[EpochStats]], TrainState],
        *,
        every: int,
        until: int,
        meta: dict[str, Any],
        background: bool = True,
    ) -> None:
        self.state = state
        self.every = every
        self.until = until
        self.meta = meta
        self.writer = CheckpointWriter(checkpoints, background=background)

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        self.writer.check()  # a failed upload ends the segment now
        if stats.epoch % self.every and stats.epoch != self.until:
            return
        meta = {**self.meta, "valid_mrr": stats.extra.get("valid_mrr")}
        # the segment's last commit is waited for at once: no copy of the state for it
        last = stats.epoch == self.until
        self.writer.submit(self.state([*trainer.history, stats]), meta, wait=last)

    def on_train_end(self, trainer: TrainerView) -> None:
        self.writer.wait()

    def close(self, timeout: float | None = None) -> None:
        """Finish the upload in flight (waiting at most ``timeout``) and stop the thread."""
        self.writer.close(timeout)


class BackgroundCommits(Generic[T]):
    """Runs ``commit(state, extra)`` in a background thread when asked, one at a time.

    :meth:`submit` copies the state and returns at once (background) or commits it (``wait``,
    or without a thread). A second submit waits for the first commit, so at most one copy is
    held. A background commit's error is raised by the next :meth:`check` (a single writer
    calls it at every epoch's end: a failed upload stops training at the next epoch, not at
    the next commit ``checkpoint.every`` epochs later), :meth:`submit`, :meth:`wait` or
    :meth:`close`.
    """

    def __init__(
        self, commit: Callable[[TrainState, Any], T], *, background: bool, name: str
    ) -> None:
        self.commit = commit
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name) if background else None
        self._pending: Future[T] | None = None

    def submit(self, state: TrainState, extra: Any, *, wait: bool = False) -> T | None:
        """Commit ``state``; returns the result of a commit made at once (None: in flight)."""
        self.wait()
        if self._pool is None or wait:
            return self.commit(state, extra)
        self._pending = self._pool.submit(self.commit, state.snapshot(), extra)
        return None

    def check(self) -> T | None:
        """Raise the error of a commit that has failed, without waiting for one still
        running; returns the result of one that has finished (None: none has)."""
        if self._pending is not None and self._pending.done():
            return self.wait()
        return None

    @property
    def in_flight(self) -> bool:
        """Whether a background commit was submitted and its outcome not yet taken (true
        after it ended, until :meth:`check`, :meth:`submit`, :meth:`wait` or :meth:`close`)."""
        return self._pending is not None

    def failed(self) -> bool:
        """Whether the commit in flight has ended with an error (without waiting for it)."""
        pending = self._pending
        return pending is not None and pending.done() and pending.exception() is not None

    def wait(self, timeout: float | None = None) -> T | None:
        """Block until the commit in flight is done (at most ``timeout``: then
        ``TimeoutError``); returns its result, raises its error (None: none was in flight)."""
        pending, self._pending = self._pending, None
        return pending.result(timeout) if pending is not None else None

    def close(self, timeout: float | None = None) -> T | None:
        """:meth:`wait`, then stop the thread; a commit still running after ``timeout`` is
        left to end on its own."""
        pending = self._pending
        try:
            return self.wait(timeout)
        finally:
            if self._pool is not None:
                done = pending is None or pending.done()
                self._pool.shutdown(wait=done, cancel_futures=True)


class CheckpointWriter(BackgroundCommits[Checkpoint]):
    """Commits (and then prunes) the checkpoints of one process, or of rank 0 of a replicated
    gang, in a background thread when asked, one at a time."""

    def __init__(self, checkpoints: CheckpointStore, *, background: bool = True) -> None:
        super().__init__(self._commit, background=background, name="kgpipe-ckpt")
        self.checkpoints = checkpoints

    def _commit(self, state: TrainState, meta: dict[str, Any]) -> Checkpoint:
        ckpt = self.checkpoints.save(state, meta)
        try:
            self.checkpoints.prune()
        except KgpipeError as err:  # retention is housekeeping: never fail training for it
            log.warning("checkpoint retention: %s", err)
        return ckpt
