"""Text helpers shared by the line-based parsers: decoding, lines, columns, label checks."""

from __future__ import annotations

from collections.abc import Sequence

from kgpipe.data.formats.base import LabeledTriples
from kgpipe.errors import DataError

__all__ = [
    "ROLES",
    "blank_record",
    "check_labels",
    "comment_triple",
    "comment_warning",
    "decode",
    "describe_delimiter",
    "field_problem",
    "resolve_columns",
    "skipped_line",
    "split_lines",
]

ROLES = ("head", "relation", "tail")


def decode(data: bytes, source: str) -> str:
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


def split_lines(text: str) -> list[str]:
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


def skipped_line(line: str, delimiter: str) -> bool:
    """A comment, or a blank line: whitespace and delimiters only (an empty spreadsheet row)."""
    if not line or line[0] == "#":
        return True
    first = line[0]
    return (first == delimiter or first.isspace()) and not line.replace(delimiter, "").strip()


def blank_record(fields: Sequence[str]) -> bool:
    """A CSV record of empty or whitespace-only fields (``,,`` or ``"",""``): skipped, as a
    blank line is."""
    return all(not field or field.isspace() for field in fields)


def comment_triple(line: str, delimiter: str) -> bool:
    """A comment line (``#`` first) of three non-blank fields: perhaps a triple whose head
    starts with ``#`` (a hashtag, a colour), which TSV and CSV read as a comment."""
    if line[:1] != "#":
        return False
    fields = line.split(delimiter)
    return len(fields) == 3 and all(f.strip() for f in fields)


def comment_warning(source: str, count: int) -> str:
    """The warning for ``count`` lines of :func:`comment_triple` in ``source``."""
    lines = "1 line" if count == 1 else f"{count:,} lines"
    return (
        f"{source}: {lines} starting with '#' hold three fields and were skipped as comments "
        "(a line that starts with '#' is a comment, so a head label cannot start with '#')"
    )


def describe_delimiter(delimiter: str, fmt: str) -> str:
    if delimiter == "\t":
        return "tab-separated"
    if delimiter == ",":
        return "comma-separated"
    if delimiter == ";":
        return "semicolon-separated"
    if delimiter == " ":
        return "space-separated"
    return f"{delimiter!r}-separated" if fmt == "tsv" else f"{delimiter!r}-delimited"


def resolve_columns(
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
    for role, col in zip(ROLES, columns, strict=True):
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


def field_problem(value: str, role: str, *, plain_lines: bool = False) -> str | None:
    """What is wrong with a ``role`` label, or ``None``: empty, whitespace-only, or
    (``plain_lines``: a format without quoting, where no label spans lines) holding a carriage
    return, which makes it another label than the same text elsewhere."""
    if not value:
        return f"empty {role} field"
    if value.isspace():
        return f"blank (whitespace-only) {role} field"
    if plain_lines and "\r" in value:
        return (
            f"a carriage return in the {role} field (lines that end CR CR LF, or a lone CR: "
            "convert the file's line ends to LF or CR LF)"
        )
    return None


def check_labels(
    out: LabeledTriples,
    source: str,
    excerpt_of: Sequence[str] | None,
    *,
    plain_lines: bool = False,
) -> None:
    """Reject the labels :func:`field_problem` finds wrong (looked for among the distinct
    labels: cheap), naming the first line that holds one."""
    first: tuple[int, str] | None = None
    for role, values in zip(ROLES, (out.heads, out.relations, out.tails), strict=True):
        if any(field_problem(v, role, plain_lines=plain_lines) for v in set(values)):
            idx, problem = next(
                (i, p)
                for i, v in enumerate(values)
                if (p := field_problem(v, role, plain_lines=plain_lines))
            )
            if first is None or idx < first[0]:
                first = (idx, problem)
    if first is None:
        return
    idx, problem = first
    line = out.line_numbers[idx]
    excerpt = excerpt_of[line - 1] if excerpt_of is not None else None
    raise DataError(source, problem, line=line, excerpt=excerpt)
