"""The line scans behind the columnar reader's errors: a file read again a line at a time, in
constant memory, for the line parser's own error with its line number
(:func:`locate_problem`), or for the line of one triple (:func:`row_line`)."""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Iterator
from typing import IO, Any

from kgpipe.data.columnar_tsv import quoted_record, record_fields
from kgpipe.data.formats.text import (
    ROLES,
    blank_record,
    describe_delimiter,
    field_problem,
    skipped_line,
)
from kgpipe.data.io import Fallback, opened
from kgpipe.errors import DataError

__all__ = ["check_utf8", "csv_fields", "decoded_lines", "first_row", "locate_problem", "row_line"]

#: what Python's ``csv`` module reads otherwise than text between delimiters
_NOT_PLAIN_CSV = ("\0", "\r")
#: the csv module's field limit, asked when a file is read (``first_row``'s ``csv`` is a flag)
_field_limit = csv.field_size_limit


def _lines(url: str, storage_options: dict[str, Any] | None) -> Iterator[tuple[int, bytes]]:
    """``(number, bytes)`` of every line, without its LF and one CR before it."""
    with opened(url, storage_options) as f:
        for number, raw in enumerate(f, 1):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            yield number, (line[:-1] if line.endswith(b"\r") else line)


def decoded_lines(
    f: IO[bytes], url: str, sha: Any = None, start: int = 1
) -> Iterator[tuple[int, str]]:
    """``(number, text)`` of every line of the open file ``f`` as
    :func:`~kgpipe.data.formats.text.split_lines` cuts the decoded file (its LF and one CR
    before it removed, a leading BOM dropped); the line parser's error at invalid UTF-8.
    ``sha`` is updated with every byte read; ``start``: the number of ``f``'s first line (a
    file read on from a line of another)."""
    for number, raw in enumerate(f, start):
        if sha is not None:
            sha.update(raw)
        line = raw[:-1] if raw.endswith(b"\n") else raw
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                url,
                f"not valid UTF-8 (byte 0x{line[err.start]:02x} at column {err.start + 1})",
                line=number,
                excerpt=line.rstrip(b"\r").decode("utf-8", errors="replace"),
            ) from None
        yield number, text[1:] if number == 1 and text.startswith("\ufeff") else text


def _decoded(url: str, storage_options: dict[str, Any] | None) -> Iterator[tuple[int, str]]:
    with opened(url, storage_options) as f:
        yield from decoded_lines(f, url)


def check_utf8(url: str, storage_options: dict[str, Any] | None) -> None:
    """The line parser's error for the file's first invalid UTF-8 (it decodes a file whole
    before anything else), read a line at a time."""
    for _ in _decoded(url, storage_options):
        pass


@functools.cache
def _record(delimiter: str) -> re.Pattern[str]:
    return re.compile(quoted_record(delimiter))


def csv_fields(line: str, delimiter: str, url: str) -> list[str]:
    """The fields of a CSV file's line (not a comment) as the line parser's ``csv`` module
    reads them where the columnar reader takes the file: the text between delimiters, or for
    a line that quotes, the module's fields of the one whole record it is. Raises
    :class:`~kgpipe.data.io.Fallback` at a line the columnar reader leaves to the line parser
    (a NUL, a carriage return, a quote that is not a whole record's, a quoted head ``"#...``)."""
    if any(c in line for c in _NOT_PLAIN_CSV):
        raise Fallback(url)
    if '"' not in line:
        return line.split(delimiter)
    if line[:2] == '"#' or not _record(delimiter).fullmatch(line):
        raise Fallback(url)
    return record_fields(line, delimiter)


def _skipped(line: str, delimiter: str, url: str, quoting: bool) -> list[str] | None:
    """``line``'s fields (:func:`csv_fields` where ``quoting``), None for a line the readers
    skip (a comment, a blank line or record); a comment that quotes raises
    :class:`~kgpipe.data.io.Fallback` as the columnar reader's gate does."""
    if not quoting:
        return None if skipped_line(line, delimiter) else line.split(delimiter)
    if line[:1] == "#":
        if '"' in line:
            raise Fallback(url)
        return None
    fields = csv_fields(line, delimiter, url)
    return None if blank_record(fields) else fields


