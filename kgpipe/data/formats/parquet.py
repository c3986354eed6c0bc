"""Parquet files: three columns of the table (``head, relation, tail`` by default)."""

from __future__ import annotations

from typing import Any

from kgpipe.data.formats.base import FORMATS, LabeledTriples, ParseOptions, TripleFormat
from kgpipe.data.formats.text import ROLES
from kgpipe.errors import DataError

__all__ = ["Parquet", "pick_columns"]

_DEFAULT_COLUMNS = ("head", "relation", "tail")


@FORMATS.register("parquet")
class Parquet(TripleFormat):
    """Apache Parquet with columns ``head, relation, tail`` of strings or integers (dates and
    bytes are made text by Python's rules; floats, decimals and nested values are refused)."""

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
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as err:
        raise DataError(source, f"not a valid Parquet file: {err}") from None
    picked = pick_columns(schema, columns, source)
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
    schema: Any, columns: tuple[str | int, str | int, str | int] | None, source: str
) -> list[str]:
    """The names of the head, relation and tail columns of a file's Arrow ``schema``
    (``data.columns``: a name or an index each; default ``head, relation, tail``);
    :class:`DataError` for a column that is not there, is there twice, or holds values that
    are no labels (floats, nested values)."""
    import pyarrow as pa

    names = list(schema.names)
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
        name = picked[-1]
        if names.count(name) > 1:
            raise DataError(
                source,
                f"{role} column {name!r} appears {names.count(name)} times in the file "
                "(give its columns distinct names)",
            )
        kind = schema.field(name).type
        if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
            raise DataError(
                source,
                f"{role} column {name!r} holds {kind} values: labels are text or integers (a "
                "float column is often integer ids with missing values, as pandas stores them; "
                "write it as integers or strings)",
            )
        if pa.types.is_nested(kind):
            raise DataError(source, f"{role} column {name!r} holds {kind} values, not labels")
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
