"""Checkpoints on any fsspec URL, committed by a manifest written last.

Layout under the run folder::

    checkpoints/epoch-000007/state-<token>.safetensors   # tables, optimiser state, RNG state
    checkpoints/epoch-000007/manifest.json               # the commit: checksums, epoch, ...
    checkpoints/corrupt/epoch-000009-<token>.json        # a manifest un-committed on resume

The state file's name carries a random token, so an attempt that failed half-way (or a stale
writer) can never overwrite bytes that a committed manifest points to. A checkpoint exists only
once its manifest does; "latest" is the newest one whose manifest exists and whose files match
their checksums (:mod:`kgpipe.checksums`); incomplete or corrupt ones are skipped with a warning.
Committed manifests are created, never overwritten (a stale writer's commit of the same epoch
fails); retention removes a manifest first, so a half-deleted checkpoint is an uncommitted one.

Sharded ranks write a file each; rank 0's manifest lists them (:mod:`kgpipe.sharded_tensors`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from safetensors import safe_open
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_file as st_save_file
from torch import Tensor

from kgpipe.checksums import CHECKSUM, entry_matches
from kgpipe.errors import CheckpointError
from kgpipe.sharded_tensors import SHARD_PREFIX, assemble_shards, is_optimiser_state
from kgpipe.storage import Store

__all__ = ["Checkpoint", "CheckpointStore", "TrainState", "is_optimiser_state"]

log = logging.getLogger("kgpipe.checkpoint")

FORMAT = "kgpipe-checkpoint/2"  # /2: XXH3-128 checksums
READABLE = (FORMAT, "kgpipe-checkpoint/1")  # /1: SHA-256
ROOT = "checkpoints"
_DIR = re.compile(r"^epoch-(\d{6,})$")


@dataclass
class TrainState:
    """Everything a resume needs, besides the staged data and the config."""

    epoch: int
    global_step: int
    tables: dict[str, Tensor]  # entity, relation
    optimizer: dict[str, Tensor]  # RowOptimizer.state_dict()
    history: list[dict[str, Any]] = field(default_factory=list)  # EpochStats.as_dict() rows
    rng: Tensor | None = None  # torch.get_rng_state() of the writer

    def snapshot(self) -> TrainState:
        """A copy that training may not change any more (for a background upload)."""
        return TrainState(
            self.epoch,
            self.global_step,
            # copied to host memory (from a GPU too): the upload needs CPU tensors anyway
            {k: v.detach().to("cpu", copy=True) for k, v in self.tables.items()},
            {k: v.detach().to("cpu", copy=True) for k, v in self.optimizer.items()},
            [dict(h) for h in self.history],
            self.rng.clone() if self.rng is not None else None,
        )


@dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint (its manifest exists)."""

    url: str
    epoch: int
    manifest: dict[str, Any]

    @property
    def global_step(self) -> int:
        return int(self.manifest["global_step"])

    @property
    def valid_mrr(self) -> float | None:
        return None if (v := self.manifest.get("valid_mrr")) is None else float(v)


def _dir(epoch: int) -> str:
    return f"{ROOT}/epoch-{epoch:06d}"


