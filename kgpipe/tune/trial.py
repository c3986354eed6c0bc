"""One trial: a kgpipe run, trained where it is sent (a Dask worker, or this process).

:func:`run_trial` takes plain data and returns plain data, so it pickles to any worker. It
reports each validation's MRR to the study (Optuna's RDB storage, reached from the worker) and
stops the run when the study's pruner says so -- the segment stop rule of every kgpipe run,
driven by the study. It never raises for a failing trial: the error comes back as data, so
that the study records the trial as failed and goes on.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.errors import Diverged, KgpipeError
from kgpipe.runs.lease import RunFolderBusy
from kgpipe.training.hooks import Callback, TrainerView

__all__ = ["TrialOutcome", "TrialSpec", "run_trial", "trial_threads"]

log = logging.getLogger("kgpipe.tune")

_BUSY_WAIT_S = 5.0  # between looks at a trial's run folder that another writer holds


@dataclass(frozen=True)
class TrialSpec:
    """What a worker needs to run trial ``number``."""

    number: int
    trial_id: int
    config: dict[str, Any]  # the trial's run config (JSON mode)
    study_name: str
    storage: str  # Optuna RDB URL
    pruner: dict[str, Any] = field(default_factory=dict)  # TuneSettings fields + steps
    #: the run and data storage options with their credentials (the JSON config has none)
    storage_options: dict[str, dict[str, Any]] | None = None


@dataclass
class TrialOutcome:
    """What came of a trial."""

    number: int
    state: str  # complete | pruned | fail
    value: float | None = None  # best valid MRR
    best_epoch: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    url: str | None = None
    seconds: float = 0.0
    resumed_from: int = 0
    timed_out: bool = False  # stopped by the trial time limit (not by the pruner's rule)

    @property
    def epochs(self) -> int:
        return len(self.history)


class TrialTimedOut(KgpipeError):
    """A trial trained past the search's ``trial_timeout_s``."""


