"""Columnar staging of triples with pyarrow, for graphs of any size.

The line parser holds the file's text and a Python string per field: ~250 bytes per triple,
25 GB for 100M edges. This reader streams blocks of triples -- of ``data.block_size`` bytes of a
tab-separated or unquoted CSV file through pyarrow's CSV reader
(:mod:`~kgpipe.data.columnar_tsv`), batches of a Parquet file's rows
(:mod:`~kgpipe.data.columnar_parquet`) or of an N-Triples file's statements
(:mod:`~kgpipe.data.columnar_nt`) -- and holds, beyond a block, the distinct labels and the
ids:

1. **Scan** each file once: its rows, distinct entity and relation labels (merged as they
   grow), the SHA-256 of its bytes and its first row (for ``data.header: auto``).
2. **Ids** as :class:`~kgpipe.data.vocab.Vocabulary` assigns them: train labels sorted, then
   the others, sorted (pyarrow by UTF-8 bytes: Python's code point order, the same ids).
3. **Map** each file again into an array per split sized by the scan (or a spill file,
   :mod:`kgpipe.data.dedup`): a buffer of blocks is dictionary-encoded, and its
   distinct labels are found among the sorted labels by probing every label against a hash of
   the buffer's distinct labels (``index_in`` would hash all labels per call: ~0.8 GB for
   11.6M). A call costs O(labels), so blocks are buffered up to as many rows as there are
   labels (at least 1M), or, under a memory budget, a quarter of it in text.

For tab-separated (and unquoted CSV) files the rules are the line parser's: ``#`` lines (counted where they hold
three fields, for a warning), empty and whitespace-only lines are skipped, a leading BOM is
dropped, CRLF and LF end lines, fields are taken as they are. A line it would not take as the
line parser does (a wrong field count, a wrong label, invalid UTF-8, a lone carriage return)
stops it: :func:`kgpipe.data.line_scan.locate_problem` reads the file once more, a line at a
time, and raises the line parser's error with its line (a block holds whole lines: a line
longer than ``data.block_size`` makes its block longer). Files that change between reads are refused. Compressed files are
decompressed as they are read (:func:`kgpipe.data.io.opened`). Parquet's and N-Triples'
rules: :mod:`~kgpipe.data.columnar_parquet`, :mod:`~kgpipe.data.columnar_nt`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.core import url_to_fs

from kgpipe.data.columnar_tsv import Triples, tsv_batches
from kgpipe.data.dedup import SpilledIds, ids_dtype
from kgpipe.data.formats.header import HEADER_NAMES, is_column_name, normalize
from kgpipe.data.io import reading_errors
from kgpipe.endpoints import check_reachable
from kgpipe.errors import DataError
from kgpipe.retry import RetryPolicy, retrying

__all__ = [
    "BatchReader",
    "FileScan",
    "columnar_ids",
    "retried_read",
    "scan_file",
    "sorted_labels",
]

#: ``read(comments)``: a context holding a file's triples a block at a time, in file order, and a
#: function giving the SHA-256 of its bytes once the blocks are read (``comments``: see
#: :func:`~kgpipe.data.columnar_tsv.tsv_batches`); :class:`~kgpipe.data.io.Fallback` for a file
#: the line parser must read
BatchReader = Callable[
    [list[int] | None], AbstractContextManager[tuple[Iterator[Triples], Callable[[], str]]]
]


def _reader(
    url: str,
    storage_options: dict[str, Any] | None,
    read: BatchReader | None,
    delimiter: str,
    block_size: int,
) -> BatchReader:
    if read is not None:
        return read
    return lambda comments: tsv_batches(url, storage_options, delimiter, block_size, comments)


@dataclass(frozen=True)
class FileScan:
    """One file's first read: what the ids and the report need."""

    url: str
    rows: int  # triples, duplicates included, the header row excluded
    entities: pa.Array  # distinct entity labels (no order)
    relations: pa.Array
    sha256: str
    header: bool
    comment_triples: int = 0  # comment lines of three non-blank fields


def _remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def retried_read(
    url: str,
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy | None,
    fn: Callable[[], Any],
) -> Any:
    """``fn()``, retried like :func:`kgpipe.storage.read_url` for files on an object store, its
    faults as :class:`DataError`."""
    with reading_errors(url):
        if not _remote(url):
            return fn()
        fs, _ = url_to_fs(url, **(storage_options or {}))
        check_reachable(fs, url)
        return retrying(fn, what=f"read {url}", policy=retry or RetryPolicy())


