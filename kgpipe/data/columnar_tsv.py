"""Tab-separated files and CSV files as blocks of ``(heads, relations, tails)`` string arrays
for the columnar reader (:mod:`kgpipe.data.columnar`), through pyarrow's CSV reader, with the
SHA-256 of the file's bytes; a line the line parser would take differently raises
:class:`Fallback`.

A CSV file is read here while pyarrow reads it as Python's ``csv`` module (strict, RFC 4180
quoting) does: no NUL byte, no field longer than the module takes
(``csv.field_size_limit()``), and every line that holds a quote character (``"``) a whole
record by :func:`quoted_record` (a quoted field that spans lines, text after a closing quote,
which pyarrow reads on and the module refuses, or a comment or a head ``#...`` that quotes,
goes to the line parser).
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import functools
import hashlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from kgpipe.data.formats.text import blank_record, comment_triple
from kgpipe.data.io import Fallback, opened

__all__ = [
    "Layout",
    "Triples",
    "line_array",
    "line_blocks",
    "quoted_record",
    "record_fields",
    "tsv_batches",
]


@dataclass(frozen=True)
class Layout:
    """How many fields a text file's rows have, and which are the head, relation and tail
    (``data.columns``, 0-based)."""

    fields: int = 3
    pick: tuple[int, int, int] = (0, 1, 2)


#: one block's heads, relations and tails (``large_string`` arrays of one length)
Triples = tuple[pa.Array, pa.Array, pa.Array]


@contextlib.contextmanager
def tsv_batches(
    url: str,
    storage_options: dict[str, Any] | None,
    delimiter: str,
    block_size: int,
    comments: list[int] | None = None,
    *,
    csv: bool = False,
    layout: Layout | None = None,
) -> Iterator[tuple[Iterator[Triples], Callable[[], str]]]:
    """The file's triples a block at a time, and the SHA-256 of the bytes read so far (all of
    them once the blocks are done). Comment lines holding three fields are counted in
    ``comments[0]``. ``csv``: a CSV file, read while it has nothing the line parser's ``csv``
    module would read otherwise (see the module). ``layout``: its rows' fields (default: three,
    head, relation and tail); a row of another count raises :class:`Fallback`."""
    with opened(url, storage_options) as raw:
        f = _Hashing(raw, url, csv=csv)
        yield _batches(f, url, delimiter, block_size, comments, layout or Layout()), f.sha.hexdigest


class _Hashing:
    """A binary reader that hashes what it hands on, and raises :class:`Fallback` at a carriage
    return not followed by a line feed (pyarrow ends a row there; the line parser does not),
    and in a CSV file (``csv``) at a NUL byte."""

    def __init__(self, f: IO[bytes], url: str, *, csv: bool = False) -> None:
        self._f, self.sha, self.url = f, hashlib.sha256(), url
        self.csv = csv
        self.closed = False
        self._cr = False  # the last chunk ended with a CR

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.sha.update(data)
        if self.csv and b"\0" in data:
            raise Fallback(self.url)
        if data and (self._cr or b"\r" in data):
            if self._cr and data[:1] != b"\n":
                raise Fallback(self.url)
            self._cr = data.endswith(b"\r")
            body = data[:-1] if self._cr else data
            if body.count(b"\r") != body.count(b"\r\n"):
                raise Fallback(self.url)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


@contextlib.contextmanager
def _quiet_undecodable_rows() -> Iterator[None]:
    """pyarrow reports the ``UnicodeDecodeError`` of a row that is not UTF-8 on stderr (an
    unraisable exception) before refusing it; the line scan then names the byte. Keep quiet."""
    previous = sys.unraisablehook

    def hook(info: Any) -> None:
        if not isinstance(info.exc_value, UnicodeDecodeError):
            previous(info)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _quietly(gen: Callable[..., Iterator[Triples]]) -> Callable[..., Iterator[Triples]]:
    """``gen``'s items, read under :func:`_quiet_undecodable_rows`."""

    @functools.wraps(gen)
    def quiet(*args: Any) -> Iterator[Triples]:
        with _quiet_undecodable_rows():
            yield from gen(*args)

    return quiet


