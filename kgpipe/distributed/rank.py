"""One rank of a training gang: the task that runs on a Dask worker.

It joins the torch.distributed process group, reads its shards from the run folder, builds the
model from the seed or loads the segment's starting checkpoint (identical on every rank), and
trains with the configured exchange. Rank 0 validates, commits checkpoints to the run folder and
streams progress to the driver through a Dask queue.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import parse_config
from kgpipe.devices import process_group_backend, resolve_device, retain_freed_memory
from kgpipe.distributed.comm import Comm, EpochExchange, StepExchange
from kgpipe.distributed.sharding import read_manifest, read_shards
from kgpipe.errors import CheckpointError
from kgpipe.models.model import KGEModel
from kgpipe.storage import Store
from kgpipe.training import Callback, EpochStats, Exchange, Trainer
from kgpipe.training.checkpointing import CheckpointCallback

__all__ = ["RankSpec", "rank_main"]


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs, small and picklable (no tensors)."""

    config: dict[str, Any]  # RunConfig as JSON-able data
    run_url: str
    storage_options: dict[str, Any]
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    num_entities: int
    num_relations: int
    queue: str | None = None
    threads: int | None = None
    start_epoch: int | None = None  # the committed checkpoint to start from (None: seeded init)
    until: int | None = None  # train to this epoch (default: training.epochs)
    meta: dict[str, Any] | None = None  # checkpoint manifest entries (rank 0 commits)

    def __repr__(self) -> str:
        # Dask prints task arguments in its logs (e.g. "Compute Failed"): never the config or
        # the storage options, which may hold credentials
        return (
            f"RankSpec(rank={self.rank}, world_size={self.world_size}, run_url={self.run_url!r}, "
            f"start_epoch={self.start_epoch}, until={self.until})"
        )


class _Reporter(Callback):
    """Rank 0: puts progress events on the driver's Dask queue (batches at most every 0.5 s)."""

    def __init__(self, queue_name: str) -> None:
        from distributed import Queue

        self.queue = Queue(queue_name)
        self.last = 0.0

    def on_batch_end(
        self, trainer: Trainer, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        now = time.monotonic()
        if now - self.last >= 0.5 or step == steps:
            self.last = now
            self.queue.put(
                {"type": "batch", "epoch": epoch, "step": step, "steps": steps,
                 "loss": loss, "global_step": trainer.global_step}
            )  # fmt: skip

    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
        self.queue.put(
            {"type": "epoch", "stats": stats.as_dict(), "global_step": trainer.global_step}
        )


class _FaultInjection(Callback):
    """Test hook for fault-injection tests: ``KGPIPE_FAULT="<kill|raise>:<rank>:<epoch>:<step>"``
    in the workers' environment makes that rank SIGKILL its own worker process, or raise, after
    that step -- once per run folder (a marker file records that it fired)."""

    def __init__(self, rank: int, store: Store, spec: str) -> None:
        kind, r, e, s = spec.split(":")
        self.kind = kind
        self.active = int(r) == rank
        self.at = (int(e), int(s))
        self.store = store

    def on_batch_end(
        self, trainer: Trainer, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        if self.active and (epoch, step) == self.at and not self.store.exists("fault-fired"):
            self.store.write_text("fault-fired", f"{self.kind} at {epoch}:{step}\n")
            if self.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault at epoch {epoch} step {step}")


def rank_main(spec: RankSpec) -> dict[str, Any]:
    """Train as rank ``spec.rank`` from checkpoint ``spec.start_epoch`` to ``spec.until``; rank 0
    validates and commits checkpoints. Returns where the rank stopped (no tensors: the state is
    in the checkpoint store)."""
    config = parse_config(spec.config)
    dcfg = config.distributed
    if spec.threads:
        # OpenMP's thread count is per calling thread: set it in the thread that runs the task
        torch.set_num_threads(spec.threads)
    if config.training.allocator == "retain":
        retain_freed_memory()  # the worker process's heap: it outlives the task
    store = Store(spec.run_url, spec.storage_options)
    device = resolve_device(config.training.device, cluster=dcfg.cluster)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL uses the current device of each rank
    dist.init_process_group(
        process_group_backend(dcfg.backend, device),
        init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=dt.timedelta(seconds=dcfg.timeout_s),
    )
    try:
        step_sync = dcfg.sync == "step"
        manifest = read_manifest(store)
        ids = (
            list(range(manifest.num_shards))
            if step_sync
            else manifest.shards_of(spec.rank, spec.world_size)
        )
        train = read_shards(store, manifest, ids)
        model = KGEModel.build(
            config.model,
            num_entities=spec.num_entities,
            num_relations=spec.num_relations,
            seed=config.run.seed,
        ).to(device)
        comm = Comm(
            spec.world_size,
            compression=dcfg.compression,
            topk_ratio=dcfg.topk_ratio,
            device=device,
        )
        training = config.training
        exchange: Exchange
        if spec.world_size == 1:
            exchange = Exchange()  # a gang of one has nothing to exchange
            part, stream = (0, 1), 0
        elif step_sync:
            exchange = StepExchange(comm, mode=dcfg.exchange)
            part, stream = (spec.rank, spec.world_size), 0
        else:
            exchange = EpochExchange(comm)
            part, stream = (0, 1), spec.rank
            # the global batch is split across ranks in both modes
            batch = max(1, training.batch_size // spec.world_size)
            training = training.model_copy(update={"batch_size": batch})
        ckpt = CheckpointStore(
            store, keep_last=config.checkpoint.keep_last, keep_best=config.checkpoint.keep_best
        )
        callbacks: list[Callback] = []
        saver: CheckpointCallback | None = None
        until = spec.until or config.training.epochs
        if spec.rank == 0:
            if config.evaluation.every:
                from kgpipe.run import staged_validation

                callbacks.append(
                    staged_validation(
                        store,
                        config,
                        train_all=read_shards(store, manifest, list(range(manifest.num_shards))),
                    )
                )
            saver = CheckpointCallback(
                ckpt,
                every=config.checkpoint.every,
                until=until,
                meta=spec.meta or {},
                background=config.checkpoint.background,
            )
            callbacks.append(saver)
            if spec.queue:
                callbacks.append(_Reporter(spec.queue))
        fault = os.environ.get("KGPIPE_FAULT")
        if fault:
            callbacks.append(_FaultInjection(spec.rank, store, fault))
        trainer = Trainer(
            model,
            train,
            training=training,
            regularizer=config.model.regularizer,
            dropout=config.model.dropout,
            seed=config.run.seed,
            stream=stream,
            part=part,
            callbacks=callbacks,
            exchange=exchange,
        )
        if spec.start_epoch is not None:
            committed = {c.epoch: c for c in ckpt.committed()}
            if spec.start_epoch not in committed:
                raise CheckpointError(f"{spec.run_url}: no checkpoint of epoch {spec.start_epoch}")
            trainer.load_state(ckpt.load(committed[spec.start_epoch]))
        try:
            trainer.fit(until=until)
        finally:
            if saver is not None:
                saver.close()
        return {"rank": spec.rank, "epoch": trainer.epoch, "global_step": trainer.global_step}
    finally:
        dist.destroy_process_group()
