"""The driver side of distributed training: open the cluster, launch the gang, relay progress."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from torch import Tensor

from kgpipe.config import RunConfig, TrainingConfig
from kgpipe.distributed.cluster import open_cluster, worker_threads
from kgpipe.distributed.gang import launch_gang
from kgpipe.distributed.rank import RankSpec, rank_main
from kgpipe.storage import Store
from kgpipe.training import Callback, EpochStats, Trainer

__all__ = ["GangResult", "train_on_dask"]


@dataclass
class _GangView:
    """What driver-side callbacks see of a training that runs in the gang."""

    cfg: TrainingConfig
    total_steps: int
    global_step: int = 0
    epoch: int = 0
    history: list[EpochStats] = field(default_factory=list)


@dataclass
class GangResult:
    entity: Tensor
    relation: Tensor
    history: list[EpochStats]
    global_step: int


def train_on_dask(
    config: RunConfig,
    store: Store,
    *,
    num_entities: int,
    num_relations: int,
    num_train: int,
    callbacks: Sequence[Callback] = (),
    log: Callable[[str], None] | None = None,
) -> GangResult:
    """Train ``config`` on its Dask cluster from the shards staged in ``store``."""
    dcfg = config.distributed
    steps = math.ceil(num_train / config.training.batch_size)
    if config.training.max_steps_per_epoch:
        steps = min(steps, config.training.max_steps_per_epoch)
    view = _GangView(config.training, total_steps=steps * config.training.epochs)
    as_trainer = cast(Trainer, view)
    queue = f"kgpipe-progress-{uuid.uuid4().hex[:12]}"
    data = config.model_dump(mode="json")

    def make_spec(rank: int, addr: str, port: int) -> RankSpec:
        return RankSpec(
            config=data,
            run_url=store.url,
            storage_options=store.storage_options,
            rank=rank,
            world_size=dcfg.workers,
            master_addr=addr,
            master_port=port,
            num_entities=num_entities,
            num_relations=num_relations,
            queue=queue,
            threads=worker_threads(dcfg),
        )

    def on_event(event: dict[str, Any]) -> None:
        view.global_step = event["global_step"]
        if event["type"] == "batch":
            for cb in callbacks:
                cb.on_batch_end(
                    as_trainer, event["epoch"], event["step"], event["steps"], event["loss"]
                )
        elif event["type"] == "epoch":
            s = dict(event["stats"])
            stats = EpochStats(
                epoch=s.pop("epoch"),
                loss=s.pop("loss"),
                triples=s.pop("triples"),
                seconds=s.pop("seconds"),
                lr=s.pop("lr"),
                steps=s.pop("steps"),
            )
            s.pop("triples_per_s", None)
            stats.extra.update(s)
            view.epoch = stats.epoch
            view.history.append(stats)
            for cb in callbacks:
                cb.on_epoch_end(as_trainer, stats)

    with open_cluster(dcfg, log=log) as client:
        for cb in callbacks:
            cb.on_train_start(as_trainer)
        results = launch_gang(
            client, rank_main, make_spec, world_size=dcfg.workers, queue=queue, on_event=on_event
        )
        for cb in callbacks:
            cb.on_train_end(as_trainer)
    head = next(r for r in results if r["rank"] == 0)
    return GangResult(head["entity"], head["relation"], view.history, head["global_step"])
