"""Training in segments: each ends at a validation epoch or the last epoch, with a commit.

One plan for every way of running: the in-process pipeline, the Dask launcher and the Prefect
flow all go through :func:`drive_segments`, which decides where segments end and when early
stopping ends the run; only *how* a segment is trained differs (a launcher call, a task).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.runs.folder import RunFolder

__all__ = [
    "SegmentResult",
    "committed_history",
    "drive_segments",
    "segment_ends",
    "should_stop",
    "validation_due",
]


@dataclass
class SegmentResult:
    """Where training stands after a segment (small; no tensors)."""

    epoch: int
    checkpoint: str
    history: list[dict[str, Any]]
    restarts: int
    # what a gang's launcher last said of it (workers, restarts, background commits): the next
    # segment's launcher says only what differs
    announced: tuple[int, int, bool] | None = None


def validation_due(epoch: int, every: int, last: int) -> bool:
    """Whether (1-based) ``epoch`` validates: every ``every`` epochs, and at the run's last
    epoch (``last``); never with ``every == 0``."""
    return bool(every) and (epoch % every == 0 or epoch == last)


def segment_ends(start: int, config: RunConfig) -> list[int]:
    """The epochs after ``start`` at which a segment ends: validation epochs and the last."""
    every, last = config.evaluation.every, config.training.epochs
    return [e for e in range(start + 1, last + 1) if e == last or validation_due(e, every, last)]


def should_stop(history: Sequence[dict[str, Any]], patience: int | None) -> bool:
    """Early stopping: the last ``patience`` validations brought no better valid MRR."""
    if not patience:
        return False
    scores = [float(h["valid_mrr"]) for h in history if "valid_mrr" in h]
    if len(scores) <= patience:
        return False
    return max(scores[-patience:]) <= max(scores[:-patience])


def committed_history(run: RunFolder) -> list[dict[str, Any]]:
    """The epoch history in the newest checkpoint manifest (empty when there is none); reads
    manifests only -- training verifies the state it resumes from."""
    committed = run.checkpoints().committed()
    return list(committed[-1].manifest["history"]) if committed else []


def drive_segments(
    run: RunFolder,
    train_until: Callable[[int], SegmentResult],
    *,
    log: Callable[[str], None] | None = None,
    stop: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Train ``run`` segment by segment with ``train_until(epoch)`` until its last epoch,
    early stopping, or ``stop(history)`` (asked after each segment: a search's pruner);
    returns the committed history and the gang restarts."""
    say = log or (lambda _msg: None)
    history = committed_history(run)
    restarts = 0
    if history and should_stop(history, run.config.evaluation.patience):
        # a resume of a run that early stopping ended (and that a crash or a kill interrupted
        # while it finished): training more would give another model than the run had
        say(f"early stopping had ended training after epoch {history[-1]['epoch']}")
        return history, restarts
    for end in segment_ends(run.resumed_epoch, run.config):
        segment = train_until(end)
        history, restarts = segment.history, segment.restarts
        # asked after every segment, the last and an early-stopped one too: a pruner records
        # each validation
        stopped = stop is not None and stop(history)
        if should_stop(history, run.config.evaluation.patience):
            say(f"early stopping after epoch {end}: no better valid MRR")
            break
        if stopped and end < run.config.training.epochs:
            say(f"stopped after epoch {end} (pruned)")
            break
    return history, restarts
