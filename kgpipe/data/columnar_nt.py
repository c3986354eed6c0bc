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
import io
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kgpipe.data.columnar_tsv import Triples, line_array, line_blocks
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
    block_size: int,
    counts: dict[str, int],
    parsed: Parsed,
) -> Iterator[tuple[Iterator[Triples], Callable[[], str]]]:
    """The file's statements, a block of about ``block_size`` bytes of whole lines at a time,
    and the SHA-256 of the bytes read so far; ``counts["dropped"]``: the statements whose
    literal object was dropped, once read. The second read takes what the first parsed from
    ``parsed`` when it holds it."""
    if parsed.sha is not None:
        sha = parsed.sha
        yield parsed.batches(), lambda: sha
        return
    with opened(url, storage_options) as f:
        digest = hashlib.sha256()
        parsed.start()
        yield _batches(f, url, keep_literals, block_size, counts, digest, parsed), digest.hexdigest


def _batches(
    f: IO[bytes],
    url: str,
    keep_literals: bool,
    block_size: int,
    counts: dict[str, int],
    sha: Any,
    parsed: Parsed,
) -> Iterator[Triples]:
    dropped = kept = 0
    blocks = _numbered(line_blocks(f, block_size), sha)
    for start, chunk in blocks:
        lines = _lines(chunk, start)
        if lines is None:  # not UTF-8: the line parser's error, at the latest in this block
            triples, _, gone = _block(_decoded(chunk, start, url), url, keep_literals)
        else:
            try:
                triples, gone = _fast_block(lines, start, url, keep_literals)
            except DataError as problem:
                for later, rest in blocks:  # invalid UTF-8 further on is the line parser's
                    if _lines(rest, later) is None:  # first error
                        for _ in _decoded(rest, later, url):
                            pass
                raise problem from None
        del chunk, lines
        dropped += gone
        if triples is not None:
            kept += len(triples[0])
            parsed.add(triples)
            yield triples
    if kept == 0 and dropped:  # the line parser's word on a split of literal statements only
        raise Fallback(url)
    counts["dropped"] = dropped
    parsed.done(sha.hexdigest())


def _numbered(blocks: Iterator[bytes], sha: Any) -> Iterator[tuple[int, bytes]]:
    """Each block with the number of its first line; ``sha`` is updated with every byte."""
    start = 1
    for block in blocks:
        sha.update(block)
        yield start, block
        start += block.count(b"\n")


#: Python's whitespace (``str.isspace``, what ``\s`` matches in the line parser's patterns),
#: spelled out for RE2, whose ``\s`` is ASCII whitespace only
PY_SPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + (
    "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
_NOT_BNODE = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in PY_SPACE) + r'<>"().\\]'
_IRI = r'<[^\x00-\x20<>"{}|^`\\]+>'  # not empty, no escape
_TERM = f"(?:{_IRI}|_:{_NOT_BNODE}+(?:\\.+{_NOT_BNODE}+)*)"  # an IRI or a blank node
_END = r" \.\r?\n?$"
#: statements that the line parser reads as written: one space between terms, no escape (the
#: shape RDF tools write); the others are read by it
PLAIN = f"^{_TERM} {_IRI} {_TERM}{_END}"
#: the same with a literal object, dropped unless literals are kept
LITERAL = (
    f"^{_TERM} {_IRI} " + r'"[^"\\\n\r]*"(?:@[A-Za-z]+(?:-[A-Za-z0-9]+)*|\^\^' + _IRI + ")?" + _END
)


def _lines(chunk: bytes, start: int) -> pa.LargeStringArray | None:
    """The whole lines ``chunk`` as strings, each with its line end (a BOM before line 1
    left out); None when they are not UTF-8."""
    first = 3 if start == 1 and chunk.startswith(codecs.BOM_UTF8) else 0
    lines = line_array(chunk, first)
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return lines


def _decoded(chunk: bytes, start: int, url: str) -> Iterator[tuple[int, str]]:
    return decoded_lines(io.BytesIO(chunk), url, start=start)


def _fast_block(
    lines: pa.LargeStringArray, start: int, url: str, keep_literals: bool
) -> tuple[Triples | None, int]:
    """The statements of ``lines`` (line ``start`` first) and the count dropped: lines of the
    common shapes (:data:`PLAIN`, :data:`LITERAL`) read by pyarrow's kernels, in bulk; the
    others, and all where literals are kept, one at a time by the line parser's
    :func:`~kgpipe.data.formats.ntriples.statement`."""
    plain = pc.match_substring_regex(lines, PLAIN)
    known = plain
    dropped = 0
    if not keep_literals:
        literal = pc.match_substring_regex(lines, LITERAL)
        dropped = pc.sum(literal.cast(pa.int64())).as_py() or 0
        known = pc.or_(plain, literal)
    is_plain = plain.to_numpy(zero_copy_only=False)
    others = np.flatnonzero(~known.to_numpy(zero_copy_only=False))
    fast = lines if is_plain.all() else pc.filter(lines, plain)
    parts = pc.split_pattern(fast, " ", max_splits=3)
    columns = [_label(pc.list_element(parts, i)) for i in range(3)]
    del parts, fast
    if len(others):
        rows = ((int(i) + start, _text(lines[int(i)].as_py())) for i in others)
        slow, kept, gone = _block(rows, url, keep_literals)
        dropped += gone
        if slow is not None:
            at = np.concatenate([np.flatnonzero(is_plain), others[kept]])
            order = pa.array(np.argsort(at, kind="stable"))
            columns = [
                pc.take(pa.concat_arrays([c, s]), order) for c, s in zip(columns, slow, strict=True)
            ]
    h, r, t = columns
    return ((h, r, t) if len(h) else None), dropped


def _text(line: str) -> str:
    """A line without its LF and one CR before it."""
    line = line[:-1] if line.endswith("\n") else line
    return line[:-1] if line.endswith("\r") else line


def _label(terms: pa.Array) -> pa.Array:
    """IRIs without their brackets; blank nodes as written (the line parser's labels)."""
    inner = pc.utf8_slice_codeunits(terms, 1, -1)
    iri = pc.starts_with(terms, "<")
    return inner if pc.all(iri).as_py() is not False else pc.if_else(iri, inner, terms)


def _block(
    lines: Iterable[tuple[int, str]], url: str, keep_literals: bool
) -> tuple[Triples | None, list[int], int]:
    """The statements of ``lines`` (``(number, text)``) read one at a time by the line
    parser's :func:`~kgpipe.data.formats.ntriples.statement`, the positions in ``lines`` of
    those kept, and the count dropped; the line parser's first error (invalid UTF-8 later in
    ``lines`` before a malformed statement)."""
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    kept: list[int] = []
    dropped = 0
    lines = iter(lines)
    for k, (number, line) in enumerate(lines):
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
        kept.append(k)
    if not heads:
        return None, kept, dropped
    h, r, t = (pa.array(x, pa.large_string()) for x in (heads, rels, tails))
    return (h, r, t), kept, dropped


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
