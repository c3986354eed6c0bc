"""The Dask launcher: trains each segment as a gang of ranks, relays progress, recovers.

The driver launches one rank per worker (:mod:`kgpipe.distributed.gang`), relays rank 0's
progress events to the caller's callbacks through a read-only :class:`GangView`, and when the
gang fails relaunches the segment from the last committed checkpoint on the workers alive.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from distributed import Client

from kgpipe.config import RunConfig
from kgpipe.devices import device_identity, shared_devices
from kgpipe.distributed.client import open_cluster
from kgpipe.distributed.clusters import CLUSTERS, worker_threads
from kgpipe.distributed.gang import GangError, launch_gang, live_workers
from kgpipe.errors import ConfigError, RunError
from kgpipe.evaluation import ProgressFn
from kgpipe.launch.memory import check_test_gang, check_training_gang, gang_workers
from kgpipe.launch.rank import RankSpec, rank_main
from kgpipe.launch.rank_test import rank_test
from kgpipe.runs.callbacks import MetricsWriter
from kgpipe.runs.finish import chosen_checkpoint
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.segments import SegmentResult
from kgpipe.training.hooks import Callback, ViewBase
from kgpipe.training.records import EpochStats

__all__ = ["DaskLauncher", "GangView", "connect", "open_run_cluster"]

log_warning = logging.getLogger("kgpipe.distributed").warning


@contextlib.contextmanager
def open_run_cluster(
    config: RunConfig,
    *,
    extra_env: dict[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> Iterator[Client]:
    """The Dask cluster of ``config`` (``distributed``), for the length of a ``with`` block."""
    dcfg = config.distributed
    with open_cluster(
        dcfg.cluster, workers=dcfg.workers, threads_per_worker=dcfg.threads_per_worker,
        worker_ttl_s=config.fault_tolerance.worker_ttl_s, extra_env=extra_env,
        memory_limit=dcfg.memory_limit_bytes, log=log,
    ) as client:  # fmt: skip
        yield client


@contextlib.contextmanager
def connect(address: str) -> Iterator[Client]:
    """A client of the scheduler at ``address``: this process's default client when it is
    connected there (the cluster a flow holds open), else a new connection closed afterwards."""
    from distributed import default_client

    try:
        current = default_client()
    except ValueError:
        current = None
    scheduler = current.scheduler if current is not None else None
    if current is not None and scheduler is not None and str(scheduler.address) == address:
        yield current
        return
    with Client(address, timeout=30) as client:
        yield client


class GangView(ViewBase):
    """What driver-side callbacks see of a training that runs in the gang: where it stands, as
    rank 0 reports it; read-only (anything else, or a write, raises a clear error, as in one
    process). The driver updates it through :meth:`_update`."""

    def __init__(
        self, *, epochs: int, epoch: int, global_step: int, world_size: int,
        history: list[EpochStats],
    ) -> None:  # fmt: skip
        self._epochs, self._epoch, self._global_step = epochs, epoch, global_step
        self._world_size, self._history, self._steps_per_epoch = world_size, history, 0

    def _update(self, **fields: int) -> None:
        for name, value in fields.items():
            setattr(self, f"_{name}", value)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def global_step(self) -> int:
        return self._global_step

    @property
    def epochs(self) -> int:
        return self._epochs

    @property
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch

    @property
    def total_steps(self) -> int:
        return self._steps_per_epoch * self._epochs

    @property
    def history(self) -> Sequence[EpochStats]:
        return tuple(self._history)

    @property
    def rank(self) -> int:
        return 0  # the driver speaks for rank 0

    @property
    def world_size(self) -> int:
        return self._world_size


def _alive(client: Client) -> int:
    return len(live_workers(client))


class DaskLauncher:
    """Trains ``run`` segment by segment as a gang on ``client``'s cluster; ``callbacks`` run
    here on relayed events, ``rank_callbacks`` are shipped to every rank (they must pickle)."""

    def __init__(
        self,
        run: RunFolder,
        client: Client,
        *,
        callbacks: Sequence[Callback] = (),
        rank_callbacks: Sequence[Callback] = (),
        log: Callable[[str], None] | None = None,
        restarts: int = 0,
        after: SegmentResult | None = None,
    ) -> None:
        self.run, self.client, self.writer = run, client, MetricsWriter(run.store)
        self.callbacks: list[Callback] = [self.writer, *callbacks]
        self.rank_callbacks = tuple(rank_callbacks)
        self.say = log or (lambda _msg: None)
        self._restarts = restarts
        # (workers, restarts, background commits) as said last, here or ``after``: alike is quiet
        said = (run.config.distributed.workers, restarts, True)
        self._said = None if after is None else after.announced or said

    @property
    def restarts(self) -> int:
        return self._restarts

    def close(self) -> None:
        """Nothing is held between segments (each gang commits before it ends)."""

    def train_until(self, until: int) -> SegmentResult:
        self._train(until)
        committed = self.run.checkpoints().committed()
        if not committed or committed[-1].epoch != until:
            raise RunError(f"{self.run.url}: training to epoch {until} left no checkpoint of it")
        ckpt = committed[-1]
        history = [*ckpt.manifest["history"]]
        return SegmentResult(until, ckpt.url, history, self._restarts, announced=self._said)

    def _train(self, until: int) -> None:
        """Train to epoch ``until`` from the latest committed checkpoint; rank 0 commits.

        When the gang fails (a rank raises, a worker dies, a collective times out) the segment
        is relaunched from the latest committed checkpoint on the workers alive then, after
        waiting up to ``fault_tolerance.wait_for_workers_s`` for the cluster to heal, with
        exponential backoff, until ``fault_tolerance.max_restarts`` restarts are used up.
        """
        run, client = self.run, self.client
        config = run.config
        dcfg, ft = config.distributed, config.fault_tolerance
        checkpoints = run.checkpoints()
        first = self._restarts
        while True:
            # verified, not loaded: the ranks load it (the driver need not hold the model)
            found = checkpoints.resume_checkpoint()
            start = found.epoch if found else 0
            history = list(found.manifest["history"]) if found else []
            if start >= until:
                return
            world = min(dcfg.workers, _alive(client))
            view = GangView(
                epochs=config.training.epochs,
                epoch=start,
                global_step=found.global_step if found else 0,
                world_size=world,
                history=[EpochStats.from_dict(h) for h in history],
            )
            self.writer.reset(history)
            queue = f"kgpipe-progress-{uuid.uuid4().hex[:12]}"
            if world > 1:  # NCCL refuses two ranks on one GPU: say so before the gang fails
                _check_devices(client, config)
            launched = check_training_gang(  # refused here, not killed by a nanny mid-epoch
                config, gang_workers(client, config), segment=(start, until),
                resumed=found is not None, world=world, num_entities=run.num_entities,
                num_relations=run.num_relations, num_train=run.num_train,
                valid_candidates=run.candidate_shape("valid"),
            )  # fmt: skip
            make_spec = functools.partial(
                self._spec, queue=queue, world=world, start=found.epoch if found else None,
                until=until, config=launched,
            )  # fmt: skip
            said, self._said = self._said, (world, self._restarts, launched is config)
            if said != self._said:
                since = f", from the checkpoint of epoch {start}" if start else ""
                self.say(
                    f"epochs {start + 1}..{config.training.epochs} on {world} Dask worker(s) "
                    f"(sync={dcfg.sync}){since}"
                    + ("" if launched is config else "; a background commit's copy would not fit"
                       " the workers' memory: commits are written in the foreground")
                )  # fmt: skip
            relay = _Relay(view, self.callbacks)
            try:
                launch_gang(
                    client, rank_main, make_spec, world_size=world, queue=queue, on_event=relay
                )
                relay.finish()
                return
            except GangError as err:
                if not err.retryable:  # the same configuration would fail the same way again
                    raise err.kind(f"{run.url}: {err}") from None
                self._restarts += 1
                if self._restarts > ft.max_restarts:
                    raise RunError(
                        f"{run.url}: training failed after {self._restarts - 1} restart(s), the "
                        f"fault_tolerance.max_restarts limit: {err}"
                    ) from None
                delay = ft.restart_backoff_s * 2 ** (self._restarts - first - 1)
                latest = start  # or later: a gang commits within a segment (checkpoint.every)
                with contextlib.suppress(Exception):  # a message only; the relaunch reads again
                    latest = max([start, *(c.epoch for c in checkpoints.committed())])
                log_warning(
                    f"{err}; relaunching the gang from "
                    + (f"the checkpoint of epoch {latest}" if latest else "the start")
                    + f" in {delay:.1f} s (restart {self._restarts}/{ft.max_restarts})"
                )
                self.say(f"restart {self._restarts}/{ft.max_restarts} after: {err}")
                time.sleep(delay)
                try:
                    client.wait_for_workers(dcfg.workers, timeout=ft.wait_for_workers_s)
                except TimeoutError:
                    if _alive(client) == 0:
                        raise RunError(f"{run.url}: no Dask worker is left after: {err}") from None
                    self.say(f"going on with {_alive(client)} of {dcfg.workers} workers")

    def test_split(self, progress: ProgressFn | None = None) -> dict[str, Any] | None:
        """The test metrics of the run's chosen checkpoint ranked by a gang of the cluster's
        workers, each against its own entity shards (``progress``: rank 0's, as it ranks).
        None where the driver ranks it: the checkpoint is not sharded, there is no test to
        rank, fewer than 2 workers are alive, or the gang would not fit its workers' memory
        limits or failed (said in the log; a trained run never fails here)."""
        try:
            return self._test_split(progress)
        except Exception as err:  # the driver can rank it: never fail a run trained already
            log_warning(f"ranking the test split in the driver: the gang's ranking failed: {err}")
            self.say(f"the gang's test ranking failed ({err}); ranking it in the driver")
            return None

    def _test_split(self, progress: ProgressFn | None) -> dict[str, Any] | None:
        run, client = self.run, self.client
        config = run.config
        ft = config.fault_tolerance
        chosen = chosen_checkpoint(run, verify=False)  # the ranks verify the files they read
        if chosen is None or chosen.manifest.get("strategy") != "sharded":
            return None
        if not config.evaluation.test or not run.staged(train=False).test.numel():
            return None

        def relay(event: dict[str, Any]) -> None:
            if progress is not None and event.get("type") == "eval":
                with contextlib.suppress(Exception):  # a display must not fail the ranking
                    progress(int(event["done"]), int(event["total"]))

        attempt = 0
        while True:
            attempt += 1
            world = min(config.distributed.workers, _alive(client))
            if world < 2:
                return None
            queue = f"kgpipe-progress-{uuid.uuid4().hex[:12]}"
            make_spec = functools.partial(
                self._spec, queue=queue, world=world, start=chosen.epoch, until=chosen.epoch
            )
            try:  # as a training gang is checked: refused here, not killed mid-ranking
                check_test_gang(run, gang_workers(client, config), world)
            except ConfigError as err:  # the driver ranks it, as when the gang fails
                log_warning(f"ranking the test split in the driver: the gang would not fit: {err}")
                return None
            self.say(f"ranking the test split on {world} Dask workers (their entity shards)")
            try:
                got = launch_gang(
                    client, rank_test, make_spec, world_size=world, queue=queue, on_event=relay
                )
                return dict(got[0])
            except GangError as err:
                if not err.retryable or attempt == 2:
                    raise
                log_warning(f"ranking the test split on the gang failed, once more: {err}")
                time.sleep(ft.restart_backoff_s)  # as a training gang's relaunch waits
                with contextlib.suppress(TimeoutError):
                    client.wait_for_workers(
                        config.distributed.workers, timeout=ft.wait_for_workers_s
                    )

    def _spec(
        self,
        rank: int,
        addr: str,
        port: int,
        *,
        queue: str,
        world: int,
        start: int | None,
        until: int,
        config: RunConfig | None = None,  # default: the run's
    ) -> RankSpec:
        run, config = self.run, config or self.run.config
        dcfg, t = config.distributed, config.training
        return RankSpec(
            config=config.model_dump(mode="json"),
            storage_options=config.run.storage_options,
            rank=rank,
            world_size=world,
            master_addr=addr,
            master_port=port,
            run={
                "url": run.url,
                "num_entities": run.num_entities,
                "num_relations": run.num_relations,
                "num_train": run.num_train,
                "fingerprint": run.fingerprint,
                "resumed_epoch": run.resumed_epoch,
                "lease": run.lease,
            },
            queue=queue,
            threads=worker_threads(dcfg.workers, dcfg.threads_per_worker)
            if dcfg.cluster in CLUSTERS  # else the worker's own (TorchWorkerSetup)
            else dcfg.threads_per_worker,
            adapt_threads=t.threads is None and dcfg.threads_per_worker is None,
            start_epoch=start,
            until=until,
            rank_callbacks=self.rank_callbacks,
            restarts=self._restarts,
            # workers of a cluster this process started are its children: they see it go
            driver_pid=os.getpid() if dcfg.cluster in CLUSTERS else None,
        )


class _Relay:
    """Turns rank 0's queue events into driver-side callback calls on the gang's view."""

    def __init__(self, view: GangView, callbacks: Sequence[Callback]) -> None:
        self.view, self.callbacks, self.started = view, callbacks, False

    def __call__(self, event: dict[str, Any]) -> None:
        view = self.view
        view._update(global_step=event["global_step"])
        if event["type"] == "start":
            view._update(steps_per_epoch=event["steps_per_epoch"], epoch=event["epoch"])
            self.started = True
            for cb in self.callbacks:
                cb.on_train_start(view)
        elif event["type"] == "batch":
            for cb in self.callbacks:
                cb.on_batch_end(view, event["epoch"], event["step"], event["steps"], event["loss"])
        elif event["type"] == "epoch":
            stats = EpochStats.from_dict(event["stats"])  # restarts recorded by the rank
            view._update(epoch=stats.epoch)
            for cb in self.callbacks:
                cb.on_epoch_end(view, stats)
            view._history.append(stats)

    def finish(self) -> None:
        if self.started:
            for cb in self.callbacks:
                cb.on_train_end(self.view)


def _check_devices(client: Client, config: RunConfig) -> None:
    """Refuse a gang whose workers would share a GPU (ranks of one host all seeing one card)."""
    shared = shared_devices(
        client.run(device_identity, config.training.device, config.distributed.cluster)
    )
    if shared:
        device, workers = next(iter(shared.items()))
        raise ConfigError(
            f"workers {', '.join(workers)} would all train on one GPU ({device}): NCCL needs a "
            "GPU per rank -- use distributed.cluster: cuda (dask-cuda starts one worker per GPU), "
            "fewer workers, or training.device: cpu"
        )
