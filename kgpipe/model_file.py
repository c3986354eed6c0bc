"""``model.safetensors`` written and read without the whole entity table in memory.

A sharded run (``distributed.strategy: sharded``) never holds its entity table in one process,
and its driver should not either when the run ends. :func:`write_sharded_model` writes the
same ``model.safetensors`` as :func:`kgpipe.export.save_model` straight from a committed
sharded checkpoint, a block of entity ids at a time: a shard's rows are stored in ascending id
order, so each shard's rows of a block are one slice of its tensor, read lazily from the
checkpoint file. The driver holds one block (about :data:`BLOCK_BYTES`) and every shard's ids.

:func:`map_model` reads a model file as a memory map: the entity table stays in the file (the
page cache holds what was read lately, and the kernel drops it under memory pressure), so a
table larger than the process's memory can still be scored, at the disk's speed. Nothing about
the scoring changes: a mapped model is a :class:`~kgpipe.models.model.KGEModel` like any other.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from kgpipe.checkpoint import Checkpoint, CheckpointStore
from kgpipe.errors import CheckpointError, RunError
from kgpipe.export import MODEL_FILE, NO_MODEL
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.models.model import KGEModel
from kgpipe.models.spec import ModelSpec
from kgpipe.sharded_tensors import SHARD_PREFIX, shard_key
from kgpipe.storage import Store

__all__ = ["BLOCK_BYTES", "map_checkpoint", "map_model", "map_stored", "write_sharded_model"]

#: the entity rows written at once from a sharded checkpoint, in bytes
BLOCK_BYTES = 64 << 20

#: the tables of a model file are float32 (what kgpipe trains and writes)
_F32 = "F32"


def _header(spec: ModelSpec, shapes: dict[str, tuple[int, ...]]) -> bytes:
    """A safetensors header for float32 tensors of ``shapes`` in that order, padded to 8
    bytes."""
    out: dict[str, Any] = {"__metadata__": {"kgpipe_model": spec.to_json()}}
    start = 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 4
        out[name] = {"dtype": _F32, "shape": list(shape), "data_offsets": [start, start + size]}
        start += size
    text = json.dumps(out, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


def _write(f: Any, t: Tensor) -> int:
    data = t.contiguous().view(torch.uint8).numpy()
    f.write(data.data)
    return int(data.nbytes)


def _shard_parts(handles: list[Any]) -> tuple[list[tuple[Tensor, Any]], Tensor | None]:
    """Every shard's ``(ids, lazy slice of its rows)`` and the relation table, from the open
    checkpoint files."""
    parts: list[tuple[Tensor, Any]] = []
    relation = None
    for f in handles:
        keys = set(f.keys())
        if "table.relation" in keys:
            relation = f.get_tensor("table.relation")
        for key in sorted(keys):
            if key.startswith(SHARD_PREFIX) and key.endswith(".ids"):
                shard = int(key[len(SHARD_PREFIX) :].split(".", 1)[0])
                parts.append((f.get_tensor(key), f.get_slice(shard_key(shard, "table.entity"))))
    return parts, relation


def _blocks(parts: list[tuple[Tensor, Any]], rows: int, dim: int, url: str) -> Iterator[Tensor]:
    """The entity table in blocks of ascending ids, each gathered from every shard's slice;
    a :class:`CheckpointError` unless the shards hold every row of a block exactly once."""
    step = max(1, BLOCK_BYTES // (4 * max(1, dim)))
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        block = torch.empty((hi - lo, dim), dtype=torch.float32)
        seen = torch.zeros(hi - lo, dtype=torch.long)
        for ids, rows_of in parts:
            a, z = torch.searchsorted(ids, torch.tensor([lo, hi])).tolist()
            if z > a:
                block[ids[a:z] - lo] = rows_of[a:z]
                seen.index_add_(0, ids[a:z] - lo, torch.ones(z - a, dtype=torch.long))
        if not bool((seen == 1).all()):
            raise CheckpointError(
                f"{url}: the shards do not hold entities {lo}..{hi - 1} once each"
            )
        yield block


def _check_parts(
    spec: ModelSpec, parts: list[tuple[Tensor, Any]], relation: Tensor, url: str
) -> None:
    """Refuse shards and a relation table that do not make the model of ``spec``."""
    inter = INTERACTIONS.get(spec.name)(p=spec.p, margin=spec.margin)
    want = (spec.relation_rows, inter.relation_dim(spec.dim))
    if tuple(relation.shape) != want or relation.dtype != torch.float32:
        raise CheckpointError(
            f"{url}: its relation table ({tuple(relation.shape)}, {relation.dtype}) does not "
            f"fit the run's model ({want}, float32)"
        )
    for ids, rows_of in parts:
        shape, dtype = rows_of.get_shape(), rows_of.get_dtype()
        if dtype != _F32 or list(shape) != [int(ids.numel()), spec.dim]:
            raise CheckpointError(
                f"{url}: a shard's entity rows ({shape}, {dtype}) do not fit the run's model "
                f"({int(ids.numel())} ids of dimension {spec.dim}, F32)"
            )
    rows = sum(int(ids.numel()) for ids, _ in parts)
    if rows != spec.num_entities:
        raise CheckpointError(
            f"{url}: the shards hold {rows} entity rows, the model {spec.num_entities}"
        )


def _write_sharded(
    path: str, spec: ModelSpec, parts: list[tuple[Tensor, Any]], relation: Tensor, url: str
) -> None:
    rows = spec.num_entities
    header = _header(spec, {"entity": (rows, spec.dim), "relation": tuple(relation.shape)})
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for block in _blocks(parts, rows, spec.dim, url):
            _write(f, block)
        _write(f, relation)


def write_sharded_model(
    checkpoints: CheckpointStore,
    ckpt: Checkpoint,
    spec: ModelSpec,
    store: Store,
    rel: str = MODEL_FILE,
) -> KGEModel:
    """Write ``rel`` (``model.safetensors``: the entity and relation tables and the spec) from
    the sharded checkpoint ``ckpt``, a block of entity ids at a time; the file equals what
    :func:`~kgpipe.export.save_model` writes for the assembled model, to the tensor. Returns
    the model, mapped from the file as written (:func:`map_model`; on an object store, the
    local file that was uploaded: no second download)."""
    mapped: list[KGEModel] = []

    def produce(path: str) -> None:
        _write_sharded(path, spec, parts, relation, ckpt.url)
        mapped.append(map_model(path, store.url_of(rel)))

    with checkpoints.verified_files(ckpt) as paths, contextlib.ExitStack() as stack:
        if paths is None:
            raise CheckpointError(f"{ckpt.url}: checkpoint is incomplete or corrupt")
        handles = [stack.enter_context(safe_open(p, framework="pt")) for p in paths.values()]
        parts, found = _shard_parts(handles)
        if found is None or not parts:
            raise CheckpointError(f"{ckpt.url}: not a sharded checkpoint with a relation table")
        relation = found
        _check_parts(spec, parts, relation, ckpt.url)  # before anything is written
        size = 4 * (spec.num_entities * spec.dim + relation.numel())
        store.write_produced(rel, produce, size=size, checksum=False)
    return mapped[-1]


def map_model(path: str, url: str | None = None) -> KGEModel:
    """The model in the local safetensors file ``path``, its float32 entity table
    memory-mapped (copy-on-write: a write changes this process's copy, never the file; another
    type is read into memory as float32, as :func:`~kgpipe.export.load_model` reads it).
    ``url`` names the file in errors. The mapping outlives the file's name: the file may be
    removed after (its space is freed with the model)."""
    where = url or path
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > os.fstat(f.fileno()).st_size:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(length))
        spec = ModelSpec.from_json(header["__metadata__"]["kgpipe_model"])
        info = header["entity"]
        begin, end = info["data_offsets"]
        shape = tuple(int(x) for x in info["shape"])
        with safe_open(path, framework="pt") as st:  # checks the header and the offsets
            relation = st.get_tensor("relation").float()
            if info["dtype"] != _F32 or not shape[0]:
                entity = st.get_tensor("entity").float()
            else:
                if end - begin != int(np.prod(shape)) * 4:
                    raise ValueError("the entity table's size does not match its shape")
                rows = np.memmap(
                    path, dtype=np.float32, mode="c", offset=8 + length + begin, shape=shape
                )
                entity = torch.from_numpy(rows)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError, struct.error) as err:
        raise RunError(f"{where}: not a readable kgpipe model file ({err})") from None
    try:
        return KGEModel(spec, tables=(entity, relation))
    except ValueError as err:
        raise RunError(f"{where}: its tables do not fit its model spec ({err})") from None


def map_checkpoint(checkpoints: CheckpointStore, ckpt: Checkpoint, spec: ModelSpec) -> KGEModel:
    """The model of the sharded checkpoint ``ckpt``: written as a model file in the system's
    temp folder (``TMPDIR``), mapped, and its name removed at once (the disk space it takes is
    freed with the model). Where ``TMPDIR`` is a memory file system (tmpfs), the file is in
    memory: point ``TMPDIR`` at a disk for a table larger than memory."""
    with tempfile.TemporaryDirectory(prefix="kgpipe-model-") as folder:
        return write_sharded_model(checkpoints, ckpt, spec, Store(folder))


def map_stored(store: Store, rel: str = MODEL_FILE) -> KGEModel:
    """:func:`map_model` of the model file at ``rel`` in ``store`` (from an object store, a
    download to the system's temp folder, whose name is removed once mapped: see
    :func:`map_checkpoint` on a tmpfs ``TMPDIR``)."""
    if not store.exists(rel):
        raise RunError(f"{store.url_of(rel)}: {NO_MODEL}")
    with store.local_copy(rel) as path:
        return map_model(path, store.url_of(rel))