class CheckpointStore:
    """Commit, find, verify, load and prune the checkpoints of one run folder."""

    def __init__(
        self,
        store: Store,
        *,
        keep_last: int = 3,
        keep_best: bool = True,
        fence: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.fence = fence  # raises when this writer may no longer commit (its lease was lost)

    # -- writing ---------------------------------------------------------------------------------
    def save(self, state: TrainState, meta: dict[str, Any]) -> Checkpoint:
        """Write ``state`` and commit it; ``meta`` (config hash, world size, ...) goes into the
        manifest. Raises :class:`CheckpointError` if this epoch is already committed."""
        folder = _dir(state.epoch)
        manifest_rel = f"{folder}/manifest.json"
        if self.store.exists(manifest_rel):
            raise CheckpointError(
                f"{self.store.url_of(manifest_rel)}: epoch {state.epoch} is already committed; "
                "committed checkpoints are never overwritten"
            )
        tensors = {f"table.{k}": v.detach().cpu().contiguous() for k, v in state.tables.items()}
        tensors.update(
            {f"optim.{k}": v.detach().cpu().contiguous() for k, v in state.optimizer.items()}
        )
        if state.rng is not None:
            tensors["rng.torch"] = state.rng
        name = f"state-{uuid.uuid4().hex[:12]}.safetensors"
        if self.fence is not None:  # a writer that may not commit touches nothing
            self.fence()
        self.discard_uncommitted(state.epoch)  # what a killed or failed earlier try left there
        try:
            files = {name: self.write_file(state.epoch, name, tensors)}
            return self.commit(state.epoch, state.global_step, state.history, files, meta)
        except BaseException:
            # a failed commit (a full disk, a lost store) leaves no file of its own behind to
            # hold the space that a resume will need -- and touches no one else's
            self._discard_own(folder, name)
            raise

    def write_file(self, epoch: int, name: str, tensors: dict[str, Tensor]) -> dict[str, Any]:
        """Write (streamed, no copy in memory) and hash a file of ``epoch``: its manifest entry."""
        metadata = {"format": FORMAT, "epoch": str(epoch)}
        digest, size = self.store.write_produced(
            f"{_dir(epoch)}/{name}",
            lambda path: st_save_file(tensors, path, metadata=metadata),
            size=sum(t.numel() * t.element_size() for t in tensors.values()),
        )
        return {CHECKSUM: digest, "bytes": size}

    def commit(
        self,
        epoch: int,
        global_step: int,
        history: list[dict[str, Any]],
        files: dict[str, dict[str, Any]],
        meta: dict[str, Any],
    ) -> Checkpoint:
        """Commit epoch ``epoch`` with its written ``files``: the manifest, written last (and
        checked once more for a racing writer)."""
        folder = _dir(epoch)
        manifest_rel = f"{folder}/manifest.json"
        manifest = {
            "format": FORMAT,
            "epoch": epoch,
            "global_step": global_step,
            "files": files,
            "history": history,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **meta,
        }
        if self.fence is not None:
            self.fence()
        data, twice = (json.dumps(manifest, indent=2) + "\n").encode(), CheckpointError(
            f"{self.store.url_of(manifest_rel)}: committed twice (by another writer)"
        )  # fmt: skip
        if self.store.exists(manifest_rel):  # (stores that ignore a conditional PUT: this)
            raise twice
        try:  # created, never replaced: a writer stalled past its fence can't overwrite it
            self.store.create(manifest_rel, data)
        except FileExistsError:  # a successor's, unless a retry found this very write
            if self.store.read_bytes(manifest_rel) != data:
                raise twice from None
        return Checkpoint(self.store.url_of(folder), epoch, manifest)

    def _discard_own(self, folder: str, name: str) -> None:
        try:
            if not self.store.exists(f"{folder}/manifest.json"):
                self.store.remove(f"{folder}/{name}", recursive=False)
                self.store.remove_empty_folders([folder])
        except Exception as err:  # best effort: the commit's own error is the one to report
            log.warning("%s: could not remove the uncommitted file %s: %s", folder, name, err)

    def discard_uncommitted(self, epoch: int) -> None:
        """Remove what a killed or failed earlier try at ``epoch`` left (before writing it)."""
        folder = _dir(epoch)
        try:
            if not self.store.exists(f"{folder}/manifest.json"):
                self.store.remove(folder)
        except Exception as err:  # best effort: the commit's own error is the one to report
            log.warning("%s: could not remove the uncommitted files: %s", folder, err)

    # -- reading ---------------------------------------------------------------------------------
    def epochs(self) -> list[int]:
        """Epochs with a checkpoint folder (committed or not), oldest first."""
        out = []
        for name in self.store.list(ROOT):
            m = _DIR.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def manifest(self, epoch: int) -> dict[str, Any] | None:
        rel = f"{_dir(epoch)}/manifest.json"
        if not self.store.exists(rel):
            return None
        try:
            data = json.loads(self.store.read_text(rel))
        except (ValueError, UnicodeDecodeError):
            log.warning("%s: unreadable manifest; skipped", self.store.url_of(rel))
            return None
        if not isinstance(data, dict) or data.get("format") not in READABLE:
            log.warning("%s: not a %s manifest; skipped", self.store.url_of(rel), FORMAT)
            return None
        return data

    def committed(self) -> list[Checkpoint]:
        """Checkpoints whose manifest exists (not verified), oldest first."""
        out = []
        for epoch in self.epochs():
            m = self.manifest(epoch)
            if m is not None:
                out.append(Checkpoint(self.store.url_of(_dir(epoch)), epoch, m))
        return out

    @contextlib.contextmanager
    def verified_files(
        self, ckpt: Checkpoint, files: Callable[[dict[str, Any]], bool] | None = None
    ) -> Iterator[dict[str, str] | None]:
        """Local paths of the checkpoint's files (those whose manifest entry ``files`` accepts),
        each checked against the manifest's size and checksum (read from disk in blocks, never
        whole into memory); ``None`` if any is missing or differs."""
        with contextlib.ExitStack() as stack:
            paths: dict[str, str] = {}
            for name, info in ckpt.manifest["files"].items():
                if files is not None and not files(info):
                    continue
                rel = f"{_dir(ckpt.epoch)}/{name}"
                try:
                    path = stack.enter_context(self.store.local_copy(rel))
                except FileNotFoundError:
                    log.warning("%s: missing; checkpoint of epoch %d skipped", rel, ckpt.epoch)
                    yield None
                    return
                if not entry_matches(path, info):
                    log.warning(
                        "%s: checksum mismatch (corrupt); checkpoint of epoch %d skipped",
                        self.store.url_of(rel), ckpt.epoch,
                    )  # fmt: skip
                    yield None
                    return
                paths[name] = path
            yield paths

    def verify(self, ckpt: Checkpoint) -> bool:
        with self.verified_files(ckpt) as paths:
            return paths is not None

    def latest(self, *, max_epoch: int | None = None) -> tuple[Checkpoint, TrainState] | None:
        """The newest committed checkpoint that verifies, loaded; ``None`` if there is none."""
        for ckpt in reversed(self.committed()):
            if max_epoch is not None and ckpt.epoch > max_epoch:
                continue
            with self.verified_files(ckpt) as paths:
                if paths is not None:
                    return ckpt, self._state(ckpt, paths)
        return None

    def resume_point(self) -> tuple[Checkpoint, TrainState] | None:
        """:meth:`latest`, after un-committing newer checkpoints that fail verification (their
        manifest is kept as ``corrupt/epoch-N-<token>.json``) so those epochs can be committed
        again by the resumed training."""
        found = self.latest()
        self._uncommit_after(found[0].epoch if found else 0)
        return found

    def resume_checkpoint(self) -> Checkpoint | None:
        """Like :meth:`resume_point`, without loading the state (a gang's driver: the ranks
        load it; its history is in the manifest)."""
        found = self.latest_verified()
        self._uncommit_after(found.epoch if found else 0)
        return found

    def latest_verified(self) -> Checkpoint | None:
        """The newest committed checkpoint that verifies (not loaded)."""
        return next((c for c in reversed(self.committed()) if self.verify(c)), None)

    def _uncommit_after(self, start: int) -> None:
        for epoch in self.epochs():  # an unreadable manifest too: it would block the epoch
            manifest = f"{_dir(epoch)}/manifest.json"
            if epoch <= start or not self.store.exists(manifest):
                continue
            data = self.store.read_bytes(manifest)
            try:  # a newer kgpipe's manifest is not ours to set aside (its save refuses)
                if json.loads(data).get("format") not in READABLE:
                    continue
            except (ValueError, UnicodeDecodeError, AttributeError):
                pass  # empty, cut short, not an object: unreadable
            rel = f"{ROOT}/corrupt/epoch-{epoch:06d}-{uuid.uuid4().hex[:8]}.json"
            self.store.write_bytes(rel, data)  # as it was
            self.store.remove(manifest, recursive=False)
            said = "checkpoint of epoch %d does not verify; un-committed (manifest kept as %s)"
            log.warning(said, epoch, self.store.url_of(rel))

    def load(self, ckpt: Checkpoint) -> TrainState:
        with self.verified_files(ckpt) as paths:
            if paths is None:
                raise CheckpointError(f"{ckpt.url}: checkpoint is incomplete or corrupt")
            return self._state(ckpt, paths)

    def _state(self, ckpt: Checkpoint, paths: dict[str, str]) -> TrainState:
        tensors: dict[str, Tensor] = {}
        for path in paths.values():
            # read straight into the tensors (one copy of the state, as loading bytes was three)
            tensors.update(st_load_file(path, backend="pread"))
        if any(k.startswith(SHARD_PREFIX) for k in tensors):
            tensors = assemble_shards(tensors)
        return _state_of(ckpt, tensors)

    def load_selected(
        self,
        ckpt: Checkpoint,
        keep: Callable[[str], bool],
        files: Callable[[dict[str, Any]], bool] | None = None,
    ) -> tuple[TrainState, dict[str, Tensor]]:
        """The state of ``ckpt`` read from its verified files (those ``files`` accepts, by their
        manifest entry), with only the tensors whose name ``keep`` accepts; the shard tensors
        among them come apart (a rank of a sharded gang reads its own shards)."""
        with self.verified_files(ckpt, files) as paths:
            if paths is None:
                raise CheckpointError(f"{ckpt.url}: checkpoint is incomplete or corrupt")
            tensors: dict[str, Tensor] = {}
            for path in paths.values():
                with safe_open(path, framework="pt") as f:
                    for k in f.keys():  # noqa: SIM118 -- safe_open has no __iter__
                        if keep(k):
                            tensors[k] = f.get_tensor(k)
            shards = {k: v for k, v in tensors.items() if k.startswith(SHARD_PREFIX)}
            return _state_of(ckpt, tensors), shards

    def load_tables(self, ckpt: Checkpoint) -> TrainState:
        """The state of ``ckpt`` without its optimiser state: the tables (a sharded checkpoint's
        entity table assembled from its shards), counters and history."""
        state, shards = self.load_selected(ckpt, lambda k: not is_optimiser_state(k))
        if shards:
            whole = assemble_shards(shards)
            state.tables.update({k.removeprefix("table."): v for k, v in whole.items()})
        return state

    # -- retention -------------------------------------------------------------------------------
    def prune(self) -> list[int]:
        """Remove committed checkpoints beyond the newest ``keep_last`` (and the best by
        validation MRR), and uncommitted leftovers older than the newest commit."""
        committed = self.committed()
        keep = {c.epoch for c in committed[-self.keep_last :]}
        best = _best(committed)
        if self.keep_best and best is not None:
            keep.add(best.epoch)
        newest = committed[-1].epoch if committed else 0
        done = {c.epoch for c in committed}
        removed = []
        for epoch in self.epochs():
            if epoch in keep or (epoch not in done and epoch >= newest):
                continue  # kept, or possibly being written right now
            if epoch in done:  # un-commit first: a half-deleted checkpoint is an uncommitted one
                self.store.remove(f"{_dir(epoch)}/manifest.json", recursive=False)
            self.store.remove(_dir(epoch))
            removed.append(epoch)
        return removed

    def best(self) -> Checkpoint | None:
        """The committed checkpoint with the best validation MRR (the earliest on ties)."""
        return _best(self.committed())


def _state_of(ckpt: Checkpoint, tensors: dict[str, Tensor]) -> TrainState:
    """The state in a checkpoint's ``table.*``, ``optim.*`` and ``rng.torch`` tensors."""
    parts: dict[str, dict[str, Tensor]] = {"table": {}, "optim": {}}
    for k, v in tensors.items():
        kind, _, name = k.partition(".")
        if kind in parts:
            parts[kind][name] = v
    history, rng = list(ckpt.manifest["history"]), tensors.get("rng.torch")
    return TrainState(ckpt.epoch, ckpt.global_step, parts["table"], parts["optim"], history, rng)


def _best(committed: list[Checkpoint]) -> Checkpoint | None:
    scored = [c for c in committed if c.valid_mrr is not None]
    return max(scored, key=lambda c: (c.valid_mrr, -c.epoch)) if scored else None
