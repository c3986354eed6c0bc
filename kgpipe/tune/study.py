"""The search: Optuna asks, trials run on Dask workers, Optuna is told.

:func:`run_study` keeps ``settings.workers`` trials in flight on a Dask cluster (each trial one
in-process kgpipe run on one worker, with the worker's share of the cores), or runs the trials
one after another from here when each trial is itself a gang (``distributed.workers > 1``).
The study lives in Optuna's RDB storage, so the search survives this process: run again, it
keeps every finished trial, continues the trials that were running (their run folders resume
from their last checkpoint) and samples only what the budget has left. A failing trial is
recorded as failed with its error; a trial whose worker died is run again (it resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.errors import ConfigError, SearchStopped
from kgpipe.tune.folder import StudyFolder, trial_run_config
from kgpipe.tune.settings import make_pruner, make_sampler
from kgpipe.tune.space import describe_values
from kgpipe.tune.track import StudyTracker
from kgpipe.tune.trial import (
    TrialOutcome,
    TrialSpec,
    recorded_outcome,
    run_trial,
    trial_threads,
)

__all__ = [
    "StudyEvent",
    "load_optuna_study",
    "run_study",
    "search_held",
    "trial_run_config",
]

Log = Callable[[str], None]


@dataclass
class StudyEvent:
    """A trial started or finished (``outcome`` set), for progress displays and artifacts."""

    kind: str  # started | finished
    number: int
    values: dict[str, Any]
    outcome: TrialOutcome | None = None
    study: Any = None  # the optuna.Study
    finished: int = 0  # trials finished in the study so far
    budget: int | None = None


@dataclass
class _Running:
    trial: Any
    values: dict[str, Any]
    spec: TrialSpec
    attempts: int = 0
    future: Any = None
    started: float = field(default_factory=time.time)


def _steps(base: RunConfig) -> tuple[int, int]:
    every = base.evaluation.every or base.training.epochs
    return every, base.training.epochs


def load_optuna_study(folder: StudyFolder) -> Any:
    """The folder's Optuna study (created on the first run)."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    first, last = _steps(folder.base)
    kwargs: dict[str, Any] = {}
    if folder.storage.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    storage = optuna.storages.RDBStorage(folder.storage, **kwargs)
    study = optuna.create_study(
        storage=storage,
        study_name=folder.name,
        direction="maximize",
        sampler=make_sampler(folder.settings),
        pruner=make_pruner(folder.settings, first_step=first, max_step=last),
        load_if_exists=True,
    )
    # an enqueued trial that never started (a search stopped before it) does not move the seed
    had = sum(t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False))
    if had:  # resumed: a seed of its own, or the random start-up would repeat its draws
        study.sampler = make_sampler(folder.settings, offset=had)
    return study


def _spec(folder: StudyFolder, trial: Any, config: RunConfig) -> TrialSpec:
    first, last = _steps(folder.base)
    return TrialSpec(
        number=trial.number,
        trial_id=trial._trial_id,
        config=config.model_dump(mode="json"),
        storage_options=config.given_storage_options(),
        study_name=folder.name,
        storage=folder.storage,
        pruner={**folder.settings.model_dump(mode="json"), "first_step": first, "max_step": last},
    )


@contextlib.contextmanager
def _cluster(folder: StudyFolder, gang: bool, log: Log) -> Iterator[Any]:
    if gang:  # each trial opens its own gang: the trials run one by one from here
        yield None
        return
    from kgpipe.distributed.client import open_cluster

    s = folder.settings
    with open_cluster(
        s.cluster,
        workers=s.workers,
        threads_per_worker=s.threads_per_worker,
        worker_ttl_s=folder.base.fault_tolerance.worker_ttl_s,
        # the base config's limit holds for each trial's worker (one trial per worker)
        memory_limit=folder.base.distributed.memory_limit_bytes,
        log=log,
    ) as client:
        yield client


def _tell(study: Any, run: _Running, outcome: TrialOutcome) -> None:
    from optuna.trial import TrialState

    trial = run.trial
    trial.set_user_attr("epochs", outcome.epochs)
    trial.set_user_attr("seconds", round(outcome.seconds, 3))
    trial.set_user_attr("best_epoch", outcome.best_epoch)
    # a pruned trial's value in Optuna is its last validation; the table shows its best
    trial.set_user_attr("best_valid_mrr", outcome.value)
    if outcome.url:
        trial.set_user_attr("run", outcome.url)
    if outcome.timed_out:  # slow, not judged worse: its best validation may win the study
        trial.set_user_attr("timed_out", True)
    if outcome.error:
        trial.set_user_attr("error", outcome.error[:2000])
    if outcome.state == "complete":
        study.tell(trial, outcome.value, skip_if_finished=True)
    elif outcome.state == "pruned":
        study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
    else:
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)


