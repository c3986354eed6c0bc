"""The driver side of distributed training: launch the gang, relay progress, recover from faults."""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from distributed import Client

from kgpipe.config import TrainingConfig
from kgpipe.distributed.cluster import worker_threads
from kgpipe.distributed.gang import GangError, launch_gang
from kgpipe.distributed.rank import RankSpec, rank_main
from kgpipe.errors import RunError
from kgpipe.training import Callback, EpochStats, Trainer

if TYPE_CHECKING:
    from kgpipe.run import StagedRun

__all__ = ["GangOutcome", "train_on_dask"]

log_warning = logging.getLogger("kgpipe.distributed").warning


@dataclass
class _GangView:
    """What driver-side callbacks see of a training that runs in the gang."""

    cfg: TrainingConfig
    total_steps: int
    global_step: int = 0
    epoch: int = 0
    history: list[EpochStats] = field(default_factory=list)


@dataclass
class GangOutcome:
    """How a segment went on the cluster."""

    epoch: int
    restarts: int
    world_size: int


def _alive(client: Client) -> int:
    return len(client.scheduler_info(n_workers=-1)["workers"])


def train_on_dask(
    run: StagedRun,
    *,
    until: int,
    client: Client,
    callbacks: Sequence[Callback] = (),
    log: Callable[[str], None] | None = None,
    restarts_so_far: int = 0,
) -> GangOutcome:
    """Train ``run`` to epoch ``until`` as a gang on ``client``'s cluster, from the latest
    committed checkpoint; rank 0 commits checkpoints as it goes.

    When the gang fails (a rank raises, a worker dies, a collective times out) the segment is
    relaunched from the latest committed checkpoint on the workers alive then, after waiting
    up to ``fault_tolerance.wait_for_workers_s`` for the cluster to heal, with exponential
    backoff, until ``fault_tolerance.max_restarts`` restarts of the run are used up.
    """
    say = log or (lambda _msg: None)
    config = run.config
    dcfg, ft = config.distributed, config.fault_tolerance
    checkpoints = run.checkpoints()
    restarts = restarts_so_far
    data = config.model_dump(mode="json")
    while True:
        found = checkpoints.resume_point()
        start = found[0].epoch if found else 0
        start_from = found[0].epoch if found else None
        history = found[1].history if found else []
        if start >= until:
            return GangOutcome(start, restarts, 0)
        world = min(dcfg.workers, _alive(client))
        steps = math.ceil(run.num_train / config.training.batch_size)
        if config.training.max_steps_per_epoch:
            steps = min(steps, config.training.max_steps_per_epoch)
        view = _GangView(config.training, total_steps=steps * config.training.epochs)
        view.global_step = found[0].global_step if found else 0
        view.epoch = start
        view.history = [EpochStats.from_dict(h) for h in history]
        for cb in callbacks:
            reset = getattr(cb, "reset", None)
            if reset is not None:
                reset(history)
        queue = f"kgpipe-progress-{uuid.uuid4().hex[:12]}"

        make_spec = functools.partial(
            _spec, run, data, queue=queue, world=world, start=start_from, until=until
        )

        on_event = _relay(view, callbacks, restarts)
        say(
            f"epochs {start + 1}..{until} on {world} Dask worker(s) (sync={dcfg.sync})"
            + (f", from the checkpoint of epoch {start}" if start else "")
        )
        try:
            for cb in callbacks:
                cb.on_train_start(cast(Trainer, view))
            launch_gang(
                client, rank_main, make_spec, world_size=world, queue=queue, on_event=on_event
            )
            for cb in callbacks:
                cb.on_train_end(cast(Trainer, view))
            return GangOutcome(until, restarts, world)
        except GangError as err:
            if not err.retryable:  # the same configuration would fail the same way again
                raise RunError(f"{run.url}: {err}") from None
            restarts += 1
            if restarts > ft.max_restarts:
                raise RunError(
                    f"{run.url}: training failed after {restarts - 1} restart(s), the "
                    f"fault_tolerance.max_restarts limit: {err}"
                ) from None
            delay = ft.restart_backoff_s * 2 ** (restarts - restarts_so_far - 1)
            log_warning(
                f"{err}; restart {restarts}/{ft.max_restarts} from the last committed "
                f"checkpoint in {delay:.1f} s"
            )
            say(f"restart {restarts}/{ft.max_restarts} after: {err}")
            time.sleep(delay)
            try:
                client.wait_for_workers(dcfg.workers, timeout=ft.wait_for_workers_s)
            except TimeoutError:
                if _alive(client) == 0:
                    raise RunError(f"{run.url}: no Dask worker is left after: {err}") from None
                say(f"going on with {_alive(client)} of {dcfg.workers} workers")


def _spec(
    run: StagedRun,
    data: dict[str, Any],
    rank: int,
    addr: str,
    port: int,
    *,
    queue: str,
    world: int,
    start: int | None,
    until: int,
) -> RankSpec:
    return RankSpec(
        config=data,
        run_url=run.url,
        storage_options=run.config.run.storage_options,
        rank=rank,
        world_size=world,
        master_addr=addr,
        master_port=port,
        num_entities=run.num_entities,
        num_relations=run.num_relations,
        queue=queue,
        threads=worker_threads(run.config.distributed),
        start_epoch=start,
        until=until,
        meta=run.manifest_meta(world),
    )


def _relay(
    view: _GangView, callbacks: Sequence[Callback], restarts: int
) -> Callable[[dict[str, Any]], None]:
    """Turn rank 0's queue events into driver-side callback calls."""
    as_trainer = cast(Trainer, view)

    def on_event(event: dict[str, Any]) -> None:
        view.global_step = event["global_step"]
        if event["type"] == "batch":
            for cb in callbacks:
                cb.on_batch_end(
                    as_trainer, event["epoch"], event["step"], event["steps"], event["loss"]
                )
        elif event["type"] == "epoch":
            stats = EpochStats.from_dict(event["stats"])
            stats.extra["restarts"] = restarts
            view.epoch = stats.epoch
            view.history.append(stats)
            for cb in callbacks:
                cb.on_epoch_end(as_trainer, stats)

    return on_event
