"""The mapping between entity/relation labels and the integer ids the model uses.

Ids are assigned deterministically from the *sets* of labels, never from line order: labels seen
in train get ids ``0..k-1`` in sorted order, labels seen only in valid/test (when kept) get the
following ids, also sorted. The same graph therefore always yields the same ids.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kgpipe.data.io import read_bytes
from kgpipe.errors import DataError, KgpipeError
from kgpipe.storage import RetryPolicy, Store

__all__ = ["Vocabulary", "escape_label", "unescape_label"]

_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPE_RE = re.compile(r"\\(.?)", re.DOTALL)
_HINT_CANDIDATES = 20_000


def escape_label(label: str) -> str:
    """Backslash-escape ``\\``, tab, newline and carriage return so a label fits on one line."""
    if "\\" in label:
        label = label.replace("\\", "\\\\")
    if "\t" in label:
        label = label.replace("\t", "\\t")
    if "\n" in label:
        label = label.replace("\n", "\\n")
    if "\r" in label:
        label = label.replace("\r", "\\r")
    return label


def unescape_label(text: str) -> str:
    """Invert :func:`escape_label`; raises ``ValueError`` on an unknown escape sequence."""
    if "\\" not in text:
        return text

    def sub(m: re.Match[str]) -> str:
        try:
            return _ESCAPES[m.group(1)]
        except KeyError:
            raise ValueError(f"invalid escape sequence {m.group(0)!r}") from None

    return _ESCAPE_RE.sub(sub, text)


def _index(labels: tuple[str, ...], kind: str) -> dict[str, int]:
    index = {label: i for i, label in enumerate(labels)}
    if len(index) != len(labels):
        seen: set[str] = set()
        for label in labels:
            if label in seen:
                raise ValueError(f"duplicate {kind} label {label!r} in the vocabulary")
            seen.add(label)

    return index


def _unknown(kind: str, label: str, labels: tuple[str, ...]) -> KgpipeError:
    candidates: Iterable[str] = labels
    if len(labels) > _HINT_CANDIDATES:  # keep the hint cheap on very large vocabularies
        n = len(label)
        head = label[:1]
        candidates = [x for x in labels if abs(len(x) - n) <= 2 and x[:1] == head]
        candidates = candidates[:_HINT_CANDIDATES]
    close = difflib.get_close_matches(label, list(candidates), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return KgpipeError(f"unknown {kind} {label!r}{hint}")


@dataclass(frozen=True)
class Vocabulary:
    """Entity and relation labels; the position of a label is its id."""

    entities: tuple[str, ...]
    relations: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.entities, tuple):
            object.__setattr__(self, "entities", tuple(self.entities))
        if not isinstance(self.relations, tuple):
            object.__setattr__(self, "relations", tuple(self.relations))

    @classmethod
    def from_labels(
        cls,
        train_entities: Iterable[str],
        train_relations: Iterable[str],
        extra_entities: Iterable[str] = (),
        extra_relations: Iterable[str] = (),
    ) -> Vocabulary:
        """Assign ids: train labels sorted first, then the extra labels not in train, sorted.

        Duplicates and order of the inputs do not matter.
        """
        ents = set(train_entities)
        rels = set(train_relations)
        more_ents = set(extra_entities) - ents
        more_rels = set(extra_relations) - rels
        return cls(
            entities=(*sorted(ents), *sorted(more_ents)),
            relations=(*sorted(rels), *sorted(more_rels)),
        )

    @property
    def num_entities(self) -> int:
        """Number of entities."""
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        """Number of relations."""
        return len(self.relations)

    @cached_property
    def entity_index(self) -> Mapping[str, int]:
        """Entity label -> id (built on first use)."""
        return _index(self.entities, "entity")

    @cached_property
    def relation_index(self) -> Mapping[str, int]:
        """Relation label -> id (built on first use)."""
        return _index(self.relations, "relation")

    def entity_id(self, label: str) -> int:
        """The id of an entity; :class:`~kgpipe.errors.KgpipeError` with a hint if unknown."""
        try:
            return self.entity_index[label]
        except KeyError:
            raise _unknown("entity", label, self.entities) from None

    def relation_id(self, label: str) -> int:
        """The id of a relation; :class:`~kgpipe.errors.KgpipeError` with a hint if unknown."""
        try:
            return self.relation_index[label]
        except KeyError:
            raise _unknown("relation", label, self.relations) from None

    def write(
        self,
        dir_url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Write ``entities.tsv`` and ``relations.tsv`` (``id<TAB>label`` lines) to ``dir_url``.

        Labels are backslash-escaped (``\\\\``, ``\\t``, ``\\n``, ``\\r``) so that any label
        round-trips through :meth:`read`. ``dir_url`` is any fsspec URL; it is created if needed.
        Writes go through :class:`~kgpipe.storage.Store` (atomic locally, retried on transient
        object-store faults).
        """
        base = dir_url.rstrip("/") or dir_url
        try:
            store = Store(base, storage_options, retry=retry)
        except (OSError, ValueError, ImportError) as err:
            raise DataError(base, f"cannot create the vocabulary folder: {err}") from None
        for name, labels in (("entities.tsv", self.entities), ("relations.tsv", self.relations)):
            body = "".join(f"{i}\t{escape_label(label)}\n" for i, label in enumerate(labels))
            try:
                store.write_text(name, body)
            except OSError as err:
                raise DataError(store.url_of(name), f"cannot write: {err}") from None

    @classmethod
    def read(
        cls,
        dir_url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> Vocabulary:
        """Read a vocabulary written by :meth:`write`.

        Ids must be ``0..n-1`` in order and labels unique; anything else raises
        :class:`~kgpipe.errors.DataError` naming the file and line.
        """
        base = dir_url.rstrip("/") or dir_url
        return cls(
            entities=_read_labels(f"{base}/entities.tsv", storage_options, retry),
            relations=_read_labels(f"{base}/relations.tsv", storage_options, retry),
        )


def _read_labels(
    url: str, storage_options: dict[str, Any] | None, retry: RetryPolicy | None
) -> tuple[str, ...]:
    data = read_bytes(url, storage_options, retry=retry)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad_line = data.count(b"\n", 0, err.start) + 1
        raise DataError(url, "not valid UTF-8", line=bad_line) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    labels: list[str] = []
    seen: dict[str, int] = {}
    for i, line in enumerate(lines):
        id_text, tab, escaped = line.partition("\t")
        if not tab:
            raise DataError(url, "expected 'id<TAB>label'", line=i + 1, excerpt=line)
        try:
            found = int(id_text)
        except ValueError:
            raise DataError(
                url, f"id {id_text!r} is not an integer", line=i + 1, excerpt=line
            ) from None
        if found != i:
            raise DataError(
                url,
                f"ids must be 0..n-1 in order: expected {i}, found {found}",
                line=i + 1,
                excerpt=line,
            )
        try:
            label = unescape_label(escaped)
        except ValueError as err:
            raise DataError(url, str(err), line=i + 1, excerpt=line) from None
        if label in seen:
            raise DataError(
                url, f"duplicate label {label!r} (also id {seen[label]})", line=i + 1, excerpt=line
            )
        seen[label] = i
        labels.append(label)
    return tuple(labels)
