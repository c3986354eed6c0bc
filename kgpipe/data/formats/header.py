"""``data.header: auto``: does the first data line of a CSV/TSV file name its columns?

The file is parsed without a header first; :func:`detect_header` then looks at its first triple
(the head, relation and tail fields the columns pick). It is a header row when the three values
are distinct, none is a number, each looks like a column name (:data:`COLUMN_NAME`), and either

* all three are common column names (:data:`HEADER_NAMES`, compared after :func:`normalize`),
  or
* none of them occurs anywhere else: the head and tail values as no entity and the relation
  value as no relation of the file's other rows (at least two) nor, for valid/test, of train --
  in a graph whose other relations occur twice or more on average, so that a relation seen
  once means something.

A data line passes neither test unless its entities and its relation all occur nowhere else in
such a graph, which the first line of a real graph file practically never does; a header with
made-up names (``x,y,z``) passes the second.
"""

from __future__ import annotations

import re

from kgpipe.data.formats.base import FORMATS, LabeledTriples
from kgpipe.data.formats.delimited import Csv, Tsv
from kgpipe.errors import DataError

__all__ = [
    "COLUMN_NAME",
    "HEADER_NAMES",
    "detect_header",
    "header_mode",
    "is_column_name",
    "normalize",
    "without_first",
]

#: what a column name looks like: a letter (or ``_``), then letters, digits, ``_ - .`` or spaces
COLUMN_NAME = re.compile(r"[^\W\d][\w .\-]{0,63}")

#: common names of head, relation and tail columns, as :func:`normalize` writes them
HEADER_NAMES = frozenset(
    {
        # heads
        "head", "h", "subject", "subj", "sub", "s", "source", "src", "from", "start",
        "e1", "entity1", "node1", "headentity", "sourceentity",
        # relations
        "relation", "rel", "r", "relationtype", "reltype", "predicate", "pred", "p",
        "relationship", "property", "edge", "edgetype", "type", "label", "link",
        # tails
        "tail", "t", "object", "obj", "o", "target", "tgt", "dst", "dest", "destination",
        "to", "end", "e2", "entity2", "node2", "tailentity", "targetentity",
    }
)  # fmt: skip

_SUFFIXES = ("id", "label", "name")
_NOT_ALNUM = re.compile(r"[\W_]+")


def normalize(value: str) -> str:
    """Lower case, without ``_``/``-``/spaces/punctuation and an ``id``/``label``/``name``
    suffix (``"Subject_ID"`` -> ``"subject"``)."""
    out = _NOT_ALNUM.sub("", value.lower())
    for suffix in _SUFFIXES:
        if len(out) > len(suffix) and out.endswith(suffix):
            return out[: -len(suffix)]
    return out


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


#: what may start a column name: SPARQL result variables (``?s``, ``$s``), Neo4j's ``:TYPE``
_SIGILS = "?$:"


def is_column_name(value: str) -> bool:
    """``value`` could name a column: :data:`COLUMN_NAME` (after a sigil of :data:`_SIGILS`),
    and not a number (``"nan"``)."""
    name = value.strip()
    name = name[1:] if name[:1] in _SIGILS else name
    return COLUMN_NAME.fullmatch(name) is not None and not _is_number(value)


def _occurs(values: list[str], value: str, start: int = 0) -> bool:
    try:
        values.index(value, start)  # a scan in C, no copy of the list
    except ValueError:
        return False
    return True


def _nowhere_else(triples: LabeledTriples, train: LabeledTriples | None) -> bool:
    if len(triples) < 3:  # too few other rows to tell
        return False
    h, r, t = triples.heads[0], triples.relations[0], triples.tails[0]
    if _occurs(triples.relations, r, 1):
        return False
    for x in (h, t):
        if _occurs(triples.heads, x, 1) or _occurs(triples.tails, x, 1):
            return False
    if train is None:  # the train file itself: its other rows are the graph
        rows, relations = len(triples) - 1, len(set(triples.relations)) - 1
    else:
        if _occurs(train.relations, r) or any(
            _occurs(train.heads, x) or _occurs(train.tails, x) for x in (h, t)
        ):
            return False
        rows, relations = len(train), len(set(train.relations))
    return rows >= 2 * relations


def detect_header(triples: LabeledTriples, train: LabeledTriples | None = None) -> bool:
    """Whether the first triple of ``triples`` (a file parsed without a header) is a header row
    (the module's rule); ``train`` is the train split when ``triples`` is a valid/test file."""
    if not triples.heads:
        return False
    first = (triples.heads[0], triples.relations[0], triples.tails[0])
    if len(set(first)) < 3 or not all(map(is_column_name, first)):
        return False
    if all(normalize(x) in HEADER_NAMES for x in first):
        return True
    return _nowhere_else(triples, train)


def header_mode(
    fmt: str, header: bool | str, columns: tuple[str | int, str | int, str | int] | None
) -> tuple[bool, str]:
    """``(header, how)`` of a file of format ``fmt`` before it is read, for ``data.header`` and
    ``data.columns``: how is ``"auto"`` (then :func:`detect_header` decides from the file),
    ``"columns"`` (column names need a header), ``"config"`` or ``"n/a"`` (not CSV/TSV)."""
    if not issubclass(FORMATS.get(fmt), (Csv, Tsv)):
        return False, "n/a"
    if header != "auto":
        return bool(header), "config"
    names = columns is not None and any(isinstance(c, str) and not c.isdigit() for c in columns)
    return (True, "columns") if names else (False, "auto")


def without_first(triples: LabeledTriples, source: str) -> LabeledTriples:
    """``triples`` less its first one (the header row); :class:`~kgpipe.errors.DataError` when
    nothing is left."""
    if len(triples) < 2:
        raise DataError(source, "no triples found (the file has only a header row)")
    return LabeledTriples(
        triples.heads[1:],
        triples.relations[1:],
        triples.tails[1:],
        triples.line_numbers[1:],
        triples.literals_dropped,
    )
