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

import codecs
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import IO, Any

import pyarrow as pa

from kgpipe.data.columnar_tsv import Triples
from kgpipe.data.formats.ntriples import DROPPED, statement
from kgpipe.data.io import Fallback, opened
from kgpipe.errors import DataError

__all__ = ["ntriples_batches", "ntriples_row"]


def _lines(f: IO[bytes], url: str, sha: Any = None) -> Iterator[tuple[int, str]]:
    """``(number, text)`` of every line as :func:`~kgpipe.data.formats.text.split_lines` cuts
    the decoded file (its LF and one CR before it removed, a leading BOM dropped); the line
    parser's error at invalid UTF-8. ``sha`` is updated with every byte read."""
    decoder = codecs.getincrementaldecoder("utf-8")
    for number, raw in enumerate(f, 1):
        if sha is not None:
            sha.update(raw)
        line = raw[:-1] if raw.endswith(b"\n") else raw
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            text = decoder().decode(line, final=True)
        except UnicodeDecodeError as err:
            raise DataError(
                url,
                f"not valid UTF-8 (byte 0x{line[err.start]:02x} at column {err.start + 1})",
                line=number,
                excerpt=line.rstrip(b"\r").decode("utf-8", errors="replace"),
            ) from None
        yield number, text[1:] if number == 1 and text.startswith("\ufeff") else text


@contextlib.contextmanager
def ntriples_batches(
    url: str,
    storage_options: dict[str, Any] | None,
    keep_literals: bool,
    rows: int,
    counts: dict[str, int],
) -> Iterator[tuple[Iterator[Triples], Callable[[], str]]]:
    """The file's statements, ``rows`` at a time, and the SHA-256 of the bytes read so far;
    ``counts["dropped"]``: the statements whose literal object was dropped, once read."""
    with opened(url, storage_options) as f:
        sha = hashlib.sha256()
        yield _batches(f, url, keep_literals, rows, counts, sha), sha.hexdigest


def _batches(
    f: IO[bytes], url: str, keep_literals: bool, rows: int, counts: dict[str, int], sha: Any
) -> Iterator[Triples]:
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    dropped = kept = 0
    lines = _lines(f, url, sha)
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
            yield _arrays(heads, rels, tails)
    kept += len(heads)
    if heads:
        yield _arrays(heads, rels, tails)
    if kept == 0 and dropped:  # the line parser's word on a split of literal statements only
        raise Fallback(url)
    counts["dropped"] = dropped


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
        for number, line in _lines(f, url):
            triple = statement(line, number, url, keep_literals)
            if triple is None or triple is DROPPED:
                continue
            if row == 0:
                return number, "\t".join(triple)
            row -= 1
    return None, None
