"""The launcher protocol: what the pipeline (and the Prefect flow) needs of a way to train."""

from __future__ import annotations

from typing import Any, Protocol

from kgpipe.evaluation import ProgressFn
from kgpipe.runs.segments import SegmentResult

__all__ = ["Launcher"]


class Launcher(Protocol):
    """Trains a staged run segment by segment, each ending with a committed checkpoint."""

    @property
    def restarts(self) -> int:
        """Gang relaunches of this run so far (0 in one process)."""

    def train_until(self, until: int) -> SegmentResult:
        """Train from the latest committed checkpoint to epoch ``until`` (committed)."""

    def test_split(self, progress: ProgressFn | None = None) -> dict[str, Any] | None:
        """The test metrics of the finished run's chosen checkpoint ranked where the model is
        spread (a sharded gang), for :func:`~kgpipe.runs.finish.finish_run`; None: the driver
        ranks it there."""

    def close(self) -> None:
        """Release what training holds (a pending background upload, its thread)."""
