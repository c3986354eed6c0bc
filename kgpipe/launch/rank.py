"""One rank of a training gang: the task that runs on a Dask worker.

It joins the torch.distributed process group, reads the staged shards from the run folder,
builds its trainer with the factory (from the seed, or from the segment's starting checkpoint,
identical on every rank) and trains with the configured exchange. Rank 0 validates, commits
checkpoints and streams progress to the driver through a Dask queue.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import gc
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from distributed import get_worker

from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import parse_config
from kgpipe.data.shards import read_manifest, read_shards
from kgpipe.data.shared_triples import SharedTriples, open_shared
from kgpipe.devices import process_group_backend, resolve_device
from kgpipe.distributed.comm import Comm, EpochExchange, StepExchange
from kgpipe.distributed.sharded import ShardedExchange, ShardMap
from kgpipe.errors import CheckpointError, Fenced, RunError
from kgpipe.launch.build import build_trainer, splits_validation
from kgpipe.process import ThreadGovernor, configure
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.sharded import load_rank_state
from kgpipe.training.exchange import Exchange
from kgpipe.training.hooks import Callback, TrainerView
from kgpipe.training.records import EpochStats

__all__ = ["RankSpec", "Reporter", "joined", "rank_main", "shared_triples"]


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs, small and picklable (no tensors)."""

    config: dict[str, Any]  # RunConfig as JSON-able data
    storage_options: dict[str, Any]
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    run: dict[str, Any]  # the RunFolder's fields besides the config
    queue: str | None = None
    threads: int | None = None  # the worker's share of the cores
    adapt_threads: bool = False  # let a ThreadGovernor size the threads (up to ``threads``)
    start_epoch: int | None = None  # the committed checkpoint to start from (None: seeded init)
    until: int | None = None  # train to this epoch (default: training.epochs)
    rank_callbacks: Sequence[Callback] = field(default_factory=tuple)
    restarts: int = 0  # the gang restarts of the run so far (recorded with each epoch)
    driver_pid: int | None = None  # the driver, when it started this worker (a local cluster)

    def __repr__(self) -> str:
        # Dask prints task arguments in its logs (e.g. "Compute Failed"): never the config or
        # the storage options, which may hold credentials
        return (
            f"RankSpec(rank={self.rank}, world_size={self.world_size}, "
            f"run_url={self.run.get('url')!r}, start_epoch={self.start_epoch}, until={self.until})"
        )


class CancelWatch(Callback):
    """Stops a rank whose task its driver cancelled (Ctrl-C, a failed peer, a relaunch): Dask
    cannot stop a running thread, so the rank trained on to its next commit, holding its
    worker's thread while the relaunch waited behind it (its rendezvous timed out). It reads
    the worker's own state of its task, at most every 0.25 s, after every batch and (through
    :meth:`check`) between validation and test-ranking chunks; a peer blocked in a collective
    is released by the closed connection."""

    def __init__(self) -> None:
        try:
            self.worker: Any = get_worker()
            self.key = self.worker.get_current_task()
        except ValueError:  # not in a worker
            self.worker = None
        self.last = 0.0

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        self.check(trainer.rank)

    def check(self, rank: int) -> None:
        """Raise :class:`RunError` if this rank's task is no longer running."""
        now = time.monotonic()
        if self.worker is None or now - self.last < 0.25:
            return
        self.last = now
        task = self.worker.state.tasks.get(self.key)
        if task is None or task.state not in ("executing", "long-running"):
            raise RunError(f"rank {rank}: its task was cancelled by the driver")


class Reporter(Callback):
    """Rank 0: puts progress events on the driver's Dask queue (batches at most every 0.5 s).

    A ``start`` event carries the trainer's own step counts first: the driver's view learns them
    from the rank (only the trainer knows how many examples its mode steps over)."""

    def __init__(self, queue_name: str) -> None:
        from distributed import Queue

        self.queue = Queue(queue_name)
        self.last = 0.0

    def on_train_start(self, trainer: TrainerView) -> None:
        self.queue.put(
            {"type": "start", "epoch": trainer.epoch, "global_step": trainer.global_step,
             "steps_per_epoch": trainer.steps_per_epoch, "epochs": trainer.epochs}
        )  # fmt: skip

    def on_train_end(self, trainer: TrainerView) -> None:
        self.queue.close()  # the scheduler drops the queue once the driver closed it too

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        now = time.monotonic()
        if now - self.last >= 0.5 or step == steps:
            self.last = now
            self.queue.put(
                {"type": "batch", "epoch": epoch, "step": step, "steps": steps,
                 "loss": loss, "global_step": trainer.global_step}
            )  # fmt: skip

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        self.queue.put(
            {"type": "epoch", "stats": stats.as_dict(), "global_step": trainer.global_step}
        )


