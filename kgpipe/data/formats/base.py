"""The file-format interface, the ``FORMATS`` registry, and what every parser returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from kgpipe.registry import Registry

__all__ = ["FORMATS", "LabeledTriples", "ParseOptions", "TripleFormat"]


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
    #: comment lines that hold three non-blank fields (:func:`~.text.comment_triple`)
    comment_triples: int = 0

    def __len__(self) -> int:
        return len(self.heads)


@dataclass(frozen=True)
class ParseOptions:
    """The ``data`` options a parser may use (each format reads the ones that apply to it)."""

    delimiter: str | None = None  # tsv/csv (default: tab / comma)
    header: bool = False  # tsv/csv: the first data line names the columns
    columns: tuple[str | int, str | int, str | int] | None = None  # tsv/csv/parquet
    literals: str = "drop"  # ntriples: drop literal objects or keep them as entities


class TripleFormat(ABC):
    """A file format of triples."""

    name: ClassVar[str]
    #: file-name extensions (lower case, after any compression suffix) that mean this format
    extensions: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def parse(self, data: bytes, *, source: str, options: ParseOptions) -> LabeledTriples:
        """Labelled triples of a whole (decompressed) file; :class:`~kgpipe.errors.DataError`
        naming ``source``, the line and an excerpt on malformed input."""


FORMATS: Registry[TripleFormat] = Registry("format", doc="triple file formats: data.format")