def _trim(folder: StudyFolder, study: Any, log: Log) -> None:
    """Free the disk of the finished trials that are not the best so far (``keep_trials``)."""
    from optuna.trial import TrialState

    from kgpipe.tune.results import best_trial

    best = best_trial(study)
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    finished = [t.number for t in study.get_trials(deepcopy=False, states=done)]
    try:
        folder.trim_trials(finished, keep=best[0].number if best else None)
    except OSError as err:  # housekeeping: never the end of a search
        log(f"could not trim the finished trials' run folders: {err}")


def _finished(study: Any) -> int:
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return len(study.get_trials(deepcopy=False, states=done))


def _orphans(study: Any) -> list[Any]:
    """Trials a killed search left running: continued, not repeated."""
    import optuna
    from optuna.trial import TrialState

    return [
        optuna.trial.Trial(study, t._trial_id)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    ]


def run_study(
    folder: StudyFolder,
    *,
    on_event: Callable[[StudyEvent], None] | None = None,
    log: Log | None = None,
    warn: Log | None = None,
) -> Any:
    """Run the search of ``folder`` until its budget is spent; returns the Optuna study. One
    search per study at a time: a second is refused (the study folder's lease), as a second
    writer of a run folder is."""
    with folder.lease():
        return search_held(folder, on_event=on_event, log=log, warn=warn)


def search_held(
    folder: StudyFolder,
    *,
    on_event: Callable[[StudyEvent], None] | None = None,
    log: Log | None = None,
    warn: Log | None = None,
) -> Any:
    """:func:`run_study` for a caller that holds the study's lease (:meth:`StudyFolder.lease`)."""
    folder.save_settings()  # a resume's new budget, now that this search holds the study
    return _search(folder, on_event=on_event, log=log, warn=warn)


