"""N-Triples files as batches of ``(heads, relations, tails)`` string arrays for the columnar
reader (:mod:`kgpipe.data.columnar`): a batch of statements at a time instead of the whole file
and a Python string per term (the line parser's :mod:`kgpipe.data.formats.ntriples`, ~250 bytes
a statement: RDF dumps of hundreds of millions of statements did not fit).

Each line is read by the line parser's own :func:`~kgpipe.data.formats.ntriples.statement`, so
the labels and errors are the line parser's; only what is held differs. The line parser decodes
a whole file before it parses a statement, so a malformed statement is reported only once the
rest of the file is known to be UTF-8 (else the first invalid byte is). A file whose statements
all have literal objects that are dropped goes to the line parser
(:class:`~kgpipe.data.io.Fallback`), which says so for train and keeps the empty split else.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

import pyarrow as pa

from kgpipe.data.columnar_tsv import Triples
from kgpipe.data.formats.ntriples import DROPPED, statement
from kgpipe.data.io import Fallback, opened
from kgpipe.data.line_scan import decoded_lines
from kgpipe.errors import DataError

__all__ = ["Parsed", "ntriples_batches", "ntriples_row"]


class Parsed:
    """A file's statements as the first read parsed them, in a temporary file (in ``folder``,
    the system's temp folder by default; nameless: gone when closed or when the process ends),
    so that the second read does not parse them again. Without room there, both reads parse."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.sha: str | None = None  # set once the first read went through the whole file
        self._file: IO[bytes] | None = None
        self._off = False

    def start(self) -> None:
        self.close()
        if not self._off:
            try:
                self._file = tempfile.TemporaryFile(prefix="kgpipe-nt-", dir=self.folder)  # noqa: SIM115
            except OSError:
                self._off = True

    def add(self, triples: Triples) -> None:
        if self._file is None:
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, _SCHEMA) as writer:
            writer.write_batch(pa.record_batch(list(triples), schema=_SCHEMA))
        data = sink.getvalue()
        try:
            self._file.write(len(data).to_bytes(8, "little"))
            self._file.write(data)
        except OSError:  # no room left: the second read parses the file again
            self._off = True
            self.close()

    def done(self, sha: str) -> None:
        if self._file is not None:
            try:
                self._file.flush()  # the last batch too, while a full disk can still be taken
            except OSError:
                self._off = True
                self.close()
                return
            self.sha = sha

    def batches(self) -> Iterator[Triples]:
        assert self._file is not None
        self._file.seek(0)
        while head := self._file.read(8):
            batch = pa.ipc.open_stream(self._file.read(int.from_bytes(head, "little")))
            columns = batch.read_next_batch().columns
            yield columns[0], columns[1], columns[2]
        self.close()  # the second read was the last

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self.sha = None, None


_SCHEMA = pa.schema([(name, pa.large_string()) for name in ("h", "r", "t")])


@contextlib.contextmanager
def ntriples_batches(
    url: str,
    storage_options: dict[str, Any] | None,
    keep_literals: bool,
    rows: int,
    counts: dict[str, int],
    parsed: Parsed,
) -> Iterator[tuple[Iterator[Triples], Callable[[], str]]]:
    """The file's statements, ``rows`` at a time, and the SHA-256 of the bytes read so far;
    ``counts["dropped"]``: the statements whose literal object was dropped, once read. The
    second read takes what the first parsed from ``parsed`` when it holds it."""
    if parsed.sha is not None:
        sha = parsed.sha
        yield parsed.batches(), lambda: sha
        return
    with opened(url, storage_options) as f:
        digest = hashlib.sha256()
        parsed.start()
        yield _batches(f, url, keep_literals, rows, counts, digest, parsed), digest.hexdigest


def _batches(
    f: IO[bytes],
    url: str,
    keep_literals: bool,
    rows: int,
    counts: dict[str, int],
    sha: Any,
    parsed: Parsed,
) -> Iterator[Triples]:
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    dropped = kept = 0
    lines = decoded_lines(f, url, sha)
    for number, line in lines:
        try:
            triple = statement(line, number, url, keep_literals)
        except DataError as problem:
            for _ in lines:  # invalid UTF-8 further on is the line parser's first error
                pass
            raise problem from None
        if triple is None:
            continue
        if triple is DROPPED:
            dropped += 1
            continue
        heads.append(triple[0])
        rels.append(triple[1])
        tails.append(triple[2])
        if len(heads) >= rows:
            kept += len(heads)
            triples = _arrays(heads, rels, tails)
            parsed.add(triples)
            yield triples
    kept += len(heads)
    if heads:
        triples = _arrays(heads, rels, tails)
        parsed.add(triples)
        yield triples
    if kept == 0 and dropped:  # the line parser's word on a split of literal statements only
        raise Fallback(url)
    counts["dropped"] = dropped
    parsed.done(sha.hexdigest())


def _arrays(heads: list[str], rels: list[str], tails: list[str]) -> Triples:
    out = tuple(pa.array(x, pa.large_string()) for x in (heads, rels, tails))
    heads.clear()
    rels.clear()
    tails.clear()
    return out


def ntriples_row(
    url: str, storage_options: dict[str, Any] | None, keep_literals: bool, row: int
) -> tuple[int | None, str | None]:
    """The line number and the tab-joined labels of statement ``row`` (0-based, in file order,
    dropped ones not counted), for an error message."""
    with opened(url, storage_options) as f:
        for number, line in decoded_lines(f, url):
            triple = statement(line, number, url, keep_literals)
            if triple is None or triple is DROPPED:
                continue
            if row == 0:
                return number, "\t".join(triple)
            row -= 1
    return None, None
