"""One copy of the training triples per machine: ranks map the file the first one wrote, equal to
what each would read on its own, and the last one to leave removes it (as does the next writer
after a rank that died)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import kgpipe.data.shared_triples as shared_triples
from kgpipe.config import parse_config
from kgpipe.data.shards import read_manifest, read_shards, stage_shards
from kgpipe.data.shared_triples import open_shared
from kgpipe.errors import RunError
from kgpipe.pipeline import train
from kgpipe.storage import Store


def _store(tmp_path: Path, triples: torch.Tensor, name: str = "run") -> Store:
    store = Store(str(tmp_path / name))
    stage_shards(triples, store, num_shards=4, seed=3)
    return store


def _triples(n: int = 5_000, high: int = 40_000, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, high, (n, 3), generator=torch.Generator().manual_seed(seed))


def _entries(folder: Path) -> list[str]:
    """What the folder holds besides its lock file (which stays)."""
    if not folder.exists():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name != ".lock")


def test_ranks_map_one_file_equal_to_their_own_copy_and_the_last_removes_it(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, _triples())
    manifest = read_manifest(store)
    folder = tmp_path / "shared"
    own = read_shards(store, manifest, list(range(manifest.num_shards)))
    a = open_shared(store, manifest, wide=False, folder=folder)
    assert a is not None
    inode = os.stat(a.data).st_ino
    b = open_shared(store, manifest, wide=False, folder=folder)  # while `a` holds it
    assert b is not None and b.data == a.data
    assert os.stat(b.data).st_ino == inode  # mapped, not written again
    for got in (a.tensor, b.tensor):
        assert got.dtype == torch.int32 and torch.equal(got, own)
    assert [p for p in _entries(folder) if p.endswith(".npy")] == [a.data.name]
    a.close()
    assert a.data.exists()  # `b` still maps it
    b.close()
    b.close()  # a second close does nothing
    assert _entries(folder) == []
    assert torch.equal(a.tensor, own)  # the mappings outlive the file's name


def test_ids_past_int32_are_mapped_as_int64(tmp_path: Path) -> None:
    triples = _triples()
    triples[7, 2] = 2**31 + 5
    store = _store(tmp_path, triples)
    manifest = read_manifest(store)
    got = open_shared(store, manifest, wide=True, folder=tmp_path / "shared")
    assert got is not None and got.tensor.dtype == torch.int64
    assert torch.equal(got.tensor, read_shards(store, manifest, list(range(4))))
    got.close()
    with pytest.raises(RunError, match="say they fit int32"):
        open_shared(store, manifest, wide=False, folder=tmp_path / "shared")
    assert _entries(tmp_path / "shared") == []  # nothing half-written left


def test_a_corrupt_shard_is_a_clear_error_and_leaves_no_file(tmp_path: Path) -> None:
    store = _store(tmp_path, _triples())
    manifest = read_manifest(store)
    path = tmp_path / "run" / manifest.files[2]
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(RunError, match=r"shard-00002\.npy: checksum mismatch"):
        open_shared(store, manifest, wide=False, folder=tmp_path / "shared")
    assert _entries(tmp_path / "shared") == []


def test_no_room_in_the_temp_folder_means_a_copy_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path, _triples())

    class Full:
        free = 1 << 20

    monkeypatch.setattr(shared_triples.shutil, "disk_usage", lambda _path: Full)
    assert open_shared(store, read_manifest(store), wide=False, folder=tmp_path / "s") is None
    assert not [p for p in _entries(tmp_path / "s") if p.endswith(".npy")]


def test_the_next_writer_removes_what_dead_ranks_left_and_keeps_what_a_live_one_maps(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "shared"
    old = _store(tmp_path, _triples(seed=1), "old")
    live = _store(tmp_path, _triples(seed=2), "live")
    left = open_shared(old, read_manifest(old), wide=False, folder=folder)
    kept = open_shared(live, read_manifest(live), wide=False, folder=folder)
    assert left is not None and kept is not None
    left._use.close()  # type: ignore[union-attr]  # its rank died: the lock goes, the files stay
    left._use = None
    stray = folder / f"{'0' * 32}.npy.tmp"  # a writer that died mid-write (writers hold .lock)
    stray.write_bytes(b"half")
    assert left.data.exists()
    new = _store(tmp_path, _triples(seed=3), "new")
    got = open_shared(new, read_manifest(new), wide=False, folder=folder)
    assert got is not None
    assert not left.data.exists() and not stray.exists()
    assert kept.data.exists()  # a live rank maps it
    got.close()
    kept.close()
    assert _entries(folder) == []


_CHILD = """
import sys, time
from pathlib import Path
from kgpipe.data.shards import read_manifest
from kgpipe.data.shared_triples import open_shared
from kgpipe.storage import Store
store = Store(sys.argv[1])
got = open_shared(store, read_manifest(store), wide=False, folder=Path(sys.argv[2]))
import os
print(os.stat(got.data).st_ino, int(got.tensor.long().sum()), flush=True)
while not Path(sys.argv[3]).exists():
    time.sleep(0.02)
got.close()
"""


def test_ranks_in_processes_of_their_own_map_one_copy(tmp_path: Path) -> None:
    triples = _triples(n=200_000)
    store = _store(tmp_path, triples)
    folder, go = tmp_path / "shared", tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, store.url, str(folder), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        seen = [c.stdout.readline().split() for c in children]  # type: ignore[union-attr]
        assert len({ino for ino, _ in seen}) == 1  # one file, mapped by all three
        assert {int(total) for _, total in seen} == {int(triples.sum())}
        assert len([p for p in _entries(folder) if p.endswith(".npy")]) == 1
    finally:
        go.touch()
        for c in children:
            try:
                c.wait(timeout=60)
            except subprocess.TimeoutExpired:
                c.kill()
    assert [c.returncode for c in children] == [0, 0, 0]
    assert _entries(folder) == []


def _gang(tmp_path: Path, name: str, share: bool) -> dict[str, Any]:
    return {
        "run": {"seed": 5, "root": str(tmp_path), "name": name},
        "data": {"dataset": "umls"},
        "model": {"name": "transe", "dim": 16},
        "training": {"epochs": 2, "batch_size": 512, "negatives": 16, "chunk_size": 64},
        "evaluation": {"test": False, "every": 0},
        "distributed": {"workers": 2, "sync": "step", "share_triples": share},
    }


def test_a_gang_trains_the_same_model_on_the_shared_copy_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    from rank_callbacks import SeesSharedTriples
    from safetensors.torch import load_file

    for name, share in (("shared", True), ("own", False)):
        seen = tmp_path / f"seen-{name}"
        seen.mkdir()
        train(parse_config(_gang(tmp_path, name, share)), rank_callbacks=[SeesSharedTriples(seen)])
    a, b = (load_file(tmp_path / n / "model.safetensors") for n in ("shared", "own"))
    for key in a:
        assert torch.equal(a[key], b[key]), key
    store = Store(str(tmp_path / "shared"))
    key = shared_triples._key(read_manifest(store), False)
    for rank in (0, 1):  # both ranks mapped the one file while they trained
        assert f"{key}.npy" in (tmp_path / "seen-shared" / f"shared-{rank}").read_text().split()
    assert not any(shared_triples.shared_folder().glob(f"{key}.*"))  # and left nothing
