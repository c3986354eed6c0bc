"""Parsing triples out of TSV, CSV, Parquet and N-Triples files.

Every parser returns :class:`LabeledTriples` (string labels plus the 1-based source line of each
triple) and reports malformed input as :class:`~kgpipe.errors.DataError` naming the file, the
line and an excerpt of it.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kgpipe.data.io import split_compression
from kgpipe.errors import DataError

__all__ = ["FORMATS", "LabeledTriples", "detect_format", "parse_triples"]

#: The formats :func:`parse_triples` understands.
FORMATS: tuple[str, ...] = ("tsv", "csv", "parquet", "ntriples")

_ROLES = ("head", "relation", "tail")
_PARQUET_DEFAULT_COLUMNS = ("head", "relation", "tail")
_EXTENSIONS = {
    ".tsv": "tsv",
    ".txt": "tsv",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".nt": "ntriples",
    ".ntriples": "ntriples",
}


@dataclass(frozen=True)
class LabeledTriples:
    """Triples as string labels, in file order, with their source line numbers."""

    heads: list[str]
    relations: list[str]
    tails: list[str]
    #: 1-based source line of each triple (row index + 1 for Parquet).
    line_numbers: list[int]
    #: N-Triples statements skipped because their object is a literal (``literals="drop"``).
    literals_dropped: int = 0

    def __len__(self) -> int:
        return len(self.heads)


def detect_format(url: str, requested: str) -> str:
    """The format of the file at ``url``.

    ``requested`` other than ``"auto"`` is returned as is. ``"auto"`` decides by the extension
    left after stripping a compression suffix: ``.csv`` -> csv, ``.parquet``/``.pq`` -> parquet,
    ``.nt`` -> ntriples, anything else (``.tsv``, ``.txt``, none) -> tsv.
    """
    if requested != "auto":
        if requested not in FORMATS:
            raise DataError(url, f"unknown format {requested!r} (known: {', '.join(FORMATS)})")
        return requested
    base, _ = split_compression(url)
    name = base.rstrip("/").rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    if dot < 0:
        return "tsv"
    return _EXTENSIONS.get(name[dot:], "tsv")


def parse_triples(
    data: bytes,
    *,
    source: str,
    fmt: str,
    delimiter: str | None = None,
    header: bool = False,
    columns: tuple[str | int, str | int, str | int] | None = None,
    literals: str = "drop",
) -> LabeledTriples:
    """Parse the (decompressed) bytes of one file into labelled triples.

    ``fmt`` is one of :data:`FORMATS` (see :func:`detect_format`). ``delimiter``, ``header`` and
    ``columns`` apply to tsv/csv (``columns`` also to Parquet); ``literals`` (``"drop"`` or
    ``"keep"``) to N-Triples. ``source`` names the file in error messages.

    Raises :class:`~kgpipe.errors.DataError` on malformed input or when the file holds no
    triples at all.
    """
    if fmt in ("tsv", "csv"):
        text = _decode(data, source)
        if fmt == "tsv":
            out = _parse_tsv(text, source, delimiter or "\t", header, columns)
        else:
            out = _parse_csv(text, source, delimiter or ",", header, columns)
    elif fmt == "parquet":
        out = _parse_parquet(data, source, columns)
    elif fmt == "ntriples":
        if literals not in ("drop", "keep"):
            raise DataError(source, f"literals must be 'drop' or 'keep', got {literals!r}")
        out = _parse_ntriples(_decode(data, source), source, literals == "keep")
    else:
        raise DataError(source, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if not out.heads and not out.literals_dropped:
        raise DataError(source, "no triples found (empty file)")
    return out


# --------------------------------------------------------------------------------------------
# text helpers


def _decode(data: bytes, source: str) -> str:
    """UTF-8 text with a leading BOM removed."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        pos = err.start
        start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        line = data.count(b"\n", 0, pos) + 1
        excerpt = data[start:end].rstrip(b"\r").decode("utf-8", errors="replace")
        raise DataError(
            source,
            f"not valid UTF-8 (byte 0x{data[pos]:02x} at column {pos - start + 1})",
            line=line,
            excerpt=excerpt,
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


def _split_lines(text: str) -> list[str]:
    """Lines without their terminators (LF or CRLF); line ``i`` is element ``i - 1``."""
    if "\r" not in text:
        return text.split("\n")
    if text.count("\r\n") == text.count("\n"):  # CRLF throughout: no copy of the text
        lines = text.split("\r\n")
    else:
        lines = text.replace("\r\n", "\n").split("\n")
    if lines[-1].endswith("\r"):  # a last line cut off between CR and LF
        lines[-1] = lines[-1][:-1]
    return lines


def _describe_delimiter(delimiter: str, fmt: str) -> str:
    if delimiter == "\t":
        return "tab-separated"
    if delimiter == ",":
        return "comma-separated"
    if delimiter == ";":
        return "semicolon-separated"
    if delimiter == " ":
        return "space-separated"
    return f"{delimiter!r}-separated" if fmt == "tsv" else f"{delimiter!r}-delimited"


def _resolve_columns(
    columns: tuple[str | int, str | int, str | int] | None,
    names: list[str] | None,
    *,
    source: str,
    line: int | None,
    excerpt: str | None,
) -> tuple[int, int, int]:
    """0-based field indices of head, relation and tail."""
    if columns is None:
        return (0, 1, 2)
    out: list[int] = []
    for role, col in zip(_ROLES, columns, strict=True):
        if isinstance(col, bool):
            raise DataError(source, f"{role} column must be a name or an index, got {col!r}")
        if isinstance(col, str) and names is None:
            if col.isdigit():
                col = int(col)
            else:
                raise DataError(
                    source,
                    f"{role} column {col!r} is a name, but the file has no header row "
                    "(set data.header: true, or give 0-based column indices)",
                )
        if isinstance(col, int):
            if col < 0:
                raise DataError(source, f"{role} column index must be >= 0, got {col}")
            out.append(col)
            continue
        assert names is not None
        if names.count(col) > 1:
            raise DataError(
                source,
                f"{role} column {col!r} appears twice in the header",
                line=line,
                excerpt=excerpt,
            )
        if col not in names:
            raise DataError(
                source,
                f"{role} column {col!r} not in the header (columns: {', '.join(map(repr, names))})",
                line=line,
                excerpt=excerpt,
            )
        out.append(names.index(col))
    return (out[0], out[1], out[2])


def _check_labels(out: LabeledTriples, source: str, excerpt_of: Sequence[str] | None) -> None:
    """Reject empty or whitespace-only labels (checked on the distinct labels: cheap)."""
    first: tuple[int, str] | None = None
    for role, values in zip(_ROLES, (out.heads, out.relations, out.tails), strict=True):
        if any(not v or v.isspace() for v in set(values)):
            idx = next(i for i, v in enumerate(values) if not v or v.isspace())
            if first is None or idx < first[0]:
                first = (idx, role)
    if first is None:
        return
    idx, role = first
    line = out.line_numbers[idx]
    values = {"head": out.heads, "relation": out.relations, "tail": out.tails}[role]
    kind = "empty" if not values[idx] else "blank (whitespace-only)"
    excerpt = excerpt_of[line - 1] if excerpt_of is not None else None
    raise DataError(source, f"{kind} {role} field", line=line, excerpt=excerpt)


# --------------------------------------------------------------------------------------------
# TSV


def _parse_tsv(
    text: str,
    source: str,
    delimiter: str,
    header: bool,
    columns: tuple[str | int, str | int, str | int] | None,
) -> LabeledTriples:
    lines = _split_lines(text)
    described = _describe_delimiter(delimiter, "tsv")
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    nums: list[int] = []
    start = 0
    names: list[str] | None = None
    header_line: int | None = None
    if header:
        for i, line in enumerate(lines):
            if not line or line[0] == "#" or line.isspace():
                continue
            names = line.split(delimiter)
            header_line = i + 1
            start = i + 1
            break
        else:
            raise DataError(source, "no triples found (empty file)")
    idx = _resolve_columns(
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
            if not line or line[0] == "#":
                continue
            fields = line.split(delimiter)
            if len(fields) != 3:
                if line.isspace():
                    continue
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
            if not line or line[0] == "#":
                continue
            fields = line.split(delimiter)
            if len(fields) < need:
                if line.isspace():
                    continue
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
    out = LabeledTriples(heads, rels, tails, nums)
    _check_labels(out, source, lines)
    if header_line is not None and not heads:
        raise DataError(source, "no triples found (the file has only a header row)")
    return out


# --------------------------------------------------------------------------------------------
# CSV


def _parse_csv(
    text: str,
    source: str,
    delimiter: str,
    header: bool,
    columns: tuple[str | int, str | int, str | int] | None,
) -> LabeledTriples:
    if len(delimiter) != 1:
        raise DataError(source, f"the CSV delimiter must be one character, got {delimiter!r}")
    lines = _split_lines(text)
    last = len(lines) - 1
    at_record_start = [True]

    def feed() -> Iterator[str]:
        # Comment lines are recognised only where a record starts (not inside a quoted,
        # multi-line field) and replaced by blank lines so that line numbers stay right.
        for i, line in enumerate(lines):
            if at_record_start[0]:
                at_record_start[0] = False
                if line.startswith("#"):
                    yield "\n"
                    continue
            yield line + "\n" if i < last else line

    reader = csv.reader(feed(), delimiter=delimiter, strict=True)
    described = _describe_delimiter(delimiter, "csv")
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    nums: list[int] = []
    names: list[str] | None = None
    header_line: int | None = None
    idx: tuple[int, int, int] | None = (
        None if header else _resolve_columns(columns, None, source=source, line=None, excerpt=None)
    )
    strict = columns is None
    need = 3
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
        if not row or (len(row) == 1 and (not row[0] or row[0].isspace())):
            continue
        if idx is None:  # the header row
            names = row
            header_line = first_line
            idx = _resolve_columns(
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
    out = LabeledTriples(heads, rels, tails, nums)
    _check_labels(out, source, lines)
    if header_line is not None and not heads:
        raise DataError(source, "no triples found (the file has only a header row)")
    return out


# --------------------------------------------------------------------------------------------
# Parquet


def _parse_parquet(
    data: bytes, source: str, columns: tuple[str | int, str | int, str | int] | None
) -> LabeledTriples:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        names = list(pf.schema_arrow.names)
    except (pa.ArrowException, OSError) as err:
        raise DataError(source, f"not a valid Parquet file: {err}") from None
    wanted = columns if columns is not None else _PARQUET_DEFAULT_COLUMNS
    available = ", ".join(map(repr, names))
    picked: list[str] = []
    for role, col in zip(_ROLES, wanted, strict=True):
        if isinstance(col, bool):
            raise DataError(source, f"{role} column must be a name or an index, got {col!r}")
        if isinstance(col, int):
            if not 0 <= col < len(names):
                raise DataError(
                    source,
                    f"{role} column index {col} out of range: the file has {len(names)} "
                    f"columns ({available})",
                )
            picked.append(names[col])
        elif col in names:
            picked.append(col)
        else:
            hint = "" if columns is not None else " (set data.columns to name the columns)"
            raise DataError(
                source, f"{role} column {col!r} not found; available columns: {available}{hint}"
            )
    try:
        table = pf.read(columns=list(dict.fromkeys(picked)))
    except (pa.ArrowException, OSError) as err:
        raise DataError(source, f"cannot read Parquet data: {err}") from None

    values: list[list[str]] = []
    first_bad: tuple[int, str, str] | None = None  # (row, role, problem)
    for role, name in zip(_ROLES, picked, strict=True):
        col = table.column(name)
        if col.null_count:
            row = int(col.is_null().to_numpy(zero_copy_only=False).argmax())
            if first_bad is None or row < first_bad[0]:
                first_bad = (row, role, f"null {role} value in column {name!r}")
            values.append([])
            continue
        items = col.to_pylist()
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            items = [_to_label(v) for v in items]
        if any(not v or v.isspace() for v in set(items)):
            row = next(i for i, v in enumerate(items) if not v or v.isspace())
            kind = "empty" if not items[row] else "blank (whitespace-only)"
            if first_bad is None or row < first_bad[0]:
                first_bad = (row, role, f"{kind} {role} value in column {name!r}")
        values.append(items)
    if first_bad is not None:
        row, _, problem = first_bad
        raise DataError(source, f"{problem} (row {row})", line=row + 1)
    return LabeledTriples(values[0], values[1], values[2], list(range(1, table.num_rows + 1)))


def _to_label(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, str):
        return value
    return str(value)


# --------------------------------------------------------------------------------------------
# N-Triples

_IRI_CHARS = r'(?:[^\x00-\x20<>"{}|^`\\]|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})*'
_BNODE = r'_:[^\s<>"().]+(?:\.+[^\s<>"().]+)*'
_LITERAL = r'"(?:[^"\\\n\r]|\\.)*"(?:@[A-Za-z]+(?:-[A-Za-z0-9]+)*|\^\^<' + _IRI_CHARS + r">)?"
_NT_STATEMENT = re.compile(
    r"[ \t]*(?:<(" + _IRI_CHARS + r")>|(" + _BNODE + r"))"
    r"[ \t]*<(" + _IRI_CHARS + r")>"
    r"[ \t]*(?:<(" + _IRI_CHARS + r")>|(" + _BNODE + r")|(" + _LITERAL + r"))"
    r"[ \t]*\.[ \t]*(?:#.*)?"
)
_NT_WS = re.compile(r"[ \t]*")
_NT_IRI = re.compile(r"<" + _IRI_CHARS + r">")
_NT_BNODE = re.compile(_BNODE)
_NT_LITERAL = re.compile(_LITERAL)


def _parse_ntriples(text: str, source: str, keep_literals: bool) -> LabeledTriples:
    heads: list[str] = []
    rels: list[str] = []
    tails: list[str] = []
    nums: list[int] = []
    dropped = 0
    match = _NT_STATEMENT.fullmatch
    for i, line in enumerate(_split_lines(text), 1):
        stripped = line.strip()
        if not stripped or stripped[0] == "#":
            continue
        m = match(line)
        if m is None:
            raise DataError(
                source, f"malformed N-Triples statement: {_nt_problem(line)}", line=i, excerpt=line
            )
        s_iri, s_bnode, pred, o_iri, o_bnode, o_literal = m.groups()
        if o_literal is not None:
            if not keep_literals:
                dropped += 1
                continue
            tail = o_literal
        else:
            tail = o_iri if o_iri is not None else o_bnode
        heads.append(s_iri if s_iri is not None else s_bnode)
        rels.append(pred)
        tails.append(tail)
        nums.append(i)
    return LabeledTriples(heads, rels, tails, nums, literals_dropped=dropped)


def _nt_term(line: str, pos: int, allowed: tuple[str, ...], role: str) -> tuple[int, str | None]:
    """Match one term at ``pos``; return the end position or a problem description."""
    pos = _NT_WS.match(line, pos).end()  # type: ignore[union-attr]
    if pos >= len(line):
        return pos, f"missing {role}"
    ch = line[pos]
    if ch == "<":
        m = _NT_IRI.match(line, pos)
        if m is None:
            if ">" not in line[pos:]:
                return pos, f"unterminated IRI in {role} (missing '>')"
            return pos, f'malformed IRI in {role} (IRIs cannot contain spaces or <>"{{}}|^`\\)'
        return m.end(), None
    if ch == "_" and "bnode" in allowed:
        m = _NT_BNODE.match(line, pos)
        if m is None:
            return pos, f"malformed blank node in {role}"
        return m.end(), None
    if ch == '"':
        if "literal" not in allowed:
            return pos, f"the {role} cannot be a literal"
        m = _NT_LITERAL.match(line, pos)
        if m is None:
            return pos, f"unterminated or malformed literal in {role}"
        end = m.end()
        if end < len(line) and line[end] in "@^":
            return end, f"malformed language tag or datatype in {role}"
        return end, None
    kinds = {"iri": "an IRI <...>", "bnode": "a blank node _:x", "literal": 'a literal "..."'}
    expected = " or ".join(kinds[k] for k in allowed)
    return pos, f"the {role} must be {expected}"


def _nt_problem(line: str) -> str:
    """Why ``line`` is not a valid N-Triples statement (for the error message)."""
    stripped = line.lstrip()
    if stripped.lower().startswith(("@prefix", "@base", "prefix ", "base ")):
        return "this looks like Turtle, not N-Triples (prefixes are not allowed)"
    pos = 0
    for role, allowed in (
        ("subject", ("iri", "bnode")),
        ("predicate", ("iri",)),
        ("object", ("iri", "bnode", "literal")),
    ):
        pos, problem = _nt_term(line, pos, allowed, role)
        if problem is not None:
            return problem
    pos = _NT_WS.match(line, pos).end()  # type: ignore[union-attr]
    if pos >= len(line) or line[pos] == "#":
        return "missing final '.'"
    if line[pos] != ".":
        return "expected '.' after the object (more than three terms?)"
    return "unexpected text after the final '.'"
