"""Per-query candidate files (``data.candidates``): each valid/test query's candidates, read
from the graph's own files and mapped to entity ids.

The Open Graph Benchmark ranks each answer of ogbl-wikikg2 and ogbl-biokg against the fixed
candidates of its triple (``head_neg``/``tail_neg``: ``(triples, k)`` arrays). A candidate file
holds one row per data line of its split's triples file, in the same order, each with the same
number ``k`` of entity labels:

- text (``.tsv``, ``.txt``, any other name; optionally compressed): ``k`` tab-separated labels a
  line, read as blocks by pyarrow; no header, no comments, no blank lines (each line is a row);
- ``.npy``: an integer array ``(lines, k)`` whose values are labels written as decimal numbers
  (OGB's own arrays, for a graph whose entity labels are OGB's entity numbers).

Staging keeps the rows of the triples it keeps (a duplicate triple's first occurrence; not the
unseen triples ``data.unseen: drop`` drops), so that row ``i`` of the staged array belongs to
triple ``i`` of the staged split. A label that is not an entity of the graph, a row of another
length and a file of another number of rows are errors naming the file and the line.

Every row is checked, the rows of dropped triples too. Text labels are mapped a buffer of at
least four times as many labels as there are entities at a time (a call hashes every entity
label), column after column, with one ``index_in``; the numbers of a ``.npy`` array go through a
lookup table where every entity label is a number in its own decimal form (OGB's graphs), and
by their text otherwise. Memory: the ids (``int32`` where they fit) of the rows kept, one buffer
and the entity labels (and, for ``.npy``, the number lookup; the array itself is memory-mapped,
from a temporary file when it lives on an object store).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from kgpipe.data.columnar import retried_read
from kgpipe.data.dedup import ids_dtype
from kgpipe.data.io import opened
from kgpipe.data.labels import Labels
from kgpipe.errors import DataError
from kgpipe.retry import RetryPolicy

__all__ = ["SIDES", "SplitCandidates", "entity_array", "read_candidates"]

SIDES = ("head", "tail")
_BLOCK = 1 << 23


@dataclass(frozen=True, eq=False)
class SplitCandidates:
    """A split's candidates: ``(triples, k)`` ids per side, and what was read."""

    head: np.ndarray
    tail: np.ndarray
    #: per side: ``{"source", "sha256", "rows", "k"}`` (``rows``: as read, before dropping)
    sources: dict[str, dict[str, Any]]

    @property
    def k(self) -> int:
        return int(self.head.shape[1])


def entity_array(labels: Sequence[str]) -> pa.Array:
    """The labels as one Arrow ``large_string`` array (the columnar reader's, not copied)."""
    array = labels.array if isinstance(labels, Labels) else pa.array(list(labels), pa.string())
    return array if array.type == pa.large_string() else array.cast(pa.large_string())


