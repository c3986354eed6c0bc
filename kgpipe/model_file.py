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
from kgpipe.export import MODEL_FILE
from kgpipe.models.model import KGEModel
from kgpipe.models.spec import ModelSpec
from kgpipe.sharded_tensors import SHARD_PREFIX, shard_key
from kgpipe.storage import Store

__all__ = ["BLOCK_BYTES", "map_checkpoint", "map_model", "map_stored", "write_sharded_model"]

#: the entity rows written at once from a sharded checkpoint, in bytes
BLOCK_BYTES = 64 << 20

_DTYPES: dict[torch.dtype, tuple[str, Any]] = {
    torch.float32: ("F32", np.float32),
    torch.float64: ("F64", np.float64),
    torch.float16: ("F16", np.float16),
}
_BY_NAME = {name: (dtype, np_dtype) for dtype, (name, np_dtype) in _DTYPES.items()}


def _header(spec: ModelSpec, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> bytes:
    """A safetensors header for the tensors of ``shapes`` in that order, padded to 8 bytes."""
    out: dict[str, Any] = {"__metadata__": {"kgpipe_model": spec.to_json()}}
    start = 0
    for name, (shape, dtype) in shapes.items():
        size = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        out[name] = {
            "dtype": _DTYPES[dtype][0],
            "shape": list(shape),
            "data_offsets": [start, start + size],
        }
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


def _blocks(
    parts: list[tuple[Tensor, Any]], rows: int, dim: int, dtype: torch.dtype, url: str
) -> Iterator[Tensor]:
    """The entity table in blocks of ascending ids, each gathered from every shard's slice."""
    step = max(1, BLOCK_BYTES // max(1, dim * torch.empty(0, dtype=dtype).element_size()))
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        block = torch.empty((hi - lo, dim), dtype=dtype)
        filled = 0
        for ids, rows_of in parts:
            a, z = torch.searchsorted(ids, torch.tensor([lo, hi])).tolist()
            if z > a:
                block[ids[a:z] - lo] = rows_of[a:z]
                filled += z - a
        if filled != hi - lo:
            raise CheckpointError(
                f"{url}: the shards do not hold entities {lo}..{hi - 1} once each"
            )
        yield block


def _write_sharded(
    path: str, spec: ModelSpec, parts: list[tuple[Tensor, Any]], relation: Tensor, url: str
) -> None:
    dtype = parts[0][1].get_dtype() if parts else "F32"
    entity_dtype = _BY_NAME[dtype][0] if dtype in _BY_NAME else None
    if entity_dtype is None:
        raise CheckpointError(f"{url}: entity rows of type {dtype} cannot be written as a model")
    rows = sum(int(ids.numel()) for ids, _ in parts)
    if rows != spec.num_entities:
        raise CheckpointError(
            f"{url}: the shards hold {rows} entity rows, the model {spec.num_entities}"
        )
    shapes = {
        "entity": ((rows, spec.dim), entity_dtype),
        "relation": (tuple(relation.shape), relation.dtype),
    }
    header = _header(spec, shapes)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for block in _blocks(parts, rows, spec.dim, entity_dtype, url):
            _write(f, block)
        _write(f, relation)


def write_sharded_model(
    checkpoints: CheckpointStore,
    ckpt: Checkpoint,
    spec: ModelSpec,
    store: Store,
    rel: str = MODEL_FILE,
) -> None:
    """Write ``rel`` (``model.safetensors``: the entity and relation tables and the spec) from
    the sharded checkpoint ``ckpt``, a block of entity ids at a time; the file equals what
    :func:`~kgpipe.export.save_model` writes for the assembled model, to the tensor."""
    with checkpoints.verified_files(ckpt) as paths, contextlib.ExitStack() as stack:
        if paths is None:
            raise CheckpointError(f"{ckpt.url}: checkpoint is incomplete or corrupt")
        handles = [stack.enter_context(safe_open(p, framework="pt")) for p in paths.values()]
        parts, relation = _shard_parts(handles)
        if relation is None or not parts:
            raise CheckpointError(f"{ckpt.url}: not a sharded checkpoint with a relation table")
        size = spec.num_entities * spec.dim * 4 + relation.numel() * relation.element_size()
        store.write_produced(
            rel, lambda path: _write_sharded(path, spec, parts, relation, ckpt.url), size=size
        )


def map_model(path: str, url: str | None = None) -> KGEModel:
    """The model in the local safetensors file ``path``, its entity table memory-mapped
    (copy-on-write: a write changes this process's copy, never the file). ``url`` names the
    file in errors. The mapping outlives the file's name: the file may be removed after."""
    where = url or path
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > os.fstat(f.fileno()).st_size:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(length))
        spec = ModelSpec.from_json(header["__metadata__"]["kgpipe_model"])
        info = header["entity"]
        dtype, np_dtype = _BY_NAME[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(int(x) for x in info["shape"])
        if end - begin != int(np.prod(shape)) * np.dtype(np_dtype).itemsize:
            raise ValueError("the entity table's size does not match its shape")
        rows = np.memmap(path, dtype=np_dtype, mode="c", offset=8 + length + begin, shape=shape)
        with safe_open(path, framework="pt") as st:
            relation = st.get_tensor("relation")
        entity = torch.from_numpy(rows) if shape[0] else torch.zeros(shape, dtype=dtype)
        return KGEModel(spec, tables=(entity, relation))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError, struct.error) as err:
        raise RunError(f"{where}: not a readable kgpipe model file ({err})") from None


def map_checkpoint(checkpoints: CheckpointStore, ckpt: Checkpoint, spec: ModelSpec) -> KGEModel:
    """The model of the sharded checkpoint ``ckpt``: written as a model file in the system's
    temp folder (``TMPDIR``), mapped, and its name removed at once (the disk space it takes is
    freed with the model)."""
    with tempfile.TemporaryDirectory(prefix="kgpipe-model-") as folder:
        write_sharded_model(checkpoints, ckpt, spec, Store(folder))
        return map_model(os.path.join(folder, MODEL_FILE), f"{ckpt.url} (as a model file)")


def map_stored(store: Store, rel: str = MODEL_FILE) -> KGEModel:
    """:func:`map_model` of the model file at ``rel`` in ``store`` (from an object store, a
    download to the system's temp folder, whose name is removed once mapped)."""
    if not store.exists(rel):
        raise RunError(f"{store.url_of(rel)}: no model file (did training finish?)")
    with store.local_copy(rel) as path:
        return map_model(path, store.url_of(rel))