class DriverGone(Fenced):
    """The driver of a gang is gone: its ranks stop before the next commit."""


def _driver_fence(driver_pid: int | None) -> Callable[[], None]:
    """A check, made before each commit, that the run's driver is still there: its process runs
    (a cluster it started, on this host), and its client has not released this rank's task (it
    disconnected). A rank whose driver died commits nothing more; the next run resumes from the
    last commit. The worker and the task are looked up here, in the rank's own thread: commits
    may run in a background thread, where Dask's worker context is not set."""
    try:
        worker = get_worker()
        key = worker.get_current_task()
    except (ValueError, KeyError):  # not in a Dask worker's task
        worker, key = None, None

    def check() -> None:
        if driver_pid is not None and not _pid_alive(driver_pid):
            raise DriverGone(f"the driver (pid {driver_pid}) is gone; not committing")
        if worker is None or key is None:
            return
        task = worker.state.tasks.get(key)
        if task is None or task.state in ("cancelled", "released"):
            raise DriverGone(
                "the driver released this rank's task (it disconnected); not committing"
            )

    return check


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def joined(spec: RankSpec) -> Iterator[tuple[RunFolder, torch.device]]:
    """The run folder and device of rank ``spec.rank``, in the gang's process group (joined on
    entry, left on exit); the process settings of the run, set in the calling thread (OpenMP's
    thread count is per thread: the one that runs the task)."""
    config = parse_config(spec.config)
    config = config.model_copy(
        update={"run": config.run.model_copy(update={"storage_options": spec.storage_options})}
    )
    dcfg, t = config.distributed, config.training
    threads = rank_threads(t.threads or spec.threads)  # a pinned count holds on a gang too
    configure(threads=threads, allocator=t.allocator, deterministic=t.deterministic)
    run = RunFolder(config=config, **spec.run)
    device = resolve_device(t.device, cluster=dcfg.cluster)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL uses the current device of each rank
    init_gang(
        process_group_backend(dcfg.backend, device),
        f"tcp://{spec.master_addr}:{spec.master_port}",
        rank=spec.rank,
        world_size=spec.world_size,
        timeout_s=dcfg.timeout_s,
    )
    try:
        yield run, device
    finally:
        dist.destroy_process_group()
        # the trainer lives in reference cycles (its view, its exchange, callbacks holding its
        # methods) that a worker's rare full collections freed late: a model and optimiser
        # state more in the worker after every segment, until the memory check refused a gang
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def init_gang(backend: str, address: str, *, rank: int, world_size: int, timeout_s: float) -> None:
    """Join the gang's process group. torch names a process's groups by a count that a
    rendezvous bumps before the ranks meet and that only destroying a group resets: a rank
    whose rendezvous failed (a peer late, a relaunch) looked for the next group's keys in every
    later gang of its worker, and each timed out. The count is reset before each joining."""
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    if not dist.is_initialized() and hasattr(world, "group_count"):
        world.group_count = 0  # type: ignore[union-attr]
    dist.init_process_group(
        backend,
        init_method=address,
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=timeout_s),
    )


def rank_threads(threads: int | None) -> int | None:
    """A rank's torch threads: ``threads``, else (an existing scheduler's worker, sized on its
    own host) the worker's Dask thread count; None outside a worker."""
    if threads:
        return threads
    try:
        from distributed import get_worker

        return int(get_worker().state.nthreads) or None
    except ValueError:  # not in a worker
        return None


def shared_triples(run: RunFolder, world_size: int) -> SharedTriples | None:
    """The machine's one mapped copy of the training triples for a rank of a step-synchronised
    gang of ``world_size`` > 1 (``distributed.share_triples``); None: the rank reads its own."""
    dcfg = run.config.distributed
    if dcfg.sync != "step" or world_size < 2 or not dcfg.share_triples:
        return None
    wide = max(run.num_entities, run.num_relations) > torch.iinfo(torch.int32).max
    return open_shared(run.store, read_manifest(run.store), wide=wide)


def rank_main(spec: RankSpec) -> dict[str, Any]:
    """Train as rank ``spec.rank`` from checkpoint ``spec.start_epoch`` to ``spec.until``; rank 0
    validates and commits checkpoints. Returns where the rank stopped (no tensors: the state is
    in the checkpoint store)."""
    with joined(spec) as (run, device):
        try:
            return _train(spec, run, device)
        except BaseException as err:  # its traceback would keep the trainer past the gang
            traceback.clear_frames(err.__traceback__)
            raise