class _Sha:
    """A binary reader that hands on ``head`` (bytes already read from ``f``), then the rest of
    ``f``, and hashes what it hands on."""

    def __init__(self, f: IO[bytes], head: bytes = b"") -> None:
        self._f, self._head, self.sha, self.closed = f, head, hashlib.sha256(), False

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            data = self._f.read(n)
        elif 0 <= n < len(self._head):
            data, self._head = self._head[:n], self._head[n:]
        else:
            data = self._head + self._f.read(n if n < 0 else n - len(self._head))
            self._head = b""
        self.sha.update(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def read_candidates(
    files: dict[str, str],
    storage_options: dict[str, Any] | None,
    *,
    entities: pa.Array,
    lines: int,
    kept: np.ndarray,
    triples_source: str,
    retry: RetryPolicy | None = None,
) -> SplitCandidates:
    """The candidates of the split whose triples file (``triples_source``) has ``lines`` data
    lines, of which staging kept the rows ``kept`` (positions, in order): ``files`` maps each
    side to a URL; ids are positions in ``entities``. Reads from an object store are retried
    from the start by ``retry``, as the triples' are."""
    arrays: dict[str, np.ndarray] = {}
    sources: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        url = files[side]
        read = _npy if url.endswith(".npy") else _text
        ids, rows, digest = retried_read(
            url,
            storage_options,
            retry,
            functools.partial(read, url, storage_options, entities, kept),
        )
        if rows != lines:
            raise DataError(
                url,
                f"{rows} rows of candidates, and {triples_source} has {lines} triples: "
                "a candidate file needs one row per triple, in the same order",
            )
        arrays[side] = ids
        sources[side] = {"source": url, "sha256": digest, "rows": rows, "k": int(ids.shape[1])}
    if arrays["head"].shape[1] != arrays["tail"].shape[1]:
        raise DataError(
            files["tail"],
            f"{arrays['tail'].shape[1]} candidates a row, and the head file "
            f"{files['head']} has {arrays['head'].shape[1]}: both sides need the same number",
        )
    return SplitCandidates(arrays["head"], arrays["tail"], sources)


class _Mapper:
    """Maps buffered rows of labels to ids (every row checked) and keeps the rows in ``kept``."""

    def __init__(self, url: str, entities: pa.Array, kept: np.ndarray, k: int) -> None:
        self.url, self.entities, self.kept, self.k = url, entities, kept, k
        self.out = np.empty((len(kept), k), dtype=ids_dtype(len(entities), 0))
        self.rows = 0  # rows read
        self.filled = 0  # rows of out written
        self.pending: list[list[pa.Array]] = []  # per block: its k columns
        self.buffered = 0
        # a call hashes every entity label: map several times as many labels at once
        self.at_once = max(4 * len(entities), 1 << 23)
        self.where = "line"  # what a row is called in errors (an array's: "row")

    def add(self, columns: list[pa.Array]) -> None:
        """The next rows, as ``k`` columns of labels."""
        self.pending.append(columns)
        self.buffered += len(columns[0]) * self.k
        if self.buffered >= self.at_once:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        n = sum(len(cols[0]) for cols in self.pending)
        # column after column: the ids come back (k, n), and their transpose is the rows
        values = pa.chunked_array([cols[j] for j in range(self.k) for cols in self.pending])
        self.pending, self.buffered = [], 0
        found = pc.index_in(values, value_set=self.entities)
        if found.null_count:
            self._unknown(values, found, n)
        ids = found.to_numpy().reshape(self.k, n)
        self.place(ids.T)

    def place(self, ids: np.ndarray) -> None:
        """Keep the rows of ``ids`` ``(n, k)`` (the next ``n`` rows read) that staging kept."""
        n = len(ids)
        lo, hi = np.searchsorted(self.kept, [self.rows, self.rows + n])
        take = self.kept[lo:hi] - self.rows
        self.out[self.filled : self.filled + len(take)] = ids[take]
        self.filled += len(take)
        self.rows += n

    def _unknown(self, values: pa.ChunkedArray, found: pa.ChunkedArray, n: int) -> None:
        first = int(pc.index(found.is_null(), True).as_py())
        col, row = divmod(first, n)
        self.fail(self.rows + row + 1, col, values[first].as_py())

    def fail(self, line: int, col: int, label: str) -> None:
        at = f"{self.where} {line}, candidate {col + 1}"
        if not label:
            raise DataError(self.url, f"{at}: empty (a blank line?)")
        raise DataError(self.url, f"{at}: {label!r} is not an entity of the graph")


def _text(
    url: str, storage_options: dict[str, Any] | None, entities: pa.Array, kept: np.ndarray
) -> tuple[np.ndarray, int, str]:
    with opened(url, storage_options) as raw:  # opened once: the first line tells k
        head = raw.readline()
        first = head.decode("utf-8", errors="replace").rstrip("\r\n")
        if not first:
            raise DataError(url, "line 1: blank (each line is a triple's row)")
        k = first.count("\t") + 1
        mapper = _Mapper(url, entities, kept, k)
        f = _Sha(raw, head)
        try:
            for batch in _batches(f, k):
                if batch.num_rows:
                    mapper.add([batch.column(i) for i in range(k)])
        except pa.ArrowInvalid:
            _locate(url, storage_options)
            raise DataError(url, "cannot be read as tab-separated labels") from None
        mapper.flush()
        return mapper.out, mapper.rows, f.sha.hexdigest()


def _batches(f: _Sha, k: int) -> Iterator[pa.RecordBatch]:
    names = [f"c{i}" for i in range(k)]
    yield from pcsv.open_csv(
        f,
        read_options=pcsv.ReadOptions(column_names=names, block_size=_BLOCK),
        parse_options=pcsv.ParseOptions(
            delimiter="\t",
            quote_char=False,
            double_quote=False,
            escape_char=False,
            ignore_empty_lines=False,
        ),
        convert_options=pcsv.ConvertOptions(
            column_types={n: pa.large_string() for n in names}, strings_can_be_null=False
        ),
    )


def _locate(url: str, storage_options: dict[str, Any] | None) -> None:
    """Raise the first line that is not UTF-8, or not a row of as many labels as the first."""
    with opened(url, storage_options) as raw:
        k = None
        for number, data in enumerate(raw, 1):
            try:
                line = data.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise DataError(
                    url, f"line {number}: not UTF-8 (byte {err.start + 1} of the line)"
                ) from None
            fields = line.split("\t")
            k = len(fields) if k is None else k
            if not line:
                raise DataError(url, f"line {number}: blank (each line is a triple's row)")
            if len(fields) != k:
                raise DataError(
                    url, f"line {number}: {len(fields)} labels, and the first line has {k}"
                )


def _npy(
    url: str, storage_options: dict[str, Any] | None, entities: pa.Array, kept: np.ndarray
) -> tuple[np.ndarray, int, str]:
    """A ``.npy`` file's rows, memory-mapped and hashed a block at a time (one on an object store
    is first downloaded, a block at a time, to a temporary file), so that memory holds only the
    kept rows' ids, never the file."""
    local = url.removeprefix("file://") if "://" not in url or url.startswith("file://") else None
    sha = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        if local is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="kgpipe-cand-"))
            local = os.path.join(folder, "candidates.npy")
            with opened(url, storage_options) as raw, open(local, "wb") as out:
                for chunk in iter(lambda: raw.read(_BLOCK), b""):
                    sha.update(chunk)
                    out.write(chunk)
        else:
            with open(local, "rb") as f:
                for chunk in iter(lambda: f.read(_BLOCK), b""):
                    sha.update(chunk)
        try:
            array = np.load(local, mmap_mode="r", allow_pickle=False)
        except ValueError as err:
            raise DataError(url, f"not a .npy array: {err}") from None
        return (*_npy_rows(url, array, entities, kept), sha.hexdigest())