def _search(
    folder: StudyFolder,
    *,
    on_event: Callable[[StudyEvent], None] | None,
    log: Log | None,
    warn: Log | None,
) -> Any:
    say = log or (lambda _m: None)
    emit = on_event or (lambda _e: None)
    s = folder.settings
    study = load_optuna_study(folder)
    if s.base_trial and not study.get_trials(deepcopy=False):
        say(folder.space.enqueue_base(study, folder.base))
    deadline = time.monotonic() + s.timeout_s if s.timeout_s else None
    gang = folder.base.distributed.uses_dask
    orphans = _orphans(study)
    if orphans:
        say(f"continuing {len(orphans)} trial(s) the last run left unfinished")
    running: dict[Any, _Running] = {}
    if s.keep_trials == "best":  # a resumed study given --keep-trials best trims at once
        _trim(folder, study, warn or say)
    if not orphans and not _budget_left(study, s, deadline, 0):
        say("the study's budget is spent: nothing to run (give --trials N in all, or --timeout)")
        return study
    tracker = StudyTracker.open(folder, study, warn or say)

    # the errors of the trials that failed in a row (latest last), and of the sampled configs
    # the config refused in a row (a space with many refused combinations is not broken: those
    # stop the search only at 10x the limit)
    failures: list[str] = []
    refused: list[str] = []
    stopped: list[str] = []  # why the search stopped sampling before its budget was spent

    def broken() -> str | None:
        if s.max_failures is None:
            return None
        if len(failures) >= s.max_failures:
            return f"{len(failures)} trials in a row failed (the last: {failures[-1]})"
        if len(refused) >= 10 * s.max_failures:
            return f"the last {len(refused)} sampled configs were refused (the last: {refused[-1]})"
        return None

    def budget_left() -> bool:
        if not _budget_left(study, s, deadline, len(running)):
            return False
        why = broken()
        if why is not None:  # something every trial shares is broken: stop sampling
            stopped[:] = [why]
            return False
        return True

    def count(outcome: TrialOutcome, *, sampled_config: bool = False) -> None:
        if outcome.state != "fail":
            failures.clear()
            refused.clear()
        else:
            first = (outcome.error or "no error recorded").splitlines()[0]
            (refused if sampled_config else failures).append(first)

    def prepare(trial: Any) -> _Running | None:
        values = trial.user_attrs.get("values") or {}
        pruned_at = trial.user_attrs.get("pruned_at")
        try:
            if "values" not in trial.user_attrs:
                values = folder.space.sample(trial, folder.base)
                trial.set_user_attr("values", values)
            threads = None if gang else trial_threads(s)
            config = trial_run_config(folder, trial.number, values, threads)
        except Exception as err:  # a sampled combination the config refuses (or a bug)
            error = str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
            outcome = TrialOutcome(trial.number, "fail", error=error)
            if tracker is not None:  # before the trial is told: its MLflow run id is kept on it
                tracker.refused(trial, values, error)
            _tell(study, _Running(trial, values, None), outcome)  # type: ignore[arg-type]
            count(outcome, sampled_config=True)
            emit(
                StudyEvent(
                    "finished", trial.number, values, outcome, study, _finished(study), s.trials
                )
            )
            say(f"trial {trial.number}: invalid config: {error}")
            return None
        run = _Running(trial, values, _spec(folder, trial, config))
        if pruned_at is not None and int(pruned_at) < config.training.epochs:
            # pruned, but the driver died before it was told: what its run folder recorded up
            # to then (its epochs count, MLflow logs it), not trained again. (Stopped at its
            # last epoch, it is complete: run_trial finds the finished run and says so.)
            say(f"trial {trial.number}: pruned at epoch {pruned_at} (recorded)")
            try:
                outcome = recorded_outcome(trial.number, config, int(pruned_at))
            except Exception as err:  # an unreadable metrics file must not stop every resume
                (warn or say)(f"trial {trial.number}: its recorded epochs are unreadable: {err}")
                outcome = TrialOutcome(trial.number, "pruned")
            finish(run, outcome)
            return None
        say(f"trial {trial.number}: {describe_values(values)}")
        emit(StudyEvent("started", trial.number, values, None, study, _finished(study), s.trials))
        return run

    def finish(run: _Running, outcome: TrialOutcome) -> None:
        if tracker is not None:  # before the trial is told: its MLflow run id is kept on it
            tracker.trial(run.trial, run.spec.config, outcome)
        _tell(study, run, outcome)
        count(outcome)
        if s.keep_trials == "best":
            _trim(folder, study, warn or say)
        shown = f"{outcome.value:.4f}" if outcome.value is not None else "-"
        say(
            f"trial {run.trial.number} {outcome.state}: valid MRR {shown} after {outcome.epochs} epochs"
            + (f" ({outcome.error.splitlines()[0]})" if outcome.error else "")
        )
        emit(
            StudyEvent(
                "finished", run.trial.number, run.values, outcome, study, _finished(study), s.trials
            )
        )

    with _ended_on_error(tracker), _cluster(folder, gang, say) as client:
        from distributed import wait

        def submit(run: _Running) -> None:
            run.attempts += 1
            if client is None:
                finish(run, run_trial(run.spec))
                return
            run.future = client.submit(
                run_trial,
                run.spec,
                key=f"trial-{run.spec.number}-{run.attempts}",
                pure=False,
                retries=0,
            )
            running[run.future] = run

        while True:
            while (client is None or len(running) < s.workers) and (orphans or budget_left()):
                trial = orphans.pop(0) if orphans else study.ask()
                run = prepare(trial)
                if run is not None:
                    submit(run)
            if not running:
                break
            done, _ = wait(list(running), return_when="FIRST_COMPLETED")
            for future in done:
                run = running.pop(future)
                try:
                    outcome = future.result()
                except (Exception, asyncio.CancelledError) as err:  # the worker died (or the
                    # task could not run; a cancelled future's error is a BaseException)
                    if run.attempts <= s.trial_retries:
                        say(
                            f"trial {run.trial.number}: {type(err).__name__}: {err}; running it again"
                        )
                        submit(run)
                        continue
                    outcome = TrialOutcome(
                        run.trial.number, "fail", error=f"{type(err).__name__}: {err}"
                    )
                finish(run, outcome)
        if stopped and broken() is not None:  # (a success after the stop clears it)
            raise SearchStopped(
                f"study {folder.name}: the search stopped because {broken()}; the study is "
                "kept: fix the cause and resume it"
            )
    return study


@contextlib.contextmanager
def _ended_on_error(tracker: StudyTracker | None) -> Iterator[None]:
    """A search that stops on an error (FAILED) or is interrupted (KILLED) ends its MLflow
    run so, instead of leaving it RUNNING."""
    try:
        yield
    except BaseException as err:
        if tracker is not None:
            if isinstance(err, Exception):
                tracker.end("FAILED")
            else:  # interrupted (Ctrl-C, SIGTERM): on its way out, waits at most 5 s
                tracker.end("KILLED", wait_s=5.0)
        raise


def _budget_left(study: Any, s: Any, deadline: float | None, running: int) -> bool:
    if deadline is not None and time.monotonic() >= deadline:
        return False
    return s.trials is None or _finished(study) + running < s.trials