def _merged(parts: list[pa.Array]) -> pa.Array:
    out = pc.unique(pa.chunked_array(parts, type=pa.large_string()))
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


class _Distinct:
    """Distinct labels over blocks: merged when the pending blocks outgrow the merged set."""

    def __init__(self) -> None:
        self.done: pa.Array = pa.array([], pa.large_string())
        self.pending: list[pa.Array] = []
        self.size = 0

    def add(self, values: pa.Array) -> None:
        self.pending.append(pc.unique(values))
        self.size += len(self.pending[-1])
        if self.size > max(len(self.done), 1 << 16):
            self.done, self.pending, self.size = _merged([self.done, *self.pending]), [], 0

    def result(self) -> pa.Array:
        return _merged([self.done, *self.pending])


def _first_is_header(
    first: tuple[str, str, str], counts: dict[str, int], rows: int, relations: int, train: Any
) -> bool:
    """:func:`kgpipe.data.formats.header.detect_header` from counts (``train``: its FileScan)."""
    if len(set(first)) < 3 or not all(map(is_column_name, first)):
        return False
    if all(normalize(x) in HEADER_NAMES for x in first):
        return True
    if rows < 3:
        return False
    if counts["r"] > 1 or counts["hh"] > 1 or counts["ht"] or counts["th"] or counts["tt"] > 1:
        return False
    if train is None:
        return rows - 1 >= 2 * (relations - 1)
    h, r, t = first
    if pc.any(pc.is_in(pa.array([h, t], pa.large_string()), value_set=train.entities)).as_py():
        return False
    if pc.any(pc.is_in(pa.array([r], pa.large_string()), value_set=train.relations)).as_py():
        return False
    return train.rows >= 2 * len(train.relations)


def scan_file(
    url: str,
    storage_options: dict[str, Any] | None,
    *,
    delimiter: str = "\t",
    header: bool | str,
    block_size: int = 1 << 23,
    train: FileScan | None = None,
    retry: RetryPolicy | None = None,
    read: BatchReader | None = None,
) -> FileScan:
    """The first read of a file (``header``: True, False or ``"auto"``; ``train``: the train
    file's scan when this is valid/test), tab-separated (``delimiter``, ``block_size``) unless
    ``read`` gives its blocks (a CSV, Parquet or N-Triples file's). Raises :class:`~kgpipe.data.io.Fallback` on a line to hand to
    :func:`~kgpipe.data.line_scan.locate_problem`."""
    blocks = _reader(url, storage_options, read, delimiter, block_size)

    def scan() -> FileScan:
        ents, rels = _Distinct(), _Distinct()
        rows = 0
        first: tuple[str, str, str] | None = None
        skip = header is True
        counts = {"hh": 0, "ht": 0, "th": 0, "tt": 0, "r": 0}
        comments = [0]
        with blocks(comments) as (batches, digest):
            for h, r, t in batches:
                if first is None and len(h):
                    first = (h[0].as_py(), r[0].as_py(), t[0].as_py())
                    names = all(normalize(x) in HEADER_NAMES for x in first)
                    like = len(set(first)) == 3 and all(map(is_column_name, first))
                    if skip or (header == "auto" and names and like):
                        skip = True  # a header row: its labels are not the graph's
                        h, r, t = h[1:], r[1:], t[1:]
                if header == "auto" and not skip and first is not None:
                    fh, fr, ft = (pa.scalar(x) for x in first)
                    for key, col, x in (("hh", h, fh), ("ht", t, fh), ("th", h, ft)):
                        counts[key] += pc.sum(pc.equal(col, x)).as_py() or 0
                    counts["tt"] += pc.sum(pc.equal(t, ft)).as_py() or 0
                    counts["r"] += pc.sum(pc.equal(r, fr)).as_py() or 0
                rows += len(h)
                ents.add(pa.concat_arrays([h, t]))
                rels.add(r)
            sha = digest()
        entities, relations = ents.result(), rels.result()
        is_header = skip and first is not None  # an empty file has no header row
        if not skip and header == "auto" and first is not None:
            is_header = _first_is_header(first, counts, rows, len(relations), train)
            if is_header:  # its labels occur nowhere else in the file
                rows -= 1
                heads_tails = pa.array([first[0], first[2]], pa.large_string())
                entities = pc.filter(entities, pc.invert(pc.is_in(entities, heads_tails)))
                relations = pc.filter(relations, pc.not_equal(relations, first[1]))
        if is_header and rows == 0:
            raise DataError(url, "no triples found (the file has only a header row)")
        if rows == 0:
            raise DataError(url, "no triples found (empty file)")
        return FileScan(url, rows, entities, relations, sha, is_header, comments[0])

    result: FileScan = retried_read(url, storage_options, retry, scan)
    return result


