"""Parquet files as batches of ``(heads, relations, tails)`` string arrays for the columnar reader
(:mod:`kgpipe.data.columnar`), a batch of rows at a time instead of the whole table as Python
strings (the line parser's :mod:`kgpipe.data.formats.parquet`: ~250 bytes a triple).

The rules are the line parser's: the columns ``data.columns`` names (``head, relation, tail`` by
default), string columns as they are, integer columns as their decimal text; a null, empty or
whitespace-only value is an error naming its row, the first one (a column with a null is
reported by its first null, as there). Columns of other types (floats, bytes, dates, ...) and
compressed files go to the line parser (:class:`~kgpipe.data.io.Fallback`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kgpipe.data.columnar_tsv import Triples
from kgpipe.data.formats.parquet import pick_columns
from kgpipe.data.formats.text import ROLES
from kgpipe.data.io import Fallback, opened
from kgpipe.errors import DataError

__all__ = ["parquet_batches", "parquet_row"]


def _sha256(url: str, storage_options: dict[str, Any] | None) -> str:
    sha = hashlib.sha256()
    with opened(url, storage_options) as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def _identity(f: Any) -> tuple[int, str] | None:
    """The file's size and the SHA-256 of its footer (the schema, the row groups' offsets and
    statistics): what tells a rewritten file from the one already hashed, for a few ranged
    reads instead of a pass over the file. None for a file too short to have one."""
    try:
        size = f.seek(0, 2)
        f.seek(size - 8)
        length = int.from_bytes(f.read(4), "little")
        f.seek(max(0, size - 8 - length))
        footer = f.read(length)
        return size, hashlib.sha256(footer).hexdigest()
    except (OSError, ValueError):
        return None
    finally:
        with contextlib.suppress(OSError, ValueError):
            f.seek(0)


@contextlib.contextmanager
def _table(
    url: str,
    storage_options: dict[str, Any] | None,
    columns: tuple[str | int, str | int, str | int] | None,
    identity: list[tuple[int, str] | None] | None = None,
) -> Iterator[tuple[pq.ParquetFile, list[str]]]:
    with opened(url, storage_options) as f:
        if identity is not None:
            identity.append(_identity(f))
        try:
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
        except (pa.ArrowException, OSError) as err:
            raise DataError(url, f"not a valid Parquet file: {err}") from None
        picked = pick_columns(schema, columns, url)
        for name in picked:
            kind = schema.field(name).type
            if pa.types.is_dictionary(kind):
                kind = kind.value_type
            text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
            if not (text or pa.types.is_integer(kind)):
                raise Fallback(url)  # stringified by Python's rules there
        yield pf, picked


def _labels(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return col.cast(pa.large_string())


@contextlib.contextmanager
def parquet_batches(
    url: str,
    storage_options: dict[str, Any] | None,
    columns: tuple[str | int, str | int, str | int] | None,
    batch_rows: int = 1 << 18,
    memo: dict[str, Any] | None = None,
) -> Iterator[tuple[Iterator[Triples], Callable[[], str]]]:
    """The file's triples ``batch_rows`` rows at a time, and the SHA-256 of the file's bytes,
    read once more when it is first asked for, after the batches. ``memo`` (the same dict for
    each read of one file) keeps it: a later read whose file has the same size and footer
    gets it without that pass (an object store's file is downloaded once less). A file whose
    size or footer changed while it was read is refused."""
    opening: list[tuple[int, str] | None] = []

    def digest() -> str:
        with opened(url, storage_options) as f:
            now = _identity(f)
        if now != opening[0]:
            raise DataError(url, "the file changed while it was being read; stage it again")
        if memo is not None and now is not None and memo.get("identity") == now:
            return str(memo["sha256"])
        sha = _sha256(url, storage_options)
        if memo is not None:
            memo.update(identity=now, sha256=sha)
        return sha

    with _table(url, storage_options, columns, opening) as (pf, picked):
        yield _batches(pf, picked, url, batch_rows), digest


def _batches(pf: pq.ParquetFile, picked: list[str], url: str, batch_rows: int) -> Iterator[Triples]:
    first_null: list[int | None] = [None, None, None]
    first_blank: list[tuple[int, str] | None] = [None, None, None]
    start = 0
    try:
        batches = pf.iter_batches(batch_size=batch_rows, columns=list(dict.fromkeys(picked)))
        for batch in batches:
            triple = []
            for i, name in enumerate(picked):
                col = batch.column(batch.schema.get_field_index(name))
                if col.null_count and first_null[i] is None:
                    first_null[i] = start + pc.index(col.is_null(), True).as_py()
                values = _labels(col)
                if first_blank[i] is None:
                    empty = pc.equal(pc.utf8_length(values), 0)
                    bad = pc.or_(empty, pc.utf8_is_space(values))
                    if pc.any(bad).as_py():
                        at = pc.index(bad, True).as_py()
                        kind = "empty" if empty[at].as_py() else "blank (whitespace-only)"
                        first_blank[i] = (start + at, kind)
                triple.append(values)
            start += batch.num_rows
            if any(x is not None for x in (*first_null, *first_blank)):
                continue  # read on for the error: a column's first null comes first
            yield triple[0], triple[1], triple[2]
    except (pa.ArrowException, OSError) as err:
        raise DataError(url, f"cannot read Parquet data: {err}") from None
    problems: list[tuple[int, str]] = []
    for role, name, null, blank in zip(ROLES, picked, first_null, first_blank, strict=True):
        if null is not None:
            problems.append((null, f"null {role} value in column {name!r}"))
        elif blank is not None:
            problems.append((blank[0], f"{blank[1]} {role} value in column {name!r}"))
    if problems:
        row, problem = min(problems, key=lambda p: p[0])  # the first role on a tie
        raise DataError(url, f"{problem} (row {row})", line=row + 1)


def parquet_row(
    url: str,
    storage_options: dict[str, Any] | None,
    columns: tuple[str | int, str | int, str | int] | None,
    row: int,
) -> tuple[int | None, str | None]:
    """The row number (1-based) and the tab-joined labels of triple ``row`` (0-based), for an
    error message."""
    with _table(url, storage_options, columns) as (pf, picked):
        meta = pf.metadata
        start = 0
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            if row < start + rows:
                table = pf.read_row_group(group, columns=list(dict.fromkeys(picked)))
                labels = [_labels(table.column(name))[row - start].as_py() for name in picked]
                return row + 1, "\t".join(labels)
            start += rows
    return None, None
