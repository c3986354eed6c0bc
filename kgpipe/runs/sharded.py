"""What a rank of a sharded gang does besides training: commit its shards, read them back.

A commit (every ``checkpoint.every`` epochs and at the segment's end) is a collective:

1. rank 0 checks it may still commit (the run folder's lease, the driver) and removes what an
   earlier failed try at this epoch left;
2. every rank writes one file with its shards' ids, rows and optimiser state (rank 0 adds the
   replicated part: the relation table, its optimiser state, the step count, the RNG state);
3. the ranks tell rank 0 their file's name, size and checksum (computed from the written file);
   rank 0 commits the manifest listing every file -- only when every rank wrote its file -- and
   tells the ranks the outcome, so that a failed commit fails the whole gang at once (it is
   relaunched from the last commit, as after any failed commit).

With ``checkpoint.background`` (the default) a commit within a segment (``checkpoint.every``
below the validation interval) runs in a thread of its own while the next epoch trains: each
rank copies its shards' rows and optimiser state (rank 0 the replicated part too) at the
epoch's end, and the thread writes them and runs the commit's collectives in the commit's own
process group, which the training thread uses only once that thread is done (so the two
threads' collectives never interleave in one group). One commit is in flight at a time: the
next commit, and the end of training, wait for it. Its failure is raised on every rank at the
end of the first epoch by which some rank has seen it (the ranks agree on it with one small
collective per epoch, once a background commit was submitted; every rank hears rank 0's
outcome), so the gang fails as one and is relaunched from the last commit.
Without it, without a process group of its own, and at the segment's end (where the gang stops
and waits for its last commit anyway) the files are written from the live tables between two
steps. Either way the ranks wait for the slowest writer in the commit's group,
whose timeout is ``distributed.commit_timeout_s`` (the steps' collectives keep
``distributed.timeout_s``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from kgpipe.checkpoint import Checkpoint, CheckpointStore, TrainState, is_optimiser_state
from kgpipe.distributed.sharded import ShardedExchange
from kgpipe.errors import CheckpointError, Fenced, KgpipeError, StorageFull
from kgpipe.runs.callbacks import BackgroundCommits
from kgpipe.sharded_tensors import SHARD_PREFIX, local_rows, split_shards
from kgpipe.training.hooks import Callback, TrainerView
from kgpipe.training.records import EpochStats

__all__ = ["ShardedCommit", "load_rank_state"]


class ShardedCommit(Callback):
    """Runs on every rank of a sharded gang: each writes its shards, rank 0 commits."""

    def __init__(
        self,
        checkpoints: CheckpointStore,
        state: Callable[[Sequence[EpochStats]], TrainState],
        exchange: ShardedExchange,
        *,
        every: int,
        until: int,
        meta: dict[str, Any],
        group: Any = None,
        background: bool = False,
    ) -> None:
        self.checkpoints = checkpoints
        self.state = state
        self.exchange = exchange
        # the commit's own process group: its collectives wait for the slowest writer, under
        # distributed.commit_timeout_s rather than the step's timeout (None: the default group)
        self.group = group
        self.every = every
        self.until = until
        self.meta = meta
        self.committed: Checkpoint | None = None
        # a thread's collectives must not share a group with the training thread's
        self._commits: BackgroundCommits[Checkpoint | None] = BackgroundCommits(
            self.commit, background=background and group is not None, name="kgpipe-shards"
        )
        self._own = exchange.own.cpu()  # once: not a device sync in the commit's thread

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        self._stop_together()
        if stats.epoch % self.every and stats.epoch != self.until:
            return
        # one commit in flight (its failure stops every rank here); the segment's last one is
        # waited for at once, written from the live tables
        state = self._part(self.state([*trainer.history, stats]))
        self._done(self._commits.submit(state, stats, wait=stats.epoch == self.until))

    def on_train_end(self, trainer: TrainerView) -> None:
        self._done(self._commits.wait())

    def _stop_together(self) -> None:
        """A background commit that failed stops every rank at this same epoch's end, not at
        the next commit ``checkpoint.every`` epochs later. Each rank sees its own commit thread
        end at a different time, so they agree first: a max of one integer over the training's
        group at every epoch's end once a background commit was submitted (``in_flight`` stays
        true until the next submit takes the outcome, at the same epochs on every rank; it must
        not be cleared by one rank alone, or the ranks would disagree on this collective).
        Ranks that stopped at different epochs would fail the gang with a broken collective's
        echo instead of the commit's error."""
        if not self._commits.in_flight:
            return
        comm = self.exchange.comm
        # not the next epoch's traffic: that epoch's stats were taken already
        counters = (comm.seconds, comm.calls)
        try:
            failed = comm.max_int(int(self._commits.failed()))
        finally:
            comm.seconds, comm.calls = counters
        if failed:
            # every rank's thread ends with rank 0's outcome, so this raises it; a rank whose
            # own commit ended well (a collective of the commit broke elsewhere) stops too
            self._done(self._commits.wait())
            raise CheckpointError("a background commit failed on another rank of the gang")

    def close(self, timeout: float | None = None) -> None:
        """Wait for the commit in flight (its collectives need this rank's part), raise its
        failure, and stop the thread. With ``timeout`` (training failed: a peer may be gone
        without closing its sockets, and the commit's group waits up to
        ``distributed.commit_timeout_s``) a commit still running after that long is left to
        fail on its own; nothing of it is committed unless rank 0 wrote the manifest."""
        self._done(self._commits.close(timeout))

    def _done(self, ckpt: Checkpoint | None) -> None:
        if ckpt is not None:
            self.committed = ckpt

    def _part(self, state: TrainState) -> TrainState:
        """What this rank writes of ``state``: its entity rows and their optimiser state, and
        on rank 0 the replicated rest too."""
        if self.exchange.rank == 0:
            return state
        entity = {k: v for k, v in state.optimizer.items() if k.startswith("entity.")}
        tables = {"entity": state.tables["entity"]}
        return TrainState(state.epoch, state.global_step, tables, entity, state.history, None)

    def commit(self, state: TrainState, stats: EpochStats) -> Checkpoint | None:
        ex, store = self.exchange, self.checkpoints
        rank, world = ex.rank, ex.comm.world_size
        outcome: list[Any] = [[]]
        if rank == 0:
            try:
                if store.fence is not None:
                    store.fence()
                store.discard_uncommitted(state.epoch)
            except Exception as err:  # every rank stops with it
                outcome[0] = [_describe(err)]
        dist.broadcast_object_list(outcome, src=0, group=self.group)
        _raise(outcome[0], f"rank 0 may not commit epoch {state.epoch}")
        name = f"shards-r{rank:04d}-{uuid.uuid4().hex[:12]}.safetensors"
        written: tuple[str, dict[str, Any] | None, tuple[str, str] | None]
        try:
            tensors = self._tensors(state)
            info = store.write_file(state.epoch, name, tensors)
            # what the file holds, so that a resuming rank reads (and hashes) only its own files
            info.update(shards=ex.map.shards_of(rank), replicated=rank == 0)
            written = (name, info, None)
            del tensors
        except Exception as err:
            written = (name, None, _describe(err))
        every: list[Any] = [None] * world
        dist.all_gather_object(every, written, group=self.group)
        errors = [(e[0], f"rank {r}: {e[1]}") for r, (_, _, e) in enumerate(every) if e]
        ckpt = None
        if rank == 0 and not errors:
            try:
                files = {n: info for n, info, _ in every}
                meta = {
                    **self.meta,
                    "valid_mrr": stats.extra.get("valid_mrr"),
                    "strategy": "sharded",
                    "entity_shards": ex.map.shards,
                }
                ckpt = store.commit(state.epoch, state.global_step, state.history, files, meta)
                with contextlib.suppress(KgpipeError):  # retention is housekeeping
                    store.prune()
            except Exception as err:
                kind, text = _describe(err)
                errors.append((kind, f"rank 0: {text}"))
        outcome = [errors]
        dist.broadcast_object_list(outcome, src=0, group=self.group)
        _raise(outcome[0], f"the sharded checkpoint of epoch {state.epoch} was not committed")
        return ckpt

    def _tensors(self, state: TrainState) -> dict[str, torch.Tensor]:
        ex = self.exchange
        own = self._own
        local = {"table.entity": state.tables["entity"]}
        local.update(
            {f"optim.{k}": v for k, v in state.optimizer.items() if k.startswith("entity.")}
        )
        out = split_shards(
            own,
            ex.map.shard_of[own],
            ex.map.shards_of(ex.rank),
            {k: v.detach() for k, v in local.items()},
        )
        if ex.rank == 0:  # the replicated part, once
            out["table.relation"] = state.tables["relation"].detach().cpu().contiguous()
            for k, v in state.optimizer.items():
                if not k.startswith("entity."):
                    out[f"optim.{k}"] = v.detach().cpu().contiguous()
            if state.rng is not None:
                out["rng.torch"] = state.rng
        return out