def sorted_labels(values: pa.Array) -> pa.Array:
    """``values`` in code point order (pyarrow compares UTF-8 bytes: the same order)."""
    return pc.take(values, pc.array_sort_indices(values))


def columnar_ids(
    scan: FileScan,
    storage_options: dict[str, Any] | None,
    *,
    delimiter: str = "\t",
    block_size: int = 1 << 23,
    entities: pa.Array,
    relations: pa.Array,
    retry: RetryPolicy | None = None,
    spill: SpilledIds | None = None,
    buffer_bytes: int | None = None,
    read: BatchReader | None = None,
) -> np.ndarray | SpilledIds:
    """The file's triples as ``[rows, 3]`` ids (positions in ``entities``/``relations``), in
    file order, duplicates included: ``int32`` where both label counts fit it (half the memory
    of ``int64``, which the ids are widened to once duplicates are gone), else ``int64``.

    With ``spill`` (of :func:`~kgpipe.data.dedup.ids_dtype`) the ids are appended to it as they are
    mapped, and it is returned instead of an array; ``buffer_bytes`` bounds the text buffered
    between two mappings (a memory budget's share). ``read``: as for :func:`scan_file`."""
    url = scan.url
    blocks = _reader(url, storage_options, read, delimiter, block_size)

    # a call probes every label: map at least that many rows per call (blocks are buffered up
    # to it), so the mapping costs O(rows), not O(rows x labels / block)
    at_once = max(len(entities), 1 << 20)
    text_limit = buffer_bytes if buffer_bytes is not None else 1 << 62

    def ids() -> np.ndarray | SpilledIds:
        dtype = ids_dtype(len(entities), len(relations))
        out = np.empty((0 if spill else scan.rows, 3), dtype=dtype)
        if spill is not None:
            spill.reset()
        pos = 0
        skip = scan.header
        pending: list[tuple[pa.Array, pa.Array, pa.Array]] = []
        buffered = text = 0

        def flush() -> bool:
            nonlocal pos, buffered, text
            if not pending:
                return True
            h, r, t = (pa.concat_arrays(list(cols)) for cols in zip(*pending, strict=True))
            pending.clear()
            k, buffered, text = len(h), 0, 0
            if pos + k > scan.rows:
                return False
            both_np = _positions(pa.concat_arrays([h, t]), entities)
            rel = pc.index_in(r, value_set=relations)
            if both_np is None or rel.null_count:
                return False
            del h, r, t
            block = np.empty((k, 3), dtype=dtype) if spill is not None else out[pos : pos + k]
            block[:, 0] = both_np[:k]
            block[:, 2] = both_np[k:]
            block[:, 1] = rel.to_numpy(zero_copy_only=False)
            if spill is not None:
                spill.write(block)
            pos += k
            return True

        with blocks(None) as (batches, digest):
            for h, r, t in batches:
                if skip and len(h):
                    h, r, t, skip = h[1:], r[1:], t[1:], False
                pending.append((h, r, t))
                buffered += len(h)
                text += h.nbytes + r.nbytes + t.nbytes
                if (buffered >= at_once or text >= text_limit) and not flush():
                    break
            else:
                if flush() and pos == scan.rows and digest() == scan.sha256:
                    return spill if spill is not None else out
        raise DataError(url, "the file changed while it was being read; stage it again")

    result: np.ndarray | SpilledIds = retried_read(url, storage_options, retry, ids)
    return result


def _positions(values: pa.Array, labels: pa.Array) -> np.ndarray | None:
    """The position of each of ``values`` in ``labels`` (distinct), or None if one is not
    there. The hash is of the distinct ``values``; every label is looked up in it."""
    encoded = values.dictionary_encode()
    found = pc.index_in(labels, value_set=encoded.dictionary)  # each label's place, or null
    hit = found.is_valid()
    where = pc.filter(found, hit).to_numpy()
    if len(where) != len(encoded.dictionary):
        return None
    dtype = ids_dtype(len(labels), 0)
    position = np.empty(len(where), dtype=dtype)
    position[where] = pc.indices_nonzero(hit).to_numpy()
    del found, hit, where
    out: np.ndarray = position[encoded.indices.to_numpy(zero_copy_only=False)]
    return out
