"""When a run folder may be resumed with a given config, and when it must refuse.

The rule: a resumed run must train what the run folder's ``config.yaml`` trains. Settings that
do not change the parameters (where and how the run executes: ``distributed``, ``checkpoint``,
``fault_tolerance``, ``evaluation`` and the process settings of ``training``) may change; the
rest may not (:func:`kgpipe.config.training_differences`). One exception: ``training.epochs``
may change under a schedule whose rates do not depend on the run's length (constant, plateau),
so a finished run can train further and end as a run started with the new count would.
"""

from __future__ import annotations

from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import RESUMABLE_CHANGES, RunConfig, training_differences
from kgpipe.errors import RunError
from kgpipe.runs.read import open_run
from kgpipe.storage import Store
from kgpipe.training.schedules import SCHEDULES

__all__ = ["check_resumable"]


def check_resumable(store: Store, config: RunConfig) -> int | None:
    """Refuse to resume the run folder in ``store`` with a config that trains something else.
    Returns the stored epoch count when the only change is an allowed ``training.epochs``."""
    _, stored = open_run(store.url, config.run.storage_options)
    differences = training_differences(stored, config)
    old_epochs = stored.training.epochs
    schedule = SCHEDULES.get(stored.training.schedule)
    if [key for key, _, _ in differences] == ["training.epochs"] and schedule.extendable:
        _check_extension(store, config, old_epochs)
        return old_epochs
    if differences:
        listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in differences)
        follows = [n for n in SCHEDULES if SCHEDULES.get(n).follows_validation]
        extendable = [n for n in SCHEDULES if SCHEDULES.get(n).extendable]
        raise RunError(
            f"{store.url}: cannot resume: the config differs from the run's config.yaml in "
            f"what is trained ({listed}). Only {', '.join(RESUMABLE_CHANGES)} and "
            "training.threads/device/precision/allocator may change (evaluation.every and "
            f".sampled not under training.schedule={'/'.join(follows)}), and training.epochs "
            f"under a {' or '.join(extendable)} learning-rate schedule"
        )
    return None


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
            f"{store.url}: cannot change training.epochs from {old_epochs} to "
            f"{config.training.epochs}: the run validated at epoch {off_grid[0]}, off the "
            f"evaluation.every={every} grid (its last epoch), and under {steer} that validation "
            "changes how the run goes on; start a new run with the new count"
        )