def _describe(err: BaseException) -> tuple[str, str]:
    """The kind (what the gang makes of it: not retried when fenced or out of space) and the
    message of a commit's error, to travel to the other ranks."""
    kind = "fenced" if isinstance(err, Fenced) else "full" if isinstance(err, StorageFull) else ""
    text = str(err) if isinstance(err, KgpipeError) else f"{type(err).__name__}: {err}"
    return kind, text


def _raise(errors: list[tuple[str, str]], what: str) -> None:
    """Raise the commit's failure on every rank, as the class the gang treats it by."""
    if not errors:
        return
    message = f"{what}: " + "; ".join(text for _, text in errors)
    kinds = {kind for kind, _ in errors}
    if "fenced" in kinds:
        raise Fenced(message)
    if "full" in kinds:
        raise StorageFull(message)
    raise CheckpointError(message)


def load_rank_state(
    checkpoints: CheckpointStore,
    ckpt: Checkpoint,
    exchange: ShardedExchange,
    *,
    tables: bool = False,
) -> TrainState:
    """This rank's part of checkpoint ``ckpt``: its own entity rows and their optimiser state,
    and the replicated rest (``tables``: without any optimiser state). Of a sharded checkpoint
    only this rank's shards' tensors are read (whatever world size wrote it): the manifest says
    which shards each file holds, so a rank fetches and checks against its checksum only the
    files with its shards and the one with the replicated part (the driver has verified the
    whole checkpoint before the gang starts); a replicated checkpoint is read whole and sliced."""
    mine = set(exchange.map.shards_of(exchange.rank))

    def keep(key: str) -> bool:
        if tables and is_optimiser_state(key):
            return False
        if not key.startswith(SHARD_PREFIX):
            return True
        return int(key[len(SHARD_PREFIX) :].partition(".")[0]) in mine

    saved = ckpt.manifest.get("entity_shards")
    if saved is not None and int(saved) != exchange.map.shards:
        raise CheckpointError(
            f"{ckpt.url}: written with distributed.entity_shards={saved}, this run has "
            f"{exchange.map.shards}"
        )

    def needed(info: dict[str, Any]) -> bool:  # files of older manifests say nothing: all
        if "shards" not in info:
            return True
        return bool(info.get("replicated")) or not mine.isdisjoint(info["shards"])

    state, shards = checkpoints.load_selected(ckpt, keep, needed)
    own = exchange.own.cpu()
    if shards:
        local = local_rows(shards, own)
        state.tables["entity"] = local.pop("table.entity")
        state.optimizer.update({k.removeprefix("optim."): v for k, v in local.items()})
    else:
        state.tables["entity"] = state.tables["entity"][own]
        for k in [k for k in state.optimizer if k.startswith("entity.")]:
            state.optimizer[k] = state.optimizer[k][own]
    return state
