"""A whole run without Prefect: stage, train segment by segment, finish -- the library's entry.

``train(config)`` = :func:`~kgpipe.runs.stage.prepare_run` (stage or resume) → a launcher (this
process, or a gang on the configured Dask cluster) → :func:`~kgpipe.runs.segments.drive_segments`
→ :func:`~kgpipe.runs.finish.finish_run` (final model, test metrics, embeddings), mirrored into
MLflow under ``tracking.backend: mlflow`` (:mod:`kgpipe.tracking`). The Prefect flow
(``flows/train.py``) composes the same steps as tasks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distributed import Client

from kgpipe.config import RunConfig
from kgpipe.evaluation import ProgressFn
from kgpipe.launch.base import Launcher
from kgpipe.launch.dask import DaskLauncher, open_run_cluster
from kgpipe.launch.in_process import InProcessLauncher
from kgpipe.process import check_not_reimported
from kgpipe.runs.finish import finish_run
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.segments import SegmentResult, drive_segments
from kgpipe.runs.stage import check_processes, prepare_run, run_lease
from kgpipe.tracking import check_tracking, track_run
from kgpipe.training.hooks import Callback
from kgpipe.training.records import EpochStats

__all__ = ["RunResult", "make_launcher", "train"]

Log = Callable[[str], None]


@dataclass
class RunResult:
    """What :func:`train` produced."""

    url: str
    config: RunConfig
    history: list[EpochStats]
    results: dict[str, Any] | None
    seconds: float


def make_launcher(
    run: RunFolder,
    *,
    client: Client | None = None,
    callbacks: Sequence[Callback] = (),
    rank_callbacks: Sequence[Callback] = (),
    log: Log | None = None,
    restarts: int = 0,
    after: SegmentResult | None = None,
) -> Launcher:
    """The launcher of ``run``: a gang on ``client``'s cluster when the config trains on Dask
    (``distributed.uses_dask``), else this process. It logs what trains and where, unless it
    goes on ``after`` a segment of the same command (then only what changed since)."""
    if run.config.distributed.uses_dask:
        if client is None:
            raise ValueError("a Dask run needs the client of its cluster")
        return DaskLauncher(
            run,
            client,
            callbacks=callbacks,
            rank_callbacks=rank_callbacks,
            log=log,
            restarts=restarts,
            after=after,
        )
    return InProcessLauncher(
        run, callbacks=callbacks, rank_callbacks=rank_callbacks, log=log, after=after
    )


def train(
    config: RunConfig,
    *,
    callbacks: Sequence[Callback] = (),
    rank_callbacks: Sequence[Callback] = (),
    overwrite: bool = False,
    resume: bool = False,
    log: Log | None = None,
    eval_progress: ProgressFn | None = None,
    holder: str = "a kgpipe run",
    stop: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> RunResult:
    """Train, evaluate and export one run without Prefect; returns where it went and the results.

    ``resume`` continues the run folder's latest committed checkpoint (if the folder exists).
    ``callbacks`` see a read-only view of training wherever it runs; ``rank_callbacks`` run next
    to the model (on every rank of a gang, so they must pickle). Bad input (data, config, an
    existing run folder without ``overwrite``/``resume``, another writer holding the run
    folder's lease) raises a :class:`~kgpipe.errors.KgpipeError` before anything is written.
    ``holder`` names this writer to a second one that is refused. ``stop`` is asked after
    each segment (with the committed history) whether to end training there, besides early
    stopping (a hyperparameter search prunes trials with it).

    Under ``tracking.backend: mlflow`` the run is mirrored into an MLflow run (continued when
    the run resumes); a tracking server that does not answer fails the call before anything
    is written.
    """
    check_not_reimported("kgpipe.pipeline.train")
    check_processes(config)  # before the lease, which writes to the run folder
    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    if resume:
        config.check_resumable()
    config = config.with_run_name()
    check_tracking(config.tracking)  # an MLflow server that does not answer: before any work
    with (
        run_lease(config, holder=f"{holder} (kgpipe.pipeline.train)") as lease,
        contextlib.ExitStack() as tracked,
    ):
        run = prepare_run(config, overwrite=overwrite, resume=resume, log=say)
        run.lease = lease.handle
        tracker = tracked.enter_context(track_run(run, log=say))
        ours = [*callbacks, tracker] if tracker is not None else list(callbacks)
        with contextlib.ExitStack() as stack:
            client = None
            if run.config.distributed.uses_dask:
                client = stack.enter_context(open_run_cluster(run.config, log=say))
            launcher = make_launcher(
                run, client=client, callbacks=ours, rank_callbacks=rank_callbacks, log=say
            )
            stack.callback(launcher.close)
            history, restarts = drive_segments(run, launcher.train_until, log=say, stop=stop)
            # a sharded run's test split, ranked by its gang while the cluster is up
            tested = launcher.test_split(eval_progress)
        results = finish_run(
            run,
            history=history,
            restarts=restarts,
            seconds=time.perf_counter() - t_start,
            log=say,
            eval_progress=eval_progress,
            tested=tested,
        )
        if tracker is not None:  # test metrics, then the report and curve
            tracker.finish(results, history, seconds=time.perf_counter() - t_start)
    return RunResult(
        run.url,
        run.config,
        [EpochStats.from_dict(h) for h in history],
        results,
        time.perf_counter() - t_start,
    )