def _npy_rows(url: str, array: Any, entities: pa.Array, kept: np.ndarray) -> tuple[np.ndarray, int]:
    if not isinstance(array, np.ndarray):  # np.load opens an .npz archive too
        raise DataError(url, "not a .npy array (an .npz archive? save each array with np.save)")
    if array.ndim != 2 or array.dtype.kind not in "iu" or array.shape[1] == 0:
        raise DataError(
            url, f"a {array.dtype} array of shape {array.shape}: need integers (triples, k >= 1)"
        )
    mapper = _Mapper(url, entities, kept, int(array.shape[1]))
    mapper.where = "row"
    lookup = _number_lookup(entities)
    step = max(1, mapper.at_once // max(1, mapper.k))
    for lo in range(0, len(array), step):
        block = np.asarray(array[lo : lo + step])
        if lookup is None:  # labels that are not all numbers: by their text
            mapper.add([pa.array(block[:, j]).cast(pa.large_string()) for j in range(mapper.k)])
            continue
        inside = (block >= 0) & (block < len(lookup))
        ids = lookup[np.where(inside, block, 0)]
        bad = ~inside | (ids < 0)
        if bad.any():
            row, col = (int(x[0]) for x in np.nonzero(bad))
            mapper.fail(lo + row + 1, col, str(block[row, col]))
        mapper.place(ids)
    mapper.flush()
    return mapper.out, int(array.shape[0])


def _number_lookup(entities: pa.Array) -> np.ndarray | None:
    """``lookup[number]``: the id of the entity whose label is that number written in decimal
    (-1: none), where every label is one (OGB's graphs) and the largest is not far above their
    count; else None."""
    try:
        numbers = pc.cast(entities, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if len(numbers) == 0 or numbers.null_count:
        return None
    if not pc.all(pc.equal(pc.cast(numbers, pa.large_string()), entities)).as_py():
        return None  # "007", "+7": labels that are not a number's own decimal form
    values = numbers.to_numpy()
    if int(values.min()) < 0 or int(values.max()) > 4 * len(values) + (1 << 20):
        return None
    lookup = np.full(int(values.max()) + 1, -1, dtype=ids_dtype(len(values), 0))
    lookup[values] = np.arange(len(values), dtype=lookup.dtype)
    return lookup