def _train(spec: RankSpec, run: RunFolder, device: torch.device) -> dict[str, Any]:
    config, store = run.config, run.store
    dcfg, t = config.distributed, config.training
    governor = ThreadGovernor(rank_threads(spec.threads)).start() if spec.adapt_threads else None
    shared: SharedTriples | None = None
    try:
        step_sync, lead = dcfg.sync == "step", spec.rank == 0
        # A sharded commit waits for the slowest rank's shard files: a group of its own, with
        # its own timeout. Made here, where every rank has just met at the rendezvous and on a
        # condition of the config alone: creating a group is itself a collective, which waits
        # that long for a rank that failed before it.
        commit_group: Any = None
        if spec.world_size > 1 and step_sync and dcfg.strategy == "sharded":
            commit_group = dist.new_group(
                backend="gloo", timeout=dt.timedelta(seconds=dcfg.commit_timeout_s)
            )
        # all training triples where the rank trains the global batch or validates (the filter);
        # ranks of a step-synchronised gang map the machine's one copy
        shared = shared_triples(run, spec.world_size)
        data = run.staged(
            train=step_sync or lead or splits_validation(config, spec.world_size),
            triples=shared.tensor if shared is not None else None,
        )
        if step_sync:
            own = data.train
        else:  # epoch sync: the rank's own shards
            manifest = read_manifest(store)
            own = read_shards(store, manifest, manifest.shards_of(spec.rank, spec.world_size))
        comm = Comm(
            spec.world_size,
            compression=dcfg.compression,
            topk_ratio=dcfg.topk_ratio,
            device=device,
        )
        training = t
        exchange: Exchange
        if spec.world_size == 1:
            exchange = Exchange()  # a gang of one has nothing to exchange
            part, stream = (0, 1), 0
        elif step_sync and dcfg.strategy == "sharded":
            shard_map = ShardMap.build(
                run.num_entities,
                shards=dcfg.entity_shards,
                world_size=spec.world_size,
                seed=config.run.seed,
            )
            exchange = ShardedExchange(comm, shard_map, spec.rank, staleness=dcfg.staleness)
            part, stream = (spec.rank, spec.world_size), 0
        elif step_sync:
            exchange = StepExchange(comm, mode=dcfg.exchange)
            part, stream = (spec.rank, spec.world_size), 0
        else:
            exchange = EpochExchange(comm)
            part, stream = (0, 1), spec.rank
            # the global batch is split across ranks in both modes
            training = t.model_copy(update={"batch_size": max(1, t.batch_size // spec.world_size)})
        state = None
        if spec.start_epoch is not None:
            ckpt = CheckpointStore(store)
            committed = {c.epoch: c for c in ckpt.committed()}
            if spec.start_epoch not in committed:
                raise CheckpointError(f"{run.url}: no checkpoint of epoch {spec.start_epoch}")
            if isinstance(exchange, ShardedExchange):  # this rank's shards only
                state = load_rank_state(ckpt, committed[spec.start_epoch], exchange)
            else:
                state = ckpt.load(committed[spec.start_epoch])
        until = spec.until or t.epochs
        watch = CancelWatch()
        built = build_trainer(
            run,
            data,
            device=device,
            until=until,
            train=own,
            training=training,
            rank=spec.rank,
            world_size=spec.world_size,
            part=part,
            stream=stream,
            exchange=exchange,
            records=lead,
            recorder=Reporter(spec.queue) if lead and spec.queue else None,
            governor=governor,
            rank_callbacks=[watch, *spec.rank_callbacks],
            interrupt=functools.partial(watch.check, spec.rank),
            state=state,
            restarts=spec.restarts,
            fence=_driver_fence(spec.driver_pid),
            commit_group=commit_group,
        )
        trainer = built.trainer
        del state  # copied into the tables and the optimiser: not a second copy while training
        try:
            trainer.fit(until=until)
        except BaseException:
            # the commit in flight finishes (the other ranks' commit threads wait for this
            # one's part), for as long as a step would wait for a peer; its own failure does
            # not hide the one that stopped training
            if built.saver is not None:
                with contextlib.suppress(Exception):
                    built.saver.close(timeout=dcfg.timeout_s)
            raise
        if built.saver is not None:
            built.saver.close()
        return {"rank": spec.rank, "epoch": trainer.epoch, "global_step": trainer.global_step}
    finally:
        if shared is not None:
            shared.close()
