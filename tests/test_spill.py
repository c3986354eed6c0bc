"""Staging within ``data.memory_budget``: ids spilled to a file and deduplicated a group of heads
at a time give exactly what staging in memory gives (kgpipe.data.dedup)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import kgpipe.data.dedup as dedup
import kgpipe.data.reading as reading
from kgpipe.config import DataConfig, RunConfig
from kgpipe.config.hash import hashed_view
from kgpipe.data.dataset import load_dataset
from kgpipe.errors import DataError, StorageError, StorageFull


def _brute_force(rows: np.ndarray) -> list[int]:
    seen: dict[tuple[int, ...], int] = {}
    for i, row in enumerate(map(tuple, rows.tolist())):
        seen.setdefault(row, i)
    return sorted(seen.values())


def _small_pieces(
    monkeypatch: pytest.MonkeyPatch, *, group: int, block: int, budget: int = 1 << 20
) -> None:
    """Blocks of ``block`` lines and groups of about ``group`` rows under ``budget`` bytes."""
    monkeypatch.setattr(dedup, "_MIN_ROWS", 1)
    line = budget // 4 // block
    monkeypatch.setattr(dedup, "_BLOCK_LINE", line)
    monkeypatch.setattr(dedup, "_GROUP_ROW", (budget - block * line) // group)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize(("group", "block"), [(10_000, 10_000), (300, 128), (47, 1_000)])
def test_spilled_deduplication_keeps_every_first_occurrence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dtype: str, group: int, block: int
) -> None:
    """One group in one block; 10 groups read in blocks of 128 lines; 64 groups."""
    _small_pieces(monkeypatch, group=group, block=block)
    rng = np.random.default_rng(0)
    n = 3_000
    rows = np.stack(
        [rng.integers(0, 40, n), rng.integers(0, 3, n), rng.integers(0, 40, n)], 1
    ).astype(dtype)
    ids = dedup.SpilledIds("x.tsv", n, np.dtype(dtype), str(tmp_path))
    for at in range(0, n, 700):  # written in pieces, as the reader maps them
        ids.write(rows[at : at + 700])
    assert os.listdir(tmp_path) == []  # the file has no name
    out, kept = dedup.spilled_first_occurrences(ids, 40, 3, 1 << 20)
    ids.close()
    first = _brute_force(rows)
    assert np.flatnonzero(kept).tolist() == first
    assert out.dtype == np.int64 and out.tolist() == rows[first].tolist()
    assert len(first) < n


def test_spilled_deduplication_of_ids_too_wide_for_one_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """2^31 entities and 4 relations: a row has no int64 key; groups sort the rows themselves."""
    _small_pieces(monkeypatch, group=200, block=256)
    rng = np.random.default_rng(2)
    n = 2_000
    rows = np.stack(
        [rng.integers(0, 30, n), rng.integers(0, 4, n), rng.integers(2**31 - 30, 2**31, n)], 1
    ).astype(np.int64)
    ids = dedup.SpilledIds("x.tsv", n, np.dtype(np.int64), str(tmp_path))
    ids.write(rows)
    out, kept = dedup.spilled_first_occurrences(ids, 2**31, 4, 1 << 20)
    assert np.flatnonzero(kept).tolist() == _brute_force(rows)
    assert out.tolist() == rows[_brute_force(rows)].tolist()


def _graph(tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    files = {}
    for split, n in (("train", 4_000), ("valid", 300), ("test", 300)):
        lines = ["head\trelation\ttail"] if split == "train" else []
        lines += [
            f"e{h}\tr{r}\te{t}"
            for h, r, t in zip(
                rng.integers(0, 90, n), rng.integers(0, 4, n), rng.integers(0, 90, n), strict=True
            )
        ]
        path = tmp_path / f"{split}.tsv"
        path.write_text("\n".join(lines) + "\n")
        files[split] = str(path)
    return files


def _spilling(monkeypatch: pytest.MonkeyPatch, seen: list[str]) -> list[int]:
    """Every split spills (its in-memory need is taken as unbounded), in groups of ~150 rows;
    the sizes of the groups deduplicated."""
    real = dedup.SpilledIds
    real_firsts = dedup._firsts
    groups: list[int] = []

    def firsts(rows: np.ndarray, *args: int) -> np.ndarray:
        groups.append(len(rows))
        return real_firsts(rows, *args)

    def spilled(url: str, *args: Any) -> Any:
        seen.append(Path(url).name)
        return real(url, *args)

    monkeypatch.setattr(reading, "in_memory_bytes", lambda lines: 1 << 62)
    monkeypatch.setattr(reading, "SpilledIds", spilled)
    monkeypatch.setattr(dedup, "_firsts", firsts)
    _small_pieces(monkeypatch, group=150, block=500, budget=16 << 20)
    return groups


@pytest.mark.parametrize("unseen", ["keep", "drop"])
def test_staging_within_a_budget_equals_staging_in_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, unseen: str
) -> None:
    files = _graph(tmp_path)
    plain = load_dataset(DataConfig(**files, unseen=unseen))
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    seen: list[str] = []
    groups = _spilling(monkeypatch, seen)
    budgeted = load_dataset(
        DataConfig(**files, unseen=unseen, memory_budget="16MiB", spill_dir=str(spill_dir))
    )
    assert seen == ["train.tsv", "valid.tsv", "test.tsv"]
    assert len(groups) == 27 + 2 + 2 and max(groups) < 220  # 4,000 + 300 + 300 rows
    for k in ("train", "valid", "test"):
        assert torch.equal(getattr(plain, k), getattr(budgeted, k)), k
    assert plain.vocab == budgeted.vocab
    assert plain.reports == budgeted.reports
    assert plain.reports["train"].duplicates > 0 and plain.reports["train"].header
    assert plain.fingerprint == budgeted.fingerprint


def test_an_unseen_label_is_named_with_its_line_when_spilled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files = _graph(tmp_path)
    with open(files["valid"], "a") as f:
        f.write("e1\tr1\te2\ne1\tr1\tnever\n")  # a duplicate before it: the line, not the row
    with pytest.raises(DataError) as plain:
        load_dataset(DataConfig(**files, unseen="error"))
    _spilling(monkeypatch, [])
    with pytest.raises(DataError) as budgeted:
        load_dataset(DataConfig(**files, unseen="error", memory_budget="16MiB"))
    assert str(plain.value) == str(budgeted.value)
    assert "line 302" in str(budgeted.value) and "'never'" in str(budgeted.value)


def test_a_full_spill_folder_is_one_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files = _graph(tmp_path)
    _spilling(monkeypatch, [])
    real = tempfile.TemporaryFile

    class Full:
        def __init__(self, f: Any) -> None:
            self._f = f

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

    made: list[Any] = []

    def temporary(**kw: Any) -> Any:
        made.append(Full(real(**kw)))
        return made[-1]

    monkeypatch.setattr(dedup.tempfile, "TemporaryFile", temporary)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    cfg = DataConfig(**files, memory_budget="16MiB", spill_dir=str(spill_dir))
    with pytest.raises(StorageFull, match=r"point data\.spill_dir at a larger disk") as err:
        load_dataset(cfg)
    assert f"{spill_dir}: no space left to spill the ids of {files['train']}" in str(err.value)
    assert made and all(f.closed for f in made)  # its disk space now, not at garbage collection


def test_a_spill_folder_that_cannot_be_written_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files = _graph(tmp_path)
    _spilling(monkeypatch, [])
    missing = tmp_path / "no-such-folder"
    with pytest.raises(StorageError, match=r"set data\.spill_dir to a writable local folder"):
        load_dataset(DataConfig(**files, memory_budget="16MiB", spill_dir=str(missing)))


def test_spill_files_are_closed_when_a_later_split_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The train split spilled, then valid has an unseen label (unseen: error): the spill files
    of every split are closed as the error leaves staging."""
    files = _graph(tmp_path)
    with open(files["valid"], "a") as f:
        f.write("e1\tr1\tnever\n")
    _spilling(monkeypatch, [])
    closed: list[str] = []
    real_close = dedup.SpilledIds.close

    def close(self: Any) -> None:
        closed.append(Path(self.url).name)
        real_close(self)

    monkeypatch.setattr(dedup.SpilledIds, "close", close)
    with pytest.raises(DataError, match="not in train"):
        load_dataset(DataConfig(**files, unseen="error", memory_budget="16MiB"))
    assert sorted(set(closed)) == ["test.tsv", "train.tsv", "valid.tsv"]


