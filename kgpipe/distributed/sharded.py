"""The sharded strategy: each rank owns some shards of the entity table and their optimiser state.

Entities are dealt to ``S`` shards by a seeded random permutation (balanced to one row, and not
by graph cut, which is known to hurt quality); shard ``s`` belongs to rank ``s mod W``. ``S`` does
not depend on the world size, so a sharded checkpoint (one set of rows per shard) resumes on any
number of ranks. A rank's local table holds its shards one after the other (each a contiguous
block of rows, ascending entity ids: a commit writes the blocks as they are, without a copy); the
owner maps a global id to its local row with a binary search.

A step (``distributed.sync: step``; the global batch and its dealing to ranks are those of the
replicated strategy):

1. **pull** -- the rank finds the unique entity ids its share of the batch touches (positives and
   its chunks' shared negatives), asks their owners for the rows (one ``all_to_all`` of ids, one of
   rows back), and computes on a compact table of exactly those rows;
2. **push** -- the row gradients go back to their owners (one ``all_to_all`` of ids and values,
   packed into one float tensor), which sum them per row (in rank order on the CPU; on a GPU
   ``index_add_`` is deterministic only under ``training.deterministic``);
3. the owners apply the row-wise optimiser to their rows; the relation table (small) stays
   replicated and its gradient is all-reduced, as under the replicated strategy.

With the same seed and global batch this is single-process training up to the order in which a
row's gradient contributions are summed (tested to 1e-5). Bytes are counted as in
:class:`~kgpipe.distributed.comm.Comm`: what this rank sends to the others.

**Bounded staleness** (``distributed.staleness: k`` > 0, the stale-synchronous reads of a
parameter server): a rank keeps the rows it fetched from other ranks in a :class:`RowCache`
and computes with a cached row while it is at most ``k`` steps old, fetching only the rows it
does not hold fresh enough; its own rows it reads from its table. The pushes are unchanged:
every step's gradients reach the owners in that step's exchange and are applied at once, so a
row a rank reads has missed at most the updates of the ``k`` steps since it was fetched. Fewer
rows are fetched (the hot rows of a power-law graph, and the shared negatives, recur from step
to step); the steps still meet in the same collectives. The cache is emptied at every epoch's
end, so a run resumed from a commit repeats the uninterrupted run exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from kgpipe.distributed.comm import Comm, StepExchange
from kgpipe.training.exchange import Exchange, Trainable
from kgpipe.training.optim import RowGrad

__all__ = ["LocalIndex", "RowCache", "ShardMap", "ShardedExchange", "owned_positions"]

#: the seed of the entity permutation is the run's seed mixed with this (not the model's draw)
_PERMUTATION_SALT = 0x5EED_5A4D


@dataclass(frozen=True)
class ShardMap:
    """Which shard, and so which rank, owns each entity."""

    num_entities: int
    shards: int
    world_size: int
    shard_of: Tensor  # (num_entities,) int32

    @classmethod
    def build(cls, num_entities: int, *, shards: int, world_size: int, seed: int) -> ShardMap:
        gen = torch.Generator().manual_seed(seed ^ _PERMUTATION_SALT)
        perm = torch.randperm(num_entities, generator=gen)
        shard_of = torch.empty(num_entities, dtype=torch.int32)
        shard_of[perm] = (torch.arange(num_entities) % shards).to(torch.int32)
        return cls(num_entities, shards, world_size, shard_of)

    def with_world(self, world_size: int) -> ShardMap:
        return ShardMap(self.num_entities, self.shards, world_size, self.shard_of)

    def owner(self, ids: Tensor) -> Tensor:
        """The rank owning each of the entity ``ids``."""
        return (self.shard_of[ids.cpu()] % self.world_size).to(torch.long).to(ids.device)

    def shards_of(self, rank: int) -> list[int]:
        return list(range(rank, self.shards, self.world_size))

    def owned(self, rank: int) -> Tensor:
        """The entity ids ``rank`` owns in the order of its local table: shard by shard, each
        shard's ids ascending (so a shard's rows are one contiguous block of the table)."""
        parts = [self.rows_of_shard(s) for s in self.shards_of(rank)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def rows_of_shard(self, shard: int) -> Tensor:
        """The entity ids of one shard, ascending."""
        return (self.shard_of == shard).nonzero().squeeze(1)


def owned_positions(own: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(mask, position)``: which of ``ids`` are in the ascending id set ``own``, and where."""
    if own.numel() == 0:
        return torch.zeros_like(ids, dtype=torch.bool), torch.zeros_like(ids)
    pos = torch.searchsorted(own, ids.contiguous()).clamp_(max=own.numel() - 1)
    return own[pos] == ids, pos


