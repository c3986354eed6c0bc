"""One rank of a sharded gang ranking the test split: the task that runs on a Dask worker once
training is done.

The driver of a sharded run would otherwise rank the test split alone, against the model file it
maps (every chunk of queries reads the whole table from the disk). The gang that trained the
run holds the table spread over its workers' memory instead: each rank reads its own shards of
the chosen checkpoint (the tables, not the optimiser state), scores the queries against its own
rows and sums the better and equal counts with the other ranks, as sharded validation does
(:mod:`kgpipe.distributed.sharded_eval`). Rank 0 returns the metrics as ``results.json`` states
them; the ranks' sums equal the single-process ranks (a test).
"""

from __future__ import annotations

import functools
import time
import traceback
from typing import Any

import torch
from torch import Tensor

from kgpipe.checkpoint import CheckpointStore
from kgpipe.distributed.comm import Comm
from kgpipe.distributed.sharded import ShardedExchange, ShardMap
from kgpipe.distributed.sharded_eval import evaluate_sharded
from kgpipe.errors import CheckpointError
from kgpipe.evaluation import FilterIndex
from kgpipe.launch.rank import CancelWatch, RankSpec, joined, shared_triples
from kgpipe.runs.finish import test_results
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.sharded import load_rank_state
from kgpipe.training.optim import RowOptimizer

__all__ = ["rank_test"]


class _Tables:
    """What the exchange reads of a test rank: its tables (it has no optimiser)."""

    def __init__(self, tables: dict[str, Tensor]) -> None:
        self._tables = tables

    @property
    def tables(self) -> dict[str, Tensor]:
        return self._tables

    @property
    def optimizer(self) -> RowOptimizer:
        raise RuntimeError("a rank ranking the test split has no optimiser")


class _Progress:
    """Between chunks: every rank stops if its task was cancelled (Ctrl-C, a failed peer);
    rank 0 puts its test progress on the driver's Dask queue (at most every 0.5 s, and the
    end)."""

    def __init__(self, queue_name: str | None, rank: int) -> None:
        from distributed import Queue

        self.queue = Queue(queue_name) if queue_name and rank == 0 else None
        self.watch, self.rank = CancelWatch(), rank
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        self.watch.check(self.rank)
        now = time.monotonic()
        if self.queue is not None and (now - self.last >= 0.5 or done == total):
            self.last = now
            self.queue.put({"type": "eval", "done": done, "total": total})


def rank_test(spec: RankSpec) -> dict[str, Any] | None:
    """Rank ``spec.rank``'s part of the test ranking of the committed checkpoint of epoch
    ``spec.start_epoch``; rank 0 returns the test metrics (with ``model_epoch``), the others
    None. A collective: every rank of the gang runs it."""
    with joined(spec) as (run, device):
        try:
            return _test(spec, run, device)
        except BaseException as err:  # its traceback would keep the model past the gang
            traceback.clear_frames(err.__traceback__)
            raise


def _test(spec: RankSpec, run: RunFolder, device: torch.device) -> dict[str, Any] | None:
    config = run.config
    if spec.start_epoch is None:
        raise CheckpointError(f"{run.url}: no checkpoint named to rank the test split of")
    shared = shared_triples(run, spec.world_size)
    progress: _Progress | None = None
    try:
        data = run.staged(triples=shared.tensor if shared is not None else None)
        shard_map = ShardMap.build(
            run.num_entities,
            shards=config.distributed.entity_shards,
            world_size=spec.world_size,
            seed=config.run.seed,
        )
        exchange = ShardedExchange(Comm(spec.world_size, device=device), shard_map, spec.rank)
        ckpt = CheckpointStore(run.store)
        committed = {c.epoch: c for c in ckpt.committed()}
        if spec.start_epoch not in committed:
            raise CheckpointError(f"{run.url}: no checkpoint of epoch {spec.start_epoch}")
        state = load_rank_state(ckpt, committed[spec.start_epoch], exchange, tables=True)
        model = run.new_model(rows=exchange.own.cpu())
        with torch.no_grad():
            model.entity.copy_(state.tables["entity"])
            model.relation.copy_(state.tables["relation"])
        del state
        model.to(device)
        exchange.bind(_Tables({"entity": model.entity, "relation": model.relation}))
        index = FilterIndex.from_triples([data.train, data.valid, data.test], run.num_relations)
        lead = spec.rank == 0
        progress = _Progress(spec.queue, spec.rank)
        results = test_results(
            config,
            model,
            data.test,
            index,
            "test",
            progress,
            candidates=run.candidates("test"),
            evaluator=functools.partial(evaluate_sharded, model, exchange),
        )
    finally:
        if shared is not None:
            shared.close()
        if progress is not None and progress.queue is not None:  # the scheduler drops the
            progress.queue.close()  # queue once the driver closed it too
    if not lead:
        return None
    results["ranked_by"], results["ranks"] = "gang", spec.world_size
    results["model_epoch"] = spec.start_epoch
    return results