def test_the_line_parser_under_a_budget_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "train.csv"  # a CSV file with a quoted field over two lines
    path.write_text('"a",r,"b\nc"\nb,r,c\n')
    with caplog.at_level("WARNING", logger="kgpipe.data"):
        load_dataset(DataConfig(train=str(path), memory_budget="64MiB"))
    assert "read by the line parser" in caplog.text and str(path) in caplog.text


@pytest.mark.parametrize("spill", [False, True])
def test_mapping_in_many_buffers_equals_one(tmp_path: Path, spill: bool) -> None:
    """Blocks of 4 KiB, each mapped on its own (a 1-byte text budget): the ids of one mapping."""
    from kgpipe.data.columnar import columnar_ids, scan_file, sorted_labels

    rng = np.random.default_rng(3)
    path = tmp_path / "train.tsv"
    n = 20_000
    heads, rels, tails = rng.integers(0, 900, n), rng.integers(0, 7, n), rng.integers(0, 900, n)
    path.write_text(
        "".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in zip(heads, rels, tails, strict=True))
    )
    scan = scan_file(str(path), None, delimiter="\t", header=False, block_size=1 << 16)
    ents, rels_ = sorted_labels(scan.entities), sorted_labels(scan.relations)
    whole = columnar_ids(scan, None, delimiter="\t", block_size=1 << 20, entities=ents,
                         relations=rels_)  # fmt: skip
    ids = dedup.SpilledIds(str(path), n, np.dtype(np.int32), str(tmp_path)) if spill else None
    small = columnar_ids(scan, None, delimiter="\t", block_size=4096, entities=ents,
                         relations=rels_, spill=ids, buffer_bytes=1)  # fmt: skip
    if isinstance(small, dedup.SpilledIds):
        small = np.concatenate([b for _, b in small.blocks(777)])
    assert isinstance(whole, np.ndarray) and np.array_equal(small, whole)
    labels = ents.to_pylist()
    assert [labels[i] for i in whole[:5, 0]] == [f"e{h}" for h in heads[:5]]


