"""Delimited text: TSV (tab by default) and CSV (RFC 4180 quoting, comma by default)."""

from __future__ import annotations

import csv
from collections.abc import Iterator

from kgpipe.data.formats.base import FORMATS, LabeledTriples, ParseOptions, TripleFormat
from kgpipe.data.formats.text import (
    blank_record,
    check_labels,
    comment_triple,
    decode,
    describe_delimiter,
    resolve_columns,
    skipped_line,
    split_lines,
)
from kgpipe.errors import DataError

__all__ = ["Csv", "Tsv"]


@FORMATS.register("tsv")
class Tsv(TripleFormat):
    """Tab-separated ``head<TAB>relation<TAB>tail`` lines (or ``data.delimiter``); no quoting."""

    extensions = (".tsv", ".txt")

    def parse(self, data: bytes, *, source: str, options: ParseOptions) -> LabeledTriples:
        return _parse_tsv(
            decode(data, source), source, options.delimiter or "\t", options.header, options.columns
        )


@FORMATS.register("csv")
class Csv(TripleFormat):
    """Comma-separated values with RFC 4180 quoting (or ``data.delimiter``)."""

    extensions = (".csv",)

    def parse(self, data: bytes, *, source: str, options: ParseOptions) -> LabeledTriples:
        return _parse_csv(
            decode(data, source), source, options.delimiter or ",", options.header, options.columns
        )


def _parse_tsv(
    text: str,
    source: str,
    delimiter: str,
    header: bool,
    columns: tuple[str | int, str | int, str | int] | None,
) -> LabeledTriples:
    lines = split_lines(text)
    described = describe_delimiter(delimiter, "tsv")
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    nums: list[int] = []
    start = 0
    comments = 0
    names: list[str] | None = None
    header_line: int | None = None
    if header:
        for i, line in enumerate(lines):
            if skipped_line(line, delimiter):
                comments += comment_triple(line, delimiter)  # as below, and as CSV counts them
                continue
            names = line.split(delimiter)
            header_line = i + 1
            start = i + 1
            break
        else:
            raise DataError(source, "no triples found (empty file)")
    idx = resolve_columns(
        columns,
        names,
        source=source,
        line=header_line,
        excerpt=lines[header_line - 1] if header_line else None,
    )
    if columns is None and names is not None and len(names) != 3:
        raise DataError(
            source,
            f"expected 3 {described} fields in the header, found {len(names)} "
            "(set data.columns to pick three)",
            line=header_line,
            excerpt=lines[header_line - 1] if header_line else None,
        )

    if idx == (0, 1, 2) and columns is None:
        # Fast path: exactly three fields per line.
        add_h, add_r, add_t, add_n = heads.append, rels.append, tails.append, nums.append
        for i in range(start, len(lines)):
            line = lines[i]
            if skipped_line(line, delimiter):
                comments += comment_triple(line, delimiter)
                continue
            fields = line.split(delimiter)
            if len(fields) != 3:
                raise DataError(
                    source,
                    f"expected 3 {described} fields, found {len(fields)}",
                    line=i + 1,
                    excerpt=line,
                )
            h, r, t = fields
            add_h(h)
            add_r(r)
            add_t(t)
            add_n(i + 1)
    else:
        hi, ri, ti = idx
        need = max(idx) + 1
        for i in range(start, len(lines)):
            line = lines[i]
            if skipped_line(line, delimiter):
                comments += comment_triple(line, delimiter)
                continue
            fields = line.split(delimiter)
            if len(fields) < need:
                raise DataError(
                    source,
                    f"expected at least {need} {described} fields (columns {hi}, {ri}, {ti}), "
                    f"found {len(fields)}",
                    line=i + 1,
                    excerpt=line,
                )
            heads.append(fields[hi])
            rels.append(fields[ri])
            tails.append(fields[ti])
            nums.append(i + 1)
    out = LabeledTriples(heads, rels, tails, nums, comment_triples=comments)
    check_labels(out, source, lines, plain_lines=True)
    if header_line is not None and not heads:
        raise DataError(source, "no triples found (the file has only a header row)")
    return out


def _parse_csv(
    text: str,
    source: str,
    delimiter: str,
    header: bool,
    columns: tuple[str | int, str | int, str | int] | None,
) -> LabeledTriples:
    if len(delimiter) != 1:
        raise DataError(source, f"the CSV delimiter must be one character, got {delimiter!r}")
    lines = split_lines(text)
    last = len(lines) - 1
    at_record_start = [True]
    comments = [0]

    def feed() -> Iterator[str]:
        # Comment lines are recognised only where a record starts (not inside a quoted,
        # multi-line field) and replaced by blank lines so that line numbers stay right.
        for i, line in enumerate(lines):
            if at_record_start[0]:
                at_record_start[0] = False
                if line.startswith("#"):
                    comments[0] += comment_triple(line, delimiter)
                    yield "\n"
                    continue
            yield line + "\n" if i < last else line

    reader = csv.reader(feed(), delimiter=delimiter, strict=True)
    described = describe_delimiter(delimiter, "csv")
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    nums: list[int] = []
    names: list[str] | None = None
    header_line: int | None = None
    idx: tuple[int, int, int] | None = (
        None if header else resolve_columns(columns, None, source=source, line=None, excerpt=None)
    )
    strict = columns is None
    need = 3 if idx is None else max(idx) + 1  # columns by index, no header row
    while True:
        at_record_start[0] = True
        first_line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            where = "" if reader.line_num <= first_line else f" (read up to line {reader.line_num})"
            raise DataError(
                source,
                f"malformed CSV: {err}{where}",
                line=first_line,
                excerpt=lines[min(first_line, last + 1) - 1],
            ) from None
        if blank_record(row):  # ",," too: a blank line
            continue
        if idx is None:  # the header row
            names = row
            header_line = first_line
            idx = resolve_columns(
                columns, names, source=source, line=first_line, excerpt=lines[first_line - 1]
            )
            if strict and len(names) != 3:
                raise DataError(
                    source,
                    f"expected 3 {described} fields in the header, found {len(names)} "
                    "(set data.columns to pick three)",
                    line=first_line,
                    excerpt=lines[first_line - 1],
                )
            need = max(idx) + 1
            continue
        if strict:
            if len(row) != 3:
                raise DataError(
                    source,
                    f"expected 3 {described} fields, found {len(row)}",
                    line=first_line,
                    excerpt=lines[first_line - 1],
                )
        elif len(row) < need:
            raise DataError(
                source,
                f"expected at least {need} {described} fields "
                f"(columns {idx[0]}, {idx[1]}, {idx[2]}), found {len(row)}",
                line=first_line,
                excerpt=lines[first_line - 1],
            )
        heads.append(row[idx[0]])
        rels.append(row[idx[1]])
        tails.append(row[idx[2]])
        nums.append(first_line)
    out = LabeledTriples(heads, rels, tails, nums, comment_triples=comments[0])
    check_labels(out, source, lines)
    if header_line is not None and not heads:
        raise DataError(source, "no triples found (the file has only a header row)")
    return out