@_quietly
def _batches(
    f: _Hashing,
    url: str,
    delimiter: str,
    block_size: int,
    comments: list[int] | None,
    layout: Layout,
) -> Iterator[tuple[pa.Array, pa.Array, pa.Array]]:
    """``(heads, relations, tails)`` string arrays, a block at a time, comments dropped (and
    counted in ``comments[0]`` where they hold three non-blank fields, as the line parser's
    :func:`~kgpipe.data.formats.text.comment_triple`)."""
    if max(layout.pick) >= layout.fields:  # the rows are too short: the line parser's error
        raise Fallback(url)
    names = [f"f{i}" for i in range(layout.fields)]

    limit = csv.field_size_limit() if f.csv else None  # read when read, as the line parser does

    def invalid(row: Any) -> str:  # a comment, or only delimiters and spaces: skipped
        text = row.text or ""
        if text[:1] == "#":
            if comments is not None and comment_triple(text, delimiter):
                comments[0] += 1  # three fields where the rows have others (data.columns)
            return "skip"
        if limit is not None and len(text) > limit:  # perhaps a field the csv module refuses
            return "error"
        if f.csv and '"' in text:  # a whole record (the block passed the gate): "","" is blank
            return "skip" if blank_record(record_fields(text, delimiter)) else "error"
        return "skip" if not text.replace(delimiter, "").strip() else "error"

    read_options = pcsv.ReadOptions(column_names=names, use_threads=False)
    record = quoted_record(delimiter) if f.csv else ""
    parse_options = pcsv.ParseOptions(
        delimiter=delimiter,
        quote_char='"' if f.csv else False,
        double_quote=f.csv,
        escape_char=False,
        ignore_empty_lines=True,
        invalid_row_handler=invalid,
    )
    convert_options = pcsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.large_string()), strings_can_be_null=False
    )
    for number, chunk in enumerate(line_blocks(f, block_size)):
        if number and chunk.startswith(codecs.BOM_UTF8):  # pyarrow would drop it: not a label's
            raise Fallback(url)
        if len(chunk) >= 1 << 31:  # more than pyarrow's blocks hold (int32): a line of GBs
            raise Fallback(url)
        if record and b'"' in chunk and not _quotes_as_csv_reads_them(chunk, number, record):
            raise Fallback(url)
        read_options.block_size = len(chunk) + 1  # the chunk's lines in one block
        try:
            table = pcsv.read_csv(
                pa.BufferReader(_arrow_owned(chunk)),
                read_options=read_options,
                parse_options=parse_options,
                convert_options=convert_options,
            )
        except pa.ArrowInvalid:  # a wrong field count, invalid UTF-8
            raise Fallback(url) from None
        del chunk
        cols = [table.column(i).combine_chunks() for i in range(layout.fields)]
        del table
        if limit is not None and any(
            (pc.max(pc.utf8_length(c)).as_py() or 0) > limit for c in cols
        ):  # the csv module refuses it (blank rows too): the line parser names the line
            raise Fallback(url)
        blank = [pc.or_(pc.equal(pc.utf8_length(c), 0), pc.utf8_is_space(c)) for c in cols]
        # a `#` line that happens to have the rows' fields, or one of only delimiters and spaces
        hashed = pc.starts_with(cols[0], "#")
        drop = functools.reduce(pc.and_, blank)
        drop = pc.or_(hashed, drop)
        if comments is not None and layout.fields == 3 and pc.any(hashed).as_py():
            filled = pc.invert(functools.reduce(pc.or_, blank))
            comments[0] += pc.sum(pc.and_(hashed, filled)).as_py() or 0
        h, r, t = (cols[i] for i in layout.pick)
        blank = [blank[i] for i in layout.pick]
        del cols
        if pc.any(drop).as_py():
            keep = pc.invert(drop)
            h, r, t, *blank = (pc.filter(x, keep) for x in (h, r, t, *blank))
        if any(pc.any(b).as_py() for b in blank):  # an empty or blank field: the line parser's
            raise Fallback(url)
        if len(h):
            yield h, r, t