def first_row(
    url: str, storage_options: dict[str, Any] | None, delimiter: str, *, csv: bool = False
) -> tuple[int, str, list[str]] | None:
    """The number, text and fields (:func:`csv_fields` for ``csv``) of the file's first line
    that is not skipped (a comment or a blank line): its header row, or its first triple;
    None when it has none. Raises :class:`~kgpipe.data.io.Fallback` at a line of a CSV file
    that the columnar reader leaves to the line parser; the line parser's error at invalid
    UTF-8 up to it (the first in the file)."""
    limit = _field_limit()
    for number, line in _decoded(url, storage_options):
        if csv and line[:1] != "#" and len(line) > limit:  # perhaps a field the module refuses
            raise Fallback(url)
        fields = _skipped(line, delimiter, url, csv)
        if fields is not None:
            return number, line, fields
    return None


def locate_problem(
    url: str,
    storage_options: dict[str, Any] | None,
    delimiter: str,
    *,
    fmt: str = "tsv",
    header: bool = False,
    pick: tuple[int, int, int] | None = None,
) -> None:
    """Raise the line parser's error for a file of format ``fmt`` (``tsv``, or ``csv`` without
    quoting), read a line at a time: invalid UTF-8 first, then a wrong field count, then a wrong
    label (empty, blank, holding a carriage return: the order the line parser finds them in).
    With ``header`` its first line that is not skipped is the header row, of three fields
    unless ``pick`` (``data.columns``: the head, relation and tail fields, of rows of at least
    as many fields) says which are taken. Returns when the file has none of them.

    Raises :class:`~kgpipe.data.io.Fallback` at a line of a CSV file that the columnar reader
    leaves to the line parser (:func:`csv_fields`): only the line parser says what it makes
    of it."""
    described = describe_delimiter(delimiter, fmt)
    fields: DataError | None = None
    label: DataError | None = None
    need = 3 if pick is None else max(pick) + 1
    limit = _field_limit() if fmt == "csv" else None
    for number, line in _decoded(url, storage_options):
        if fields is not None:  # the first: read on only for invalid UTF-8, which comes first
            continue
        read = _skipped(line, delimiter, url, fmt == "csv")
        if (
            limit is not None
            and line[:1] != "#"  # a comment is not read as CSV (blank lines are)
            and len(line) > limit
            and any(len(part) > limit for part in csv_fields(line, delimiter, url))
        ):
            fields = DataError(
                url,
                f"malformed CSV: field larger than field limit ({limit})",
                line=number,
                excerpt=line,
            )
        if fields is not None or read is None:  # the limit's error, or a line skipped
            continue
        parts = read
        if header:
            header = False
            if len(parts) != 3 and pick is None:
                fields = DataError(
                    url,
                    f"expected 3 {described} fields in the header, found {len(parts)} "
                    "(set data.columns to pick three)",
                    line=number,
                    excerpt=line,
                )
            continue
        if pick is None and len(parts) != 3:
            fields = DataError(
                url, f"expected 3 {described} fields, found {len(parts)}", line=number, excerpt=line
            )
            continue
        if pick is not None and len(parts) < need:
            hi, ri, ti = pick
            fields = DataError(
                url,
                f"expected at least {need} {described} fields (columns {hi}, {ri}, {ti}), "
                f"found {len(parts)}",
                line=number,
                excerpt=line,
            )
            continue
        if label is None:
            for role, i in zip(ROLES, pick or (0, 1, 2), strict=True):
                problem = field_problem(parts[i], role, plain_lines=fmt != "csv")
                if problem is not None:
                    label = DataError(url, problem, line=number, excerpt=line)
                    break
    if fields is not None:
        raise fields
    if label is not None:
        raise label


def row_line(
    url: str,
    storage_options: dict[str, Any] | None,
    delimiter: str,
    row: int,
    header: bool,
    pick: tuple[int, int, int] = (0, 1, 2),
    *,
    quoting: bool = False,
) -> tuple[int | None, str | None]:
    """The line number and the tab-joined fields (``pick``: the head, relation and tail
    fields) of triple ``row`` (0-based, in file order) of a file the fast reader took, for an
    error message. ``quoting``: a CSV file, whose lines that quote are read as the ``csv``
    module reads them (the fast reader takes such a file only where each is one record)."""
    skip = header
    for number, raw in _lines(url, storage_options):
        line = raw.decode("utf-8", errors="replace")
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        fields = _skipped(line, delimiter, url, quoting)
        if fields is None:  # as the fast reader skips them
            continue
        if skip:
            skip = False
            continue
        if row == 0:
            return number, "\t".join(fields[i] for i in pick)
        row -= 1
    return None, None
