"""Gradient clipping on a gang keeps the replicas identical when the ranks run different
thread counts (a ThreadGovernor sizes each rank's threads to its own cores): a CPU sum of
the same gradient rounds by the thread count, and ranks that clipped by their own norm applied
other updates to tables that must stay equal (the whole model under step sync, the relation
table and its optimiser state under the sharded strategy), and never re-synced."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kgpipe.config import ModelConfig, TrainingConfig
from kgpipe.config.sections import RegularizerConfig
from kgpipe.distributed.comm import Comm, StepExchange
from kgpipe.distributed.sharded import ShardedExchange, ShardMap
from kgpipe.models.model import KGEModel
from kgpipe.training.loop import Trainer

E, R, D = 400, 600, 128


def _rank(rank: int, world: int, port: int, strategy: str, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(rank + 1)
        g = torch.Generator().manual_seed(1)
        triples = torch.stack([torch.randint(0, n, (3000,), generator=g) for n in (E, R, E)], dim=1)
        training = TrainingConfig(epochs=4, batch_size=512, negatives=16, chunk_size=128,
                                  lr=0.01, loss="softplus", clip_grad_norm=1e-3)  # fmt: skip
        model_cfg = ModelConfig(
            name="complex", dim=D, init="uniform", init_scale=0.1, reciprocal=True
        )
        if strategy == "sharded":
            exchange: Any = ShardedExchange(
                Comm(world), ShardMap.build(E, shards=4, world_size=world, seed=5), rank
            )
            rows = exchange.own
        else:
            exchange, rows = StepExchange(Comm(world)), None
        model = KGEModel.build(model_cfg, num_entities=E, num_relations=R, seed=5, rows=rows)
        Trainer(model, triples, training=training, regularizer=RegularizerConfig(), seed=5,
                part=(rank, world), exchange=exchange, rank=rank, world_size=world).fit()  # fmt: skip
        shared = [model.relation.data] + ([model.entity.data] if strategy != "sharded" else [])
        mine = torch.cat([t.reshape(-1) for t in shared])
        first = mine.clone()
        dist.broadcast(first, src=0)
        out.put((rank, int((first != mine).sum())))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["replicated", "sharded"])
def test_ranks_of_other_thread_counts_clip_alike(strategy: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, strategy, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0, p.exitcode
    differing = dict(out.get() for _ in procs)
    assert differing == {0: 0, 1: 0}  # before: 57,502 of 204,800 (replicated), 7,958 of 153,600
