"""When a run folder may be continued with a given config, what it trains to, and when it must
refuse.

The rule: a resumed run trains what the run folder's ``config.yaml`` trains. Settings that do
not change the parameters (where and how the run executes: ``distributed``, ``checkpoint``,
``fault_tolerance``, ``evaluation`` and the process settings of ``training``) may change; the
rest may not (:func:`kgpipe.config.training_differences`).

The epoch target of a resumed run is the larger of the run's recorded ``training.epochs`` (its
``config.yaml``) and the count asked for:

* asking for **more** extends the run (``config.yaml`` records the new target before anything
  trains), allowed under a schedule whose rates do not depend on the run's length (constant,
  plateau), so the run ends as one started with the new count would;
* asking for **fewer** never shortens it: the run continues to its recorded target and says so.
  A plain resume after a crash during an extension (the original config file, the original
  count) therefore finishes the extension, and the folder's config, model, results and report
  always name the same last epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import RESUMABLE_CHANGES, RunConfig, training_differences
from kgpipe.errors import RunError
from kgpipe.runs.read import open_run
from kgpipe.storage import Store
from kgpipe.training.schedules import SCHEDULES

__all__ = ["Resume", "check_resumable", "with_epochs"]


@dataclass(frozen=True)
class Resume:
    """How a run folder continues: ``config`` is what it trains with (the given config, its
    ``training.epochs`` the target); ``extended_from`` is the recorded count when the run grows
    (``config.yaml`` must then be rewritten); ``note`` is said to the user when the target is not
    the count they gave."""

    config: RunConfig
    extended_from: int | None = None
    note: str | None = None


def with_epochs(config: RunConfig, epochs: int) -> RunConfig:
    """``config`` with ``training.epochs`` set to ``epochs``."""
    if config.training.epochs == epochs:
        return config
    training = config.training.model_copy(update={"epochs": epochs})
    return config.model_copy(update={"training": training})


def check_resumable(store: Store, config: RunConfig) -> Resume:
    """Refuse to continue the run folder in ``store`` with a config that trains something else;
    else say what the continued run trains to (see the module's rule)."""
    _, stored = open_run(store.url, config.run.storage_options)
    _check_shards(store, config)
    recorded, asked = stored.training.epochs, config.training.epochs
    if asked < recorded:
        config = with_epochs(config, recorded)
    differences = training_differences(stored, config)
    schedule = SCHEDULES.get(stored.training.schedule)
    if [key for key, _, _ in differences] == ["training.epochs"] and schedule.extendable:
        _check_extension(store, config, recorded)
        return Resume(config, extended_from=recorded)
    if differences:
        refused = [d for d in differences if d[0] != "training.epochs" or not schedule.extendable]
        listed = "; ".join(f"{key}: {old!r} in the run, {new!r} given" for key, old, new in refused)
        follows = [n for n in SCHEDULES if SCHEDULES.get(n).follows_validation]
        extendable = [n for n in SCHEDULES if SCHEDULES.get(n).extendable]
        raise RunError(
            f"{store.url}: this run folder exists and its config.yaml trains something else "
            f"({listed}); a run continues only with what it was started with. "
            f"{', '.join(RESUMABLE_CHANGES)} and training.threads/device/precision/allocator "
            "may change (but not distributed.sync, .compression, .topk_ratio or .staleness, "
            "which change what a gang trains; evaluation.every, .sampled and .candidates not "
            f"under training.schedule={'/'.join(follows)}, nor .sampled and .candidates under "
            "evaluation.patience), and "
            "training.epochs may grow under a "
            f"{' or '.join(extendable)} learning-rate schedule. For a new run choose another "
            "run.name, or --overwrite to replace this one"
        )
    note = None
    if asked < recorded:
        note = (
            f"{store.url}: continuing to the run's recorded target of {recorded} epochs (its "
            f"config.yaml); the given config asks for {asked}, and a resume never shortens a run"
        )
    return Resume(config, note=note)


def _check_shards(store: Store, config: RunConfig) -> None:
    """A sharded run's entities are permuted over ``distributed.entity_shards``: the number its
    latest checkpoint was written with is the one it resumes with (refused here, before a
    gang: each rank refused it, and each relaunch alike)."""
    if config.distributed.strategy != "sharded":
        return
    committed = CheckpointStore(store).committed()
    saved = committed[-1].manifest.get("entity_shards") if committed else None
    if saved is not None and int(saved) != config.distributed.entity_shards:
        raise RunError(
            f"{store.url}: its checkpoints were written with distributed.entity_shards={saved}, "
            f"this config has {config.distributed.entity_shards}; resume with "
            f"--set distributed.entity_shards={saved}"
        )


def _check_extension(store: Store, config: RunConfig, old_epochs: int) -> None:
    """Refuse to change ``training.epochs`` of a run that validated at its last epoch off the
    ``evaluation.every`` grid (a run ends with a validation) when validations steer training:
    a run started with the new count would not have made it, and under the plateau schedule it
    changes the learning rate, under early stopping when the run stops."""
    every = config.evaluation.every
    follows = SCHEDULES.get(config.training.schedule).follows_validation
    if not every or not (follows or config.evaluation.patience):
        return
    committed = CheckpointStore(store).committed()
    history = committed[-1].manifest["history"] if committed else []
    off_grid = [h["epoch"] for h in history if "valid_mrr" in h and h["epoch"] % every]
    if off_grid:
        steer = f"training.schedule={config.training.schedule}" if follows else "early stopping"
        raise RunError(
            f"{store.url}: cannot extend the run from {old_epochs} to "
            f"{config.training.epochs} epochs: it validated at epoch {off_grid[0]}, off the "
            f"evaluation.every={every} grid (its last epoch), and under {steer} that validation "
            "changes how the run goes on; start a new run with the new count"
        )
