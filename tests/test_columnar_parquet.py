"""Parquet files through the columnar reader give exactly what the line parser gives (which held
the whole table as Python strings): the same ids, reports and fingerprint, or the same error
with the same row (kgpipe.data.columnar_parquet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_columnar import _load, compare

import kgpipe.data.reading as reading
from kgpipe.config import DataConfig
from kgpipe.errors import DataError

HEADS = ["a", "b", "c", "a", "é", "😀", "New York"]
RELATIONS = ["r1", "r2", "r1", "r2", "r", "r", "located in"]
TAILS = ["b", "c", "a", "c", "Z", "a", "United States"]


def _table(**columns: Any) -> pa.Table:
    return pa.table(columns or {"head": HEADS, "relation": RELATIONS, "tail": TAILS})


CASES: dict[str, dict[str, pa.Table]] = {
    "plain": {"train": _table()},
    "duplicates": {"train": pa.concat_tables([_table(), _table()])},
    "valid and test, unseen kept": {
        "train": _table(),
        "valid": _table(head=["a", "d"], relation=["r1", "r1"], tail=["c", "a"]),
        "test": _table(head=["a", "c"], relation=["r3", "r2"], tail=["b", "e"]),
    },
    "integer ids": {
        "train": _table(
            head=pa.array([1, 2, 3, -4], pa.int64()),
            relation=pa.array([7, 7, 8, 8], pa.int32()),
            tail=pa.array([2, 3, 1, 1], pa.int64()),
        ),
    },
    "dictionary-encoded": {
        "train": _table(
            head=pa.array(HEADS).dictionary_encode(),
            relation=RELATIONS,
            tail=pa.array(TAILS).dictionary_encode(),
        ),
    },
    "large strings and extra columns": {
        "train": _table(
            head=pa.array(HEADS, pa.large_string()),
            relation=RELATIONS,
            tail=TAILS,
            weight=[1.0] * len(HEADS),
        ),
    },
    "a null tail": {"train": _table(head=HEADS, relation=RELATIONS, tail=[*TAILS[:-1], None])},
    "an empty relation": {
        "train": _table(head=HEADS, relation=["r", "", *RELATIONS[2:]], tail=TAILS)
    },
    "a blank head before a null tail": {
        "train": _table(
            head=["a", " \t", *HEADS[2:]], relation=RELATIONS, tail=[*TAILS[:4], None, *TAILS[5:]]
        ),
    },
    "a null head after an empty one": {  # a column with a null is reported by its null
        "train": _table(head=["", "b", "c", None, *HEADS[4:]], relation=RELATIONS, tail=TAILS),
    },
    "no-break and ideographic spaces": {
        "train": _table(
            head=["a", "\u00a0", *HEADS[2:]],
            relation=RELATIONS,
            tail=["b", "c", "\u3000", *TAILS[3:]],
        ),
    },
    "other names": {"train": _table(src=HEADS, rel=RELATIONS, dst=TAILS)},
    "no rows": {
        "train": _table(
            head=pa.array([], pa.string()),
            relation=pa.array([], pa.string()),
            tail=pa.array([], pa.string()),
        )
    },
}


def _write(tmp_path: Path, files: dict[str, pa.Table], row_group_size: int) -> dict[str, str]:
    urls = {}
    for split, table in files.items():
        path = tmp_path / f"{split}.parquet"
        pq.write_table(table, path, row_group_size=row_group_size)
        urls[split] = str(path)
    return urls


def _both(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, pa.Table],
    *,
    row_group_size: int = 1 << 20,
    **cfg: Any,
) -> tuple[Any, list[str]]:
    return compare(DataConfig(**_write(tmp_path, files, row_group_size), **cfg), monkeypatch)


@pytest.mark.parametrize("row_group_size", [2, 1 << 20])
@pytest.mark.parametrize("case", sorted(CASES))
def test_parquet_columnar_equals_line_parser(
    case: str, row_group_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    columns = ("src", "rel", "dst") if case == "other names" else None
    out, seen = _both(
        tmp_path, monkeypatch, CASES[case], row_group_size=row_group_size, columns=columns
    )
    if not isinstance(out, str):
        assert seen == ["columnar"]


def test_parquet_in_small_batches_and_columns_by_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many batches of a few rows (the batch size follows data.block_size) across row
    groups, columns picked by index and in another order."""
    n = 50_000
    table = pa.table({"t": [f"e{(i * 7) % 1009}" for i in range(n)],
                      "h": [f"e{i % 997}" for i in range(n)],
                      "r": [f"r{i % 13}" for i in range(n)]})  # fmt: skip
    monkeypatch.setattr(reading, "_parquet_reader", _small_batches(reading._parquet_reader))
    out, seen = _both(
        tmp_path,
        monkeypatch,
        {"train": table, "valid": _table(head=["e1"], relation=["r1"], tail=["e2"])},
        row_group_size=7_000,
        columns=(1, 2, 0),
    )
    assert seen == ["columnar"]
    assert out.train.shape[0] == len(
        set(zip(*(table.column(c).to_pylist() for c in "hrt"), strict=True))
    )