class _Deadline(Callback):
    """Ends training at the first step ``limit_s`` seconds after training started."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.deadline: float | None = None

    def on_train_start(self, trainer: TrainerView) -> None:
        if self.deadline is None:  # the first segment: staging does not count
            self.deadline = time.monotonic() + self.limit_s

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TrialTimedOut(f"stopped in epoch {epoch}: past the trial time limit")


def _run_url(config: RunConfig) -> str:
    from kgpipe.runs.folder import run_store

    return run_store(config).url


def _recorded_history(config: RunConfig) -> list[dict[str, Any]]:
    """The epochs a stopped trial recorded (its metrics file)."""
    import json

    from kgpipe.runs.folder import METRICS, run_store

    store = run_store(config)
    if not store.exists(METRICS):
        return []
    return [json.loads(line) for line in store.read_text(METRICS).splitlines() if line.strip()]


def recorded_outcome(number: int, config: RunConfig, pruned_at: int) -> TrialOutcome:
    """Trial ``number``, which the pruner stopped at epoch ``pruned_at`` before its driver
    died: the validations its run folder recorded up to that epoch."""
    named = config.with_run_name()
    out = TrialOutcome(number, "pruned", url=_run_url(named))
    out.history = [h for h in _recorded_history(named) if int(h["epoch"]) <= pruned_at]
    _score(out)
    return out


def _study_trial(spec: TrialSpec) -> Any:
    import optuna

    from kgpipe.tune.settings import TuneSettings, make_pruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    p = dict(spec.pruner)
    first, last = int(p.pop("first_step", 1)), int(p.pop("max_step", 100))
    pruner = make_pruner(TuneSettings.model_validate(p), first_step=first, max_step=last)
    storage = optuna.storages.RDBStorage(
        spec.storage,
        engine_kwargs={"connect_args": {"timeout": 60}}
        if spec.storage.startswith("sqlite")
        else None,
    )
    study = optuna.load_study(study_name=spec.study_name, storage=storage, pruner=pruner)
    return optuna.trial.Trial(study, spec.trial_id)


def trial_threads(settings: Any) -> int | None:
    """A trial's torch threads: the share of this machine's cores of a cluster started here;
    on a scheduler's workers (other hosts) the worker's own count (None: set in the trial)."""
    from kgpipe.distributed.clusters import worker_threads

    if settings.cluster != "local" and not settings.threads_per_worker:
        return None
    return worker_threads(settings.workers, settings.threads_per_worker)


def _sized(config: RunConfig) -> RunConfig:
    """A trial on a scheduler's worker without a thread count takes the worker's (sized on
    its host; the driver's core count gave 32-core workers 1 thread each)."""
    from kgpipe.launch.rank import rank_threads

    threads = config.training.threads or rank_threads(None)
    if threads == config.training.threads:
        return config
    return config.model_copy(
        update={"training": config.training.model_copy(update={"threads": threads})}
    )


def run_trial(spec: TrialSpec) -> TrialOutcome:
    """Train trial ``spec`` (resuming its run folder when it has one) and say how it went."""
    from kgpipe.pipeline import train

    t0 = time.perf_counter()
    out = TrialOutcome(spec.number, "fail")
    try:
        config = RunConfig.model_validate(spec.config)
        if spec.storage_options is not None:
            config = config.with_storage_options(spec.storage_options)
        config = _sized(config)
        pruned: dict[str, Any] = {"at": None, "trial": None}

        def stop(history: list[dict[str, Any]]) -> bool:
            last = history[-1] if history else {}
            if "valid_mrr" not in last:
                return False
            if pruned["trial"] is None:  # the study is reached at the first validation
                pruned["trial"] = _study_trial(spec)
            trial = pruned["trial"]
            trial.report(float(last["valid_mrr"]), step=int(last["epoch"]))
            if trial.should_prune():
                pruned["at"] = int(last["epoch"])
                # kept in the study: a driver that dies before it tells the trial does not
                # train it again on resume
                trial.set_user_attr("pruned_at", pruned["at"])
                return True
            return False

        limit = spec.pruner.get("trial_timeout_s")
        callbacks = [_Deadline(float(limit))] if limit else []
        holder, waited = f"trial {spec.number} of study {spec.study_name}", False
        while True:
            try:
                result = train(config, resume=True, stop=stop, callbacks=callbacks, holder=holder)
                break
            except RunFolderBusy as err:
                # this trial still trains elsewhere: a worker of a cluster that outlived a
                # killed search (Dask cannot stop a running task), or one another host ran
                # before it died (its lease expires in fault_tolerance.lease_ttl_s). Going on
                # when it ends (or expires) repeats nothing: the run resumes from its folder.
                # Any other writer is an error, as for any run
                if not err.holder.startswith(holder + " "):
                    raise
                if not waited:
                    log.warning("%s; waiting for it to end (this trial goes on from there)", err)
                waited = True
                time.sleep(_BUSY_WAIT_S)
    except (TrialTimedOut, Diverged) as err:  # pruned by the clock, or a sampled config that
        # diverged (pruned, not failed, so that the sampler learns from it: Optuna's samplers
        # do not model failed trials): scored by what it validated so far
        named = config.with_run_name()
        out.history = _recorded_history(named)
        out.error = str(err)
        out.timed_out = isinstance(err, TrialTimedOut)
        out.url = _run_url(named)  # its committed checkpoints hold what it validated
        out.seconds = time.perf_counter() - t0
        _score(out)
        out.state = "pruned"
        return out
    except KgpipeError as err:
        out.error = str(err)
        out.seconds = time.perf_counter() - t0
        return out
    except Exception as err:  # a trial's bug or a bad combination: recorded, not fatal
        tb = traceback.format_exception(type(err), err, err.__traceback__, limit=-3)
        out.error = f"{type(err).__name__}: {err}\n{''.join(tb)}"
        out.seconds = time.perf_counter() - t0
        return out
    history = [h.as_dict() for h in result.history]
    out.history = history
    out.url = result.url
    out.seconds = time.perf_counter() - t0
    if not _score(out):
        out.error = "the trial validated nothing: a search needs validation triples (data.valid)"
        return out
    last_epoch = int(history[-1]["epoch"])
    out.state = (
        "pruned" if pruned["at"] is not None and last_epoch < config.training.epochs else "complete"
    )
    return out


def _score(out: TrialOutcome) -> bool:
    """Set the outcome's value to its best validation (and its epoch); False without one."""
    scored = [(float(h["valid_mrr"]), int(h["epoch"])) for h in out.history if "valid_mrr" in h]
    if not scored:
        return False
    out.value, out.best_epoch = max(scored, key=lambda s: (s[0], -s[1]))
    return True
