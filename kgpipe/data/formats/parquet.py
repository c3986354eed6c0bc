"""Parquet files: three columns of the table (``head, relation, tail`` by default)."""

from __future__ import annotations

from kgpipe.data.formats.base import FORMATS, LabeledTriples, ParseOptions, TripleFormat
from kgpipe.data.formats.text import ROLES
from kgpipe.errors import DataError

__all__ = ["Parquet", "pick_columns"]

_DEFAULT_COLUMNS = ("head", "relation", "tail")


@FORMATS.register("parquet")
class Parquet(TripleFormat):
    """Apache Parquet with string (or other, stringified) columns ``head, relation, tail``."""

    extensions = (".parquet", ".pq")

    def parse(self, data: bytes, *, source: str, options: ParseOptions) -> LabeledTriples:
        return _parse_parquet(data, source, options.columns)


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
    picked = pick_columns(names, columns, source)
    try:
        table = pf.read(columns=list(dict.fromkeys(picked)))
    except (pa.ArrowException, OSError) as err:
        raise DataError(source, f"cannot read Parquet data: {err}") from None

    values: list[list[str]] = []
    first_bad: tuple[int, str, str] | None = None  # (row, role, problem)
    for role, name in zip(ROLES, picked, strict=True):
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


def pick_columns(
    names: list[str], columns: tuple[str | int, str | int, str | int] | None, source: str
) -> list[str]:
    """The names of the head, relation and tail columns among ``names`` (``data.columns``: a
    name or an index each; default ``head, relation, tail``); :class:`DataError` otherwise."""
    wanted = columns if columns is not None else _DEFAULT_COLUMNS
    available = ", ".join(map(repr, names))
    picked: list[str] = []
    for role, col in zip(ROLES, wanted, strict=True):
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
    return picked


def _to_label(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, str):
        return value
    return str(value)
