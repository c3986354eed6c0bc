"""N-Triples files as batches of ``(heads, relations, tails)`` string arrays for the columnar
reader (:mod:`kgpipe.data.columnar`): a batch of statements at a time instead of the whole file
and a Python string per term (the line parser's :mod:`kgpipe.data.formats.ntriples`, ~250 bytes
a statement: RDF dumps of hundreds of millions of statements did not fit).

A block of whole lines (``data.block_size``) is one Arrow string array. The lines written as
RDF tools write them (three terms one space apart, no escape: :data:`PLAIN`, :data:`LITERAL`)
are read in bulk by pyarrow's kernels; every other line by the line parser's own
:func:`~kgpipe.data.formats.ntriples.statement`, and the two are merged in the lines' order.
The patterns accept only lines that ``statement`` reads as they are written, so the labels,
counts and errors are the line parser's; only what is held differs. The line parser decodes a
whole file before it parses a statement, so a malformed statement is reported only once the
rest of the file is known to be UTF-8 (else the first invalid byte is). A file whose statements
all have literal objects that are dropped goes to the line parser
(:class:`~kgpipe.data.io.Fallback`), which says so for train and keeps the empty split else.
"""

from __future__ import annotations

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
from kgpipe.data.formats.ntriples import DROPPED, XSD_STRING, statement
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
#: the same with a literal object (no escape either): dropped, or kept (:func:`_kept`)
LITERAL = (
    f"^(?P<s>{_TERM}) <(?P<p>{_IRI[1:-1]})> "
    + r'(?P<text>"[^"\\\n\r]*")(?:(?P<tag>@[A-Za-z]+(?:-[A-Za-z0-9]+)*)|\^\^<(?P<type>'
    + _IRI[1:-1]
    + ")>)?"
    + _END
)


def _lines(chunk: bytes, start: int) -> pa.LargeStringArray | None:
    """The lines of the whole-line block ``chunk`` as strings, each with its line end (a BOM
    before line 1 left out); None when they are not UTF-8."""
    lines = line_array(chunk, bom=start == 1)
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
    others one at a time by the line parser's
    :func:`~kgpipe.data.formats.ntriples.statement`; all in the lines' order."""
    is_plain = pc.match_substring_regex(lines, PLAIN).to_numpy(zero_copy_only=False)
    is_literal = pc.match_substring_regex(lines, LITERAL).to_numpy(zero_copy_only=False)
    parts: list[tuple[np.ndarray, Triples]] = []  # the rows' positions, their labels
    if is_plain.any():
        fast = lines if is_plain.all() else lines.filter(pa.array(is_plain))
        split = pc.split_pattern(fast, " ", max_splits=3)
        h, r, t = (_label(pc.list_element(split, i)) for i in range(3))
        parts.append((np.flatnonzero(is_plain), (h, r, t)))
    dropped = 0
    if is_literal.any():
        if keep_literals:
            parts.append((np.flatnonzero(is_literal), _kept(lines.filter(pa.array(is_literal)))))
        else:
            dropped = int(is_literal.sum())
    others = np.flatnonzero(~(is_plain | is_literal))
    if len(others):
        rows = ((int(i) + start, _text(lines[int(i)].as_py())) for i in others)
        slow, kept, gone = _block(rows, url, keep_literals)
        dropped += gone
        if slow is not None:
            parts.append((others[kept], slow))
    if not parts:
        return None, dropped
    if len(parts) == 1:
        return parts[0][1], dropped
    order = pa.array(np.argsort(np.concatenate([at for at, _ in parts]), kind="stable"))
    h, r, t = (pc.take(pa.concat_arrays([p[1][i] for p in parts]), order) for i in range(3))
    return (h, r, t), dropped


def _kept(lines: pa.Array) -> Triples:
    """The labels of statements of :data:`LITERAL`'s shape, their literals kept as the line
    parser spells them (the language tag in lower case, ``^^xsd:string`` left out)."""
    terms = pc.extract_regex(lines, LITERAL)
    kind = terms.field("type")
    opening, closing, empty, xsd = (
        pa.scalar(x, pa.large_string()) for x in ("^^<", ">", "", XSD_STRING)
    )
    typed = pc.binary_join_element_wise(opening, kind, closing, empty)
    plain = pc.or_(pc.equal(kind, empty), pc.equal(kind, xsd))
    suffix = pc.if_else(plain, pc.utf8_lower(terms.field("tag")), typed)
    tail = pc.binary_join_element_wise(terms.field("text"), suffix, empty)
    return _label(terms.field("s")), terms.field("p"), tail


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