def line_blocks(f: IO[bytes] | _Hashing, block_size: int) -> Iterator[bytes]:
    """The file's bytes in pieces of about ``block_size`` that end at a line feed (the last at
    the end of the file): whole lines, a longer piece for a line longer than a block. Joined,
    they are the file."""
    pending: list[bytes] = []  # read since the last line feed
    while data := f.read(block_size):
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # no line end yet: a line longer than what was read
            pending.append(data)
            continue
        yield b"".join([*pending, data[:cut]]) if pending else data[:cut]
        pending = [data[cut:]] if cut < len(data) else []
    if pending:
        yield b"".join(pending)


def line_array(chunk: bytes, *, bom: bool = False, kind: pa.DataType | None = None) -> pa.Array:
    """The lines of the whole-line block ``chunk``, each with its line end, as one
    ``large_string`` (or ``kind``) array over ``chunk``'s bytes, without a copy; ``bom``: the
    file's first block, whose byte order mark, if any, is no line's."""
    first = 3 if bom and chunk.startswith(codecs.BOM_UTF8) else 0
    ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + 1
    if not len(ends) or ends[-1] != len(chunk):
        ends = np.append(ends, len(chunk))
    offsets = np.concatenate(([first], ends)).astype(np.int64)
    return pa.Array.from_buffers(
        kind or pa.large_string(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(chunk)]
    )


def quoted_record(delimiter: str) -> str:
    """An RE2 (and ``re``) pattern of one line that is a whole CSV record as the ``csv`` module
    (strict) reads it: fields quoted (a quote doubled inside, no line end inside) or not (any
    text without the delimiter that does not start with a quote: ``a"b`` is that text, in
    pyarrow's reading too), each quoted one followed by a delimiter or the line's end."""
    field = f"(?:{_field_pattern(delimiter, '?:')})"
    d = _spelled(delimiter)
    return f"^{field}(?:{d}{field})*\\r?\\n?$"


def _spelled(delimiter: str) -> str:
    return f"\\x{ord(delimiter):02x}"  # one ASCII character (the columnar reader's); RE2 and re


def _field_pattern(delimiter: str, group: str) -> str:
    """One field of :func:`quoted_record`: quoted (its text in a group opened by ``group``:
    ``?:`` for none), unquoted, or empty."""
    d = _spelled(delimiter)
    return f'"({group}(?:[^"\\r\\n]|"")*)"|[^"{d}\\r\\n][^{d}\\r\\n]*|'


@functools.cache
def _field(delimiter: str) -> re.Pattern[str]:
    return re.compile(_field_pattern(delimiter, ""))


def record_fields(line: str, delimiter: str) -> list[str]:
    """The fields of ``line`` (without its line end), a whole record by :func:`quoted_record`,
    as the ``csv`` module reads them (but for its field limit, which the caller checks)."""
    field = _field(delimiter)
    out, pos = [], 0
    while True:
        m = field.match(line, pos)
        assert m is not None  # the pattern's empty alternative matches anywhere
        quoted = m.group(1)
        out.append(m.group(0) if quoted is None else quoted.replace('""', '"'))
        pos = m.end()
        if pos >= len(line):
            return out
        pos += 1  # the delimiter


def _quotes_as_csv_reads_them(chunk: bytes, number: int, record: str) -> bool:
    """Whether every line of ``chunk`` (block ``number`` of its file) that holds a quote is a
    whole record pyarrow reads as the ``csv`` module does, and not a comment (``#`` first,
    where the line parser counts the fields between delimiters) nor a record whose quoted first
    field starts with ``#`` (the columnar reader takes a row whose first field starts with
    ``#`` for a comment). Read as bytes: the delimiter and the quote are ASCII."""
    lines = line_array(chunk, bom=number == 0, kind=pa.large_binary())
    quoted = pc.filter(lines, pc.match_substring(lines, '"'))
    return bool(
        pc.all(pc.match_substring_regex(quoted, record)).as_py()
        and not pc.any(pc.match_substring_regex(quoted, '^"?#')).as_py()
    )


def _arrow_owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory Arrow allocated. pyarrow's CSV reader drops its input on
    one of its threads, which must take the GIL for a Python object (a file, ``bytes``): at
    interpreter exit it cannot, and the process aborted ("terminate called without an active
    exception", about one run in ten of a script that staged and exited)."""
    buf = pa.allocate_buffer(len(data))
    np.frombuffer(buf, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return buf