def _small_batches(real: Any) -> Any:
    def reader(src: Any, cfg: Any) -> Any:
        if real(src, cfg) is None:
            return None
        from kgpipe.data.columnar_parquet import parquet_batches

        return lambda _c: parquet_batches(src.url, src.storage_options, cfg.columns, 999)

    return reader


@pytest.mark.parametrize("unseen", ["keep", "drop", "error"])
def test_parquet_unseen_and_its_row(
    unseen: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = _table(head=["a", "c", "q"], relation=["r1", "r2", "r9"], tail=["c", "q", "a"])
    out, seen = _both(tmp_path, monkeypatch, {"train": _table(), "test": test}, unseen=unseen,
                      row_group_size=2)  # fmt: skip
    assert seen == ["columnar"]
    if unseen == "error":
        assert "line 2" in out and "'q'" in out


def test_other_column_types_and_compressed_parquet_use_the_line_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes and dates are labelled by Python's rules, in the line parser; a compressed file
    cannot be read a row group at a time."""
    import datetime
    import gzip

    days = [datetime.date(2026, 1, 2), datetime.date(2026, 1, 3)]
    dated = _table(head=days, relation=[b"r", b"\xff"], tail=list(reversed(days)))
    out, seen = _both(tmp_path, monkeypatch, {"train": dated})
    assert seen == [] and not isinstance(out, str)
    assert list(out.vocab.entities) == ["2026-01-02", "2026-01-03"]
    assert list(out.vocab.relations) == ["ff", "r"]
    pq.write_table(_table(), tmp_path / "plain.parquet")
    (tmp_path / "train.parquet.gz").write_bytes(
        gzip.compress((tmp_path / "plain.parquet").read_bytes())
    )
    config = DataConfig(train=str(tmp_path / "train.parquet.gz"))
    fast, seen = _load(config, True, monkeypatch)
    assert seen == [] and list(fast.vocab.relations) == sorted(set(RELATIONS))


NOT_LABELS = {
    "a float column": (
        _table(head=[12.0, 13.5], relation=["r", "r"], tail=pa.array([12, 13], pa.int64())),
        "head column 'head' holds double values: labels are text or integers",
    ),
    "a list column": (
        _table(head=["a", "b"], relation=["r", "r"], tail=[["e0"], ["e1"]]),
        "tail column 'tail' holds list<element: string> values, not labels",
    ),
    "a struct column": (
        _table(head=["a", "b"], relation=[{"a": "x"}, {"a": "y"}], tail=["c", "d"]),
        "relation column 'relation' holds struct<a: string> values, not labels",
    ),
    "a column named twice": (
        pa.Table.from_arrays(
            [pa.array(x) for x in (["a"], ["r"], ["b"], ["c"])],
            names=["head", "relation", "tail", "tail"],
        ),
        "tail column 'tail' appears 2 times in the file (give its columns distinct names)",
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_LABELS))
def test_columns_that_hold_no_labels_are_refused(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float, list or struct column was made into labels (`12.0` beside the integer `12`,
    `nan`, `['e0']`); a column named twice gave a KeyError. Both readers refuse them alike."""
    table, problem = NOT_LABELS[case]
    out, _ = _both(tmp_path, monkeypatch, {"train": table})
    assert isinstance(out, str) and problem in out, out


def test_a_file_that_is_not_parquet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.parquet"
    path.write_bytes(b"head\trelation\ttail\na\tr\tb\n")
    config = DataConfig(train=str(path))
    fast, _ = _load(config, True, monkeypatch)
    slow, _ = _load(config, False, monkeypatch)
    assert isinstance(fast, str) and "not a valid Parquet file" in fast
    assert fast.split(":")[0] == slow.split(":")[0]


def test_a_file_is_hashed_once_and_a_change_while_it_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan and the mapping each read the file; hashing it after both read it twice more
    (two more downloads from an object store). It is hashed once, and the mapping compares its
    size and footer. A file rewritten during a read is refused."""
    import kgpipe.data.columnar_parquet as cp

    calls: list[str] = []
    real = cp._sha256
    monkeypatch.setattr(cp, "_sha256", lambda url, so: calls.append(url) or real(url, so))
    urls = _write(tmp_path, {"train": _table(), "test": _table()}, 2)
    from kgpipe.data.dataset import load_dataset

    data = load_dataset(DataConfig(**urls))
    assert sorted(calls) == sorted(urls.values()) and data.train.shape[0] == len(HEADS)
    with cp.parquet_batches(urls["train"], None, None, memo={}) as (batches, digest):
        list(batches)
        pq.write_table(_table(head=HEADS, relation=RELATIONS, tail=list(reversed(TAILS))),
                       urls["train"])  # fmt: skip
        with pytest.raises(DataError, match="the file changed while it was being read"):
            digest()
