"""Staged training shards read back: int32 where the ids fit, int64 past that, one array filled
shard by shard, and a clear error for a shard that is not what the manifest says."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from kgpipe.data.shards import read_manifest, read_shards, stage_shards
from kgpipe.errors import RunError
from kgpipe.storage import Store


def _staged(tmp_path: Path, triples: torch.Tensor, shards: int = 3) -> Store:
    store = Store(str(tmp_path / "run"))
    stage_shards(triples, store, num_shards=shards, seed=5)
    return store


def test_shards_come_back_as_int32_with_the_same_triples(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    triples = torch.randint(0, 50_000, (1_000, 3), generator=gen)
    store = _staged(tmp_path, triples)
    manifest = read_manifest(store)
    got = read_shards(store, manifest, list(range(manifest.num_shards)))
    assert got.dtype == torch.int32
    # the shuffled order of the shards; the same multiset of rows
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, triples.tolist()))
    one = read_shards(store, manifest, [1])
    assert torch.equal(one, got[manifest.counts[0] : manifest.counts[0] + manifest.counts[1]])
    assert read_shards(store, manifest, []).shape == (0, 3)


def test_shards_are_the_seeded_shuffle_of_the_whole_array_to_the_byte(tmp_path: Path) -> None:
    """Each shard is gathered when it is written (not cut from a shuffled copy of the whole
    array) and holds the same bytes as the shuffle of the whole array, int32 input included."""
    gen = torch.Generator().manual_seed(1)
    triples = torch.randint(0, 9_000, (10_001, 3), generator=gen)
    whole = triples[torch.randperm(10_001, generator=torch.Generator().manual_seed(5))].numpy()
    want = []
    for part in np.array_split(whole.astype(np.int64), 3):
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(part), allow_pickle=False)
        want.append(hashlib.sha256(buf.getvalue()).hexdigest())
    for name, held in (("int64", triples), ("int32", triples.to(torch.int32))):
        manifest = read_manifest(_staged(tmp_path / name, held))
        assert list(manifest.sha256) == want, name


def test_ids_past_int32_come_back_as_int64(tmp_path: Path) -> None:
    triples = torch.tensor([[0, 1, 2], [3, 0, 2**31 + 7], [5, 1, 6], [2**40, 0, 1]])
    store = _staged(tmp_path, triples, shards=2)
    manifest = read_manifest(store)
    got = read_shards(store, manifest, [0, 1])
    assert got.dtype == torch.int64
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, triples.tolist()))


def test_a_late_shard_past_int32_widens_what_was_read_as_int32(tmp_path: Path) -> None:
    """Shards read as int32 first, then one with an id past int32: the rows read so far are
    widened and kept."""
    triples = torch.tensor([[0, 1, 2], [3, 0, 4], [5, 1, 6], [7, 0, 2**35 + 3]])
    store = _staged(tmp_path, triples, shards=4)  # one triple a shard
    manifest = read_manifest(store)
    shards = [read_shards(store, manifest, [i]) for i in range(4)]
    big = next(i for i, t in enumerate(shards) if t.dtype == torch.int64)
    order = [i for i in range(4) if i != big] + [big]
    got = read_shards(store, manifest, order)
    assert got.dtype == torch.int64
    assert got.tolist() == [shards[i].tolist()[0] for i in order]
    assert got[-1].tolist() == [7, 0, 2**35 + 3]


def test_a_shard_of_another_size_than_its_manifest_says_is_a_clear_error(tmp_path: Path) -> None:
    store = _staged(tmp_path, torch.arange(30).reshape(10, 3), shards=2)
    manifest = read_manifest(store)
    buf = io.BytesIO()
    np.save(buf, np.zeros((4, 3), dtype=np.int64))
    forged = manifest.__class__(
        manifest.num_shards,
        manifest.total,
        manifest.seed,
        manifest.files,
        manifest.counts,
        (manifest.sha256[0], hashlib.sha256(buf.getvalue()).hexdigest()),
    )
    store.write_bytes(manifest.files[1], buf.getvalue())
    with pytest.raises(
        RunError, match=r"shard-00001\.npy: holds \(4, 3\) ids, the manifest says 5"
    ):
        read_shards(store, forged, [0, 1])
    with pytest.raises(RunError, match="checksum mismatch"):
        read_shards(store, manifest, [1])