class LocalIndex:
    """Where a rank's entity ids are in its local table (any order), by binary search."""

    def __init__(self, own: Tensor) -> None:
        self.order = torch.argsort(own)
        self.sorted = own[self.order]

    def locate(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(mask, local row)`` of each of ``ids`` (the row is meaningless where not held)."""
        mask, pos = owned_positions(self.sorted, ids)
        return mask, self.order[pos] if self.order.numel() else pos


class RowCache:
    """Rows fetched from other ranks, each with the step it was fetched at: a row may be used
    while it is at most ``staleness`` steps old.

    The rows live in a pool of slots that only grows (to the most rows ever cached at once);
    a step writes its new rows into free slots and re-sorts only the ids, their slots and
    their steps, so its cost does not grow with the rows it keeps. ``limit``: the most rows it
    can ever hold (the entities other ranks own), which the pool's growth never passes."""

    def __init__(self, staleness: int, limit: int | None = None) -> None:
        self.staleness = staleness
        self.limit = limit
        self.ids = torch.zeros(0, dtype=torch.long)  # ascending
        self.slots = torch.zeros(0, dtype=torch.long)  # each id's row in the pool
        self.steps = torch.zeros(0, dtype=torch.long)  # the step each row was fetched at
        self.pool: Tensor | None = None
        self.free = torch.zeros(0, dtype=torch.long)  # slots of the pool holding no row

    def lookup(self, ids: Tensor, step: int) -> tuple[Tensor, Tensor | None]:
        """``(mask, rows)``: which of ``ids`` are cached fresh enough for ``step``, and their
        rows (in the order of the ``True`` entries of the mask; ``None``: the cache is empty)."""
        if self.pool is None or not self.ids.numel():
            return torch.zeros_like(ids, dtype=torch.bool), None
        held, pos = owned_positions(self.ids, ids)
        fresh = held & (step - self.steps[pos] <= self.staleness)
        return fresh, self.pool[self.slots[pos[fresh]]]

    def update(self, ids: Tensor, rows: Tensor, step: int) -> None:
        """Add the rows of ``ids`` fetched at ``step`` (none of them cached fresh), and drop
        the rows too old for the next step."""
        if self.pool is None:
            self.pool = rows.new_empty((0, *rows.shape[1:]))
            self.ids, self.slots, self.steps, self.free = (
                t.to(ids.device) for t in (self.ids, self.slots, self.steps, self.free)
            )
        keep = self.steps >= step + 1 - self.staleness
        free = torch.cat((self.free, self.slots[~keep]))
        n = ids.numel()
        if free.numel() < n:  # grow by a quarter again at least (amortised copies), to the limit
            have = self.pool.shape[0]
            grow = max(n - free.numel(), have // 4)
            if self.limit is not None:
                grow = max(n - free.numel(), min(grow, self.limit - have))
            self.pool = torch.cat((self.pool, self.pool.new_empty((grow, *self.pool.shape[1:]))))
            extra = torch.arange(have, have + grow, device=free.device)
            free = torch.cat((free, extra))
        slots, self.free = free[:n], free[n:]
        self.pool[slots] = rows
        all_ids = torch.cat((self.ids[keep], ids))
        order = torch.argsort(all_ids)
        self.ids = all_ids[order]
        self.slots = torch.cat((self.slots[keep], slots))[order]
        self.steps = torch.cat((self.steps[keep], torch.full_like(ids, step)))[order]

    def clear(self) -> None:
        """Forget every row (the pool's memory is kept for the next epoch)."""
        if self.pool is not None:
            self.free = torch.arange(self.pool.shape[0], device=self.free.device)
        self.ids, self.slots, self.steps = self.ids[:0], self.slots[:0], self.steps[:0]

    @property
    def size(self) -> int:
        return int(self.ids.numel())


class ShardedExchange(Exchange):
    """Pull rows from their owners before a step; push row gradients to them after it."""

    def __init__(self, comm: Comm, shard_map: ShardMap, rank: int, *, staleness: int = 0) -> None:
        self.comm = comm
        self.map = shard_map
        self.rank = rank
        self.own = shard_map.owned(rank).to(comm.device)  # the local table's ids, in order
        others = shard_map.num_entities - self.own.numel()
        self.cache = RowCache(staleness, limit=others) if staleness > 0 else None
        self._step = 0  # steps taken, for the cache's ages
        # rows read from the cache, rows fetched (since the last stats; no host sync per step)
        self._reads = torch.zeros(2, dtype=torch.long, device=comm.device)
        self.index = LocalIndex(self.own)
        # where the ids of a step live: no host round trip per step on a GPU
        self._shard_of = shard_map.shard_of.to(comm.device)
        self.relations = StepExchange(comm, mode="dense", dense_tables=("relation",))
        self._touched: Tensor | None = None
        self._trainer: Trainable | None = None
        self._kit: Any = None

    def bind(self, trainer: Trainable) -> None:
        self._trainer = trainer
        self.relations.bind(trainer)

    def _owner(self, ids: Tensor) -> Tensor:
        return (self._shard_of[ids] % self.comm.world_size).long()

    # -- collectives ---------------------------------------------------------------------------
    def _exchange(
        self, send: Tensor, send_counts: Tensor, recv_counts: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``all_to_all`` of the rows of ``send`` (grouped by destination, ``send_counts`` rows
        each); returns what arrived (grouped by source) and the counts per source (exchanged
        first unless known: a reply returns as many rows as were asked)."""
        w = self.comm.world_size
        t0 = time.perf_counter()
        if recv_counts is None:
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts)
            self.comm.calls += 1
            self.comm.bytes_sent += (w - 1) * 8
        recv = send.new_empty((int(recv_counts.sum()), *send.shape[1:]))
        dist.all_to_all_single(recv, send.contiguous(), recv_counts.tolist(), send_counts.tolist())
        self.comm.seconds += time.perf_counter() - t0
        self.comm.calls += 1
        row = send[0].numel() * send.element_size() if send.shape[0] else 0
        self.comm.bytes_sent += (int(send_counts.sum()) - int(send_counts[self.rank])) * row
        return recv, recv_counts

    def fetch(self, ids: Tensor) -> Tensor:
        """The current rows of the unique entity ``ids`` from their owners (a collective: every
        rank calls it, each with its own ids)."""
        assert self._trainer is not None, "bind the exchange first"
        owners = self._owner(ids)
        order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners, minlength=self.comm.world_size)
        asked, asked_counts = self._exchange(ids[order], counts)
        _, pos = self.index.locate(asked)
        table = self._trainer.tables["entity"]
        got, _ = self._exchange(table.index_select(0, pos), asked_counts, counts)
        rows = torch.empty_like(got)
        rows[order] = got
        return rows

    # -- a step --------------------------------------------------------------------------------
    def pull(
        self, strategy: Any, batch: Tensor, draws: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """Fetch the rows this rank's share of the step touches; the strategy then computes on a
        compact table of those rows, with the batch and draws renumbered into it."""
        touched = torch.unique(strategy.touched(batch, draws))
        self._kit = strategy.kit
        self._kit.tables["entity"] = (
            self.fetch(touched) if self.cache is None else self._read(touched)
        )
        self._touched = touched

        def renumber(ids: Tensor) -> Tensor:  # ids outside this rank's share are never read
            _, pos = owned_positions(touched, ids)
            return pos

        local = batch.clone()
        local[..., 0] = renumber(batch[..., 0])
        local[..., 2] = renumber(batch[..., 2])
        return local, (renumber(draws) if draws is not None else None)

    def _read(self, touched: Tensor) -> Tensor:
        """The rows of ``touched`` under bounded staleness: this rank's own from its table,
        others from the cache while fresh enough, the rest fetched (a collective) and cached."""
        assert self.cache is not None and self._trainer is not None
        table = self._trainer.tables["entity"]
        own, pos = self.index.locate(touched)
        fresh, cached = self.cache.lookup(touched, self._step)  # never its own: never fetched
        need = ~(own | fresh)
        fetched = self.fetch(touched[need])  # every rank calls it, with what it lacks
        rows = table.new_empty((touched.numel(), table.shape[1]))
        rows[own] = table[pos[own]]
        if cached is not None:
            rows[fresh] = cached
        rows[need] = fetched
        self.cache.update(touched[need], fetched, self._step)
        self._reads += torch.stack((fresh.sum(), need.sum()))
        return rows

    def step(self, grads: dict[str, RowGrad]) -> dict[str, RowGrad]:
        assert self._touched is not None, "pull before step"
        g = grads["entity"]
        ids = self._touched[g.rows]
        owners = self._owner(ids)
        order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners, minlength=self.comm.world_size)
        # int64 ids travel bit-exactly as two float32 columns beside the values
        packed = torch.cat((ids[order].view(torch.float32).view(-1, 2), g.values[order]), 1)
        got, _ = self._exchange(packed, counts)
        got_ids = got[:, :2].contiguous().view(torch.int64).view(-1)
        _, pos = self.index.locate(got_ids)
        rows, inv = torch.unique(pos, return_inverse=True)
        summed = got.new_zeros(rows.numel(), got.shape[1] - 2).index_add_(0, inv, got[:, 2:])
        out = self.relations.step({k: v for k, v in grads.items() if k != "entity"})
        out["entity"] = RowGrad(rows, summed)
        self._touched = None
        self._step += 1
        if self._kit is not None and self._trainer is not None:  # the compact copy is done with
            self._kit.tables["entity"] = self._trainer.tables["entity"]
        return out

    def squared_norm(self, grads: dict[str, RowGrad]) -> float:
        """The whole step's squared gradient norm: the owners' rows summed over the ranks, the
        replicated relation gradient once, as rank 0 sums it (a CPU sum rounds by the thread
        count: ranks that clipped by their own drifted apart in the replicated relations)."""
        rest = sum(float(g.values.pow(2).sum()) for k, g in grads.items() if k != "entity")
        own = grads["entity"].values.pow(2).sum().double()
        buf = torch.stack([own, own.new_tensor(rest if self.rank == 0 else 0.0)])
        self.comm.dense_sum(buf)
        return float(buf.sum())

    def epoch_end(
        self, trainer: Trainable, loss_sum: float, queries: int, triples: int
    ) -> tuple[float, int, int]:
        if self.cache is not None:  # an epoch starts from the owners' rows: resumes repeat it
            self.cache.clear()
        return self.relations.epoch_end(trainer, loss_sum, queries, triples)

    def pop_stats(self) -> dict[str, Any]:
        out = self.comm.pop_stats()
        if self.cache is not None:
            out["rows_cached"], out["rows_fetched"] = self._reads.tolist()
            self._reads.zero_()
        return out
