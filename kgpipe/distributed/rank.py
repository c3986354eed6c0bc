"""One rank of a training gang: the task that runs on a Dask worker.

It joins the torch.distributed process group, reads its shards from the run folder, builds the
model from the seed (identical on every rank), trains with the configured exchange, and returns
the final tables from rank 0. Rank 0 also validates and streams progress to the driver through a
Dask queue.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from kgpipe.config import RunConfig, parse_config
from kgpipe.distributed.comm import Comm, EpochExchange, StepExchange
from kgpipe.distributed.sharding import read_manifest, read_shards
from kgpipe.models.model import KGEModel
from kgpipe.storage import Store
from kgpipe.training import Callback, EpochStats, Exchange, Trainer

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


def _backend(config: RunConfig) -> str:
    """The process-group backend. Training tensors live on the CPU in this version (no device
    placement yet), so ``auto`` means gloo even on GPU workers."""
    return "gloo" if config.distributed.backend == "auto" else config.distributed.backend


def rank_main(spec: RankSpec) -> dict[str, Any]:
    """Train as rank ``spec.rank``; rank 0 returns the final tables and the epoch history."""
    config = parse_config(spec.config)
    dcfg = config.distributed
    if spec.threads:
        # OpenMP's thread count is per calling thread: set it in the thread that runs the task
        torch.set_num_threads(spec.threads)
    store = Store(spec.run_url, spec.storage_options)
    dist.init_process_group(
        _backend(config),
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
        )
        comm = Comm(spec.world_size, compression=dcfg.compression, topk_ratio=dcfg.topk_ratio)
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
        callbacks: list[Callback] = []
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
            if spec.queue:
                callbacks.append(_Reporter(spec.queue))
        trainer = Trainer(
            model,
            train,
            training=training,
            regularizer=config.model.regularizer,
            seed=config.run.seed,
            stream=stream,
            part=part,
            callbacks=callbacks,
            exchange=exchange,
        )
        history = trainer.fit()
        if spec.rank != 0:
            return {"rank": spec.rank}
        return {
            "rank": 0,
            "entity": model.entity.data.clone(),
            "relation": model.relation.data.clone(),
            "history": [s.as_dict() for s in history],
            "global_step": trainer.global_step,
        }
    finally:
        dist.destroy_process_group()
