"""Parsing triples out of TSV, CSV, Parquet and N-Triples files.

Each format is one registered class (:data:`FORMATS`, the names of ``data.format``); every parser
returns :class:`LabeledTriples` (string labels plus the 1-based source line of each triple) and
reports malformed input as :class:`~kgpipe.errors.DataError` naming the file, the line and an
excerpt of it.
"""

from __future__ import annotations

from kgpipe.data.formats import delimited, ntriples, parquet  # noqa: F401 -- register formats
from kgpipe.data.formats.base import FORMATS, LabeledTriples, ParseOptions, TripleFormat
from kgpipe.data.io import split_compression
from kgpipe.errors import DataError

__all__ = [
    "FORMATS",
    "LabeledTriples",
    "ParseOptions",
    "TripleFormat",
    "detect_format",
    "parse_triples",
]

DEFAULT_FORMAT = "tsv"


def detect_format(url: str, requested: str) -> str:
    """The format of the file at ``url``.

    ``requested`` other than ``"auto"`` is returned as is. ``"auto"`` decides by the extension
    left after stripping a compression suffix (each format lists its extensions); anything
    unknown or none is TSV.
    """
    if requested != "auto":
        if requested not in FORMATS:
            raise DataError(url, f"unknown format {requested!r} (known: {', '.join(FORMATS)})")
        return requested
    base, _ = split_compression(url)
    name = base.rstrip("/").rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    if dot < 0:
        return DEFAULT_FORMAT
    by_extension = {ext: cls.name for cls in FORMATS.classes() for ext in cls.extensions}
    return by_extension.get(name[dot:], DEFAULT_FORMAT)


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

    ``fmt`` names a registered format (see :func:`detect_format`). ``delimiter``, ``header`` and
    ``columns`` apply to tsv/csv (``columns`` also to Parquet); ``literals`` (``"drop"`` or
    ``"keep"``) to N-Triples. ``source`` names the file in error messages.

    Raises :class:`~kgpipe.errors.DataError` on malformed input or when the file holds no
    triples at all.
    """
    if fmt not in FORMATS:
        raise DataError(source, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    options = ParseOptions(delimiter=delimiter, header=header, columns=columns, literals=literals)
    out = FORMATS.get(fmt)().parse(data, source=source, options=options)
    if not out.heads and not out.literals_dropped:
        raise DataError(source, "no triples found (empty file)")
    return out
