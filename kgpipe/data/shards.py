"""Training triples as shuffled shards in the run folder, with a manifest written last.

The number of shards is a setting of the data, not of the cluster, so a run can resume on a
different number of workers; rank ``r`` of ``W`` reads shards ``r, r + W, ...`` (epoch-level
synchronisation) or all of them (step-level synchronisation, where every rank builds the same
global batch).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from kgpipe.errors import RunError
from kgpipe.storage import Store

__all__ = [
    "MANIFEST",
    "ShardManifest",
    "read_manifest",
    "read_shard",
    "read_shards",
    "stage_shards",
]

MANIFEST = "data/shards/manifest.json"
_I32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class ShardManifest:
    """What :func:`stage_shards` wrote: one entry per shard (file, triples, sha256)."""

    num_shards: int
    total: int
    seed: int
    files: tuple[str, ...]
    counts: tuple[int, ...]
    sha256: tuple[str, ...]

    def shards_of(self, rank: int, world_size: int) -> list[int]:
        return list(range(rank, self.num_shards, world_size))


def stage_shards(train: Tensor, store: Store, *, num_shards: int, seed: int) -> ShardManifest:
    """Shuffle ``train`` with ``seed`` and write ``num_shards`` ``int64`` ``.npy`` shards plus a
    manifest. Each shard's rows are gathered from ``train`` when it is written: the peak is
    ``train``, the permutation and one shard, not a shuffled copy of ``train``."""
    gen = torch.Generator().manual_seed(seed)
    n = int(train.shape[0])
    # the int32 permutation is the int64 one (pinned by tests/test_training.py), at half the size
    small = n <= torch.iinfo(torch.int32).max
    perm = torch.randperm(n, generator=gen, dtype=torch.int32 if small else torch.int64).numpy()
    rows = train.numpy()
    files, counts, sums = [], [], []
    for i, index in enumerate(np.array_split(perm, num_shards)):
        part = rows[index].astype(np.int64, copy=False)
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(part), allow_pickle=False)
        data = buf.getvalue()
        name = f"data/shards/shard-{i:05d}.npy"
        store.write_bytes(name, data)
        files.append(name)
        counts.append(int(part.shape[0]))
        sums.append(hashlib.sha256(data).hexdigest())
    manifest = ShardManifest(num_shards, n, seed, tuple(files), tuple(counts), tuple(sums))
    store.write_json(
        MANIFEST,
        {
            "num_shards": num_shards,
            "total": manifest.total,
            "seed": seed,
            "shards": [
                {"file": f, "count": c, "sha256": h}
                for f, c, h in zip(files, counts, sums, strict=True)
            ],
        },
    )
    return manifest


def read_manifest(store: Store) -> ShardManifest:
    if not store.exists(MANIFEST):
        raise RunError(f"{store.url_of(MANIFEST)}: no shard manifest (data not staged)")
    m = store.read_json(MANIFEST)
    shards = m["shards"]
    return ShardManifest(
        m["num_shards"],
        m["total"],
        m["seed"],
        tuple(s["file"] for s in shards),
        tuple(s["count"] for s in shards),
        tuple(s["sha256"] for s in shards),
    )


def read_shard(store: Store, manifest: ShardManifest, i: int) -> np.ndarray:
    """Shard ``i``'s ``[n, 3]`` ids as stored, its sha256 and shape checked against the
    manifest (:class:`RunError` naming the file otherwise)."""
    url = store.url_of(manifest.files[i])
    data = store.read_bytes(manifest.files[i])
    if hashlib.sha256(data).hexdigest() != manifest.sha256[i]:
        raise RunError(f"{url}: checksum mismatch (corrupt shard)")
    part = np.load(io.BytesIO(data), allow_pickle=False)
    del data
    if part.ndim != 2 or part.shape != (manifest.counts[i], 3):
        raise RunError(
            f"{url}: holds {part.shape} ids, the manifest says {manifest.counts[i]} triples"
        )
    return part


def read_shards(store: Store, manifest: ShardManifest, ids: list[int]) -> Tensor:
    """Concatenate shards ``ids`` (in order), verifying each file's sha256.

    The triples come back as ``int32`` where every id fits (half the memory of the ``int64``
    the shards are stored in: every rank of a step-synchronised gang holds all of them), and
    as ``int64`` otherwise; :meth:`StepStrategy.batch` widens each batch. Each shard is copied
    into one array as it is read, so the peak is the result and one shard (its bytes and its
    array), not twice the result."""
    if not ids:
        return torch.zeros(0, 3, dtype=torch.long)
    out = np.empty((sum(manifest.counts[i] for i in ids), 3), dtype=np.int32)
    at = 0
    for i in ids:
        part = read_shard(store, manifest, i)
        if out.dtype == np.int32 and part.size and (part.min() < _I32.min or part.max() > _I32.max):
            out = out.astype(np.int64)  # ids past int32: the rest is read as stored
        out[at : at + len(part)] = part
        at += len(part)
    return torch.from_numpy(out)