def test_a_read_retried_from_the_start_spills_again(tmp_path: Path) -> None:
    """The spill file is emptied when the read starts again (a retried object-store read)."""
    from kgpipe.data.columnar import columnar_ids, scan_file, sorted_labels

    path = tmp_path / "train.tsv"
    path.write_text("a\tr\tb\nb\tr\tc\na\tr\tb\n")
    scan = scan_file(str(path), None, delimiter="\t", header=False, block_size=1 << 16)
    ents, rels = sorted_labels(scan.entities), sorted_labels(scan.relations)
    ids = dedup.SpilledIds(str(path), scan.rows, np.dtype(np.int32), str(tmp_path))
    ids.write(np.full((5, 3), 7, np.int32))  # what a failed first try left
    kwargs: dict[str, Any] = {"delimiter": "\t", "block_size": 1 << 16}
    got = columnar_ids(scan, None, entities=ents, relations=rels, spill=ids, **kwargs)
    assert got is ids and ids.written == 3
    rows = np.concatenate([b for _, b in ids.blocks(2)])
    assert rows.tolist() == [[0, 0, 1], [1, 0, 2], [0, 0, 1]]


def test_the_budget_is_a_size_and_not_part_of_the_hash() -> None:
    with pytest.raises(ValueError, match="not a size"):
        DataConfig(train="t.tsv", memory_budget="lots")
    with pytest.raises(ValueError, match="at least 16MiB"):
        DataConfig(train="t.tsv", memory_budget="1MiB")
    assert DataConfig(train="t.tsv", memory_budget="2GiB").memory_budget_bytes == 2 << 30
    assert DataConfig(train="t.tsv").memory_budget_bytes is None
    plain = RunConfig.model_validate({"data": {"train": "t.tsv"}})
    budgeted = RunConfig.model_validate(
        {"data": {"train": "t.tsv", "memory_budget": "1GiB", "spill_dir": "/scratch"}}
    )
    assert hashed_view(plain) == hashed_view(budgeted)


@pytest.mark.parametrize("spill", [False, True])
def test_a_label_that_was_not_there_at_the_scan_is_a_changed_file(
    tmp_path: Path, spill: bool
) -> None:
    """The labels of a mapped block are looked up among the scan's labels: one that is not
    there (the file was rewritten in between) stops the read."""
    from kgpipe.data.columnar import columnar_ids, scan_file, sorted_labels

    path = tmp_path / "train.tsv"
    path.write_text("a\tr\tb\nb\tr\tc\n")
    scan = scan_file(str(path), None, delimiter="\t", header=False, block_size=1 << 16)
    ents, rels = sorted_labels(scan.entities), sorted_labels(scan.relations)
    path.write_text("a\tr\tb\nb\tr\tz\n")  # the same size, another label
    ids = dedup.SpilledIds(str(path), 2, np.dtype(np.int32), str(tmp_path)) if spill else None
    with pytest.raises(DataError, match="changed while it was being read"):
        columnar_ids(
            scan, None, delimiter="\t", block_size=1 << 16, entities=ents, relations=rels, spill=ids
        )
