"""The mapping between entity/relation labels and the integer ids the model uses.

Ids are assigned deterministically from the *sets* of labels, never from line order: labels seen
in train get ids ``0..k-1`` in sorted order, labels seen only in valid/test (when kept) get the
following ids, also sorted. The same graph therefore always yields the same ids.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kgpipe.data.io import read_bytes
from kgpipe.data.labels import Labels
from kgpipe.errors import DataError, KgpipeError
from kgpipe.storage import RetryPolicy, Store

__all__ = ["WELL_KNOWN_PREFIXES", "Vocabulary", "escape_label", "local_name", "unescape_label"]

_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPE_RE = re.compile(r"\\(.?)", re.DOTALL)
_HINT_CANDIDATES = 20_000
_WRITE_BLOCK = 1 << 16  # labels per write


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


def _index(labels: Sequence[str], kind: str) -> dict[str, int]:
    index = {label: i for i, label in enumerate(labels)}
    if len(index) != len(labels):
        seen: set[str] = set()
        for label in labels:
            if label in seen:
                raise ValueError(f"duplicate {kind} label {label!r} in the vocabulary")
            seen.add(label)

    return index


#: prefixes that a prefixed name (``rdfs:label``) may use without declaring them
WELL_KNOWN_PREFIXES: Mapping[str, str] = {
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "rdfs": "http://www.w3.org/2000/01/rdf-schema#",
    "owl": "http://www.w3.org/2002/07/owl#",
    "xsd": "http://www.w3.org/2001/XMLSchema#",
    "skos": "http://www.w3.org/2004/02/skos/core#",
    "foaf": "http://xmlns.com/foaf/0.1/",
    "dcterms": "http://purl.org/dc/terms/",
}
_SEPARATORS = "/#:"
_PREFIXED = re.compile(r"([A-Za-z][\w.-]*):([^/#:]+)")
_SHOWN = 3
# an unknown label with no close one lists a vocabulary this small (labels, characters)
_LISTED, _LISTED_CHARS = 12, 400


def local_name(label: str) -> str:
    """The part of ``label`` after its last ``/``, ``#`` or ``:`` (the whole label if none):
    ``term6`` of ``http://example.org/ns#term6``."""
    return label[max(label.rfind(c) for c in _SEPARATORS) + 1 :]


def _quoted(labels: Sequence[str], more: int = 0, conj: str = "or") -> str:
    shown = [repr(x) for x in labels]
    text = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} {conj} {shown[-1]}"
    return f"{text} (and {more} more)" if more else text


def _closest(text: str, labels: Sequence[str]) -> list[str]:
    """Up to three labels closest to ``text`` (difflib). A text without ``/`` or ``#`` is compared
    with the labels' local names (an IRI's last segment), anything else with whole labels."""
    by_local = not any(c in text for c in "/#")
    query = local_name(text) if by_local else text
    keyed: dict[str, list[str]] = {}
    for label in labels:
        keyed.setdefault(local_name(label) if by_local else label, []).append(label)
    keys: Iterable[str] = keyed
    if len(keyed) > _HINT_CANDIDATES:  # keep the hint cheap on very large vocabularies
        n, head = len(query), query[:1]
        keys = [x for x in keyed if abs(len(x) - n) <= 2 and x[:1] == head][:_HINT_CANDIDATES]
    close = difflib.get_close_matches(query, list(keys), n=_SHOWN, cutoff=0.6)
    return [label for key in close for label in keyed[key]][:_SHOWN]


def _unknown(kind: str, label: str, labels: Sequence[str], also: str = "") -> KgpipeError:
    close = _closest(label, labels)
    if close:
        hint = f"; did you mean {_quoted(close)}?"
    else:  # nothing close: a short vocabulary is listed whole
        listed = _quoted(list(labels[:_LISTED]), conj="and") if labels else ""
        if len(labels) == 1:
            hint = f"; the graph's only {kind} is {listed}"
        elif len(labels) <= _LISTED and len(listed) <= _LISTED_CHARS:
            kinds = "entities" if kind == "entity" else f"{kind}s"
            hint = f"; the graph's {kinds} are {listed}"
        else:
            hint = ""
    return KgpipeError(f"unknown {kind} {label!r}{also}{hint}")


def _ambiguous(kind: str, text: str, found: Sequence[str]) -> KgpipeError:
    more = len(found) - _SHOWN if len(found) > _SHOWN else 0
    return KgpipeError(
        f"{kind} {text!r} is ambiguous: {len(found)} labels end with it, "
        f"{_quoted(found[:_SHOWN], more, 'and')}; give more of the label"
    )


def _find(
    kind: str,
    text: str,
    labels: Sequence[str],
    index: Mapping[str, int],
    prefixes: Mapping[str, str] | None,
) -> int:
    """The id of the label ``text`` names; see :meth:`Vocabulary.find_entity`."""
    if text in index:
        return index[text]
    bare = text[1:-1] if len(text) > 2 and text[0] == "<" and text[-1] == ">" else text
    if bare in index:
        return index[bare]
    m = _PREFIXED.fullmatch(bare)
    if m is not None:
        prefix, local = m.groups()
        namespace = {**WELL_KNOWN_PREFIXES, **(prefixes or {})}.get(prefix)
        if namespace is not None and namespace + local in index:
            return index[namespace + local]
        if prefixes and prefix in prefixes:  # declared: it means that namespace, no other
            raise _unknown(kind, text, labels, f" (= {prefixes[prefix] + local!r})")
        same = [x for x in labels if len(x) > len(local) and local_name(x) == local]
        found = [x for x in same if local_name(x[: -len(local) - 1]) == prefix]
        if len(found) == 1:
            return index[found[0]]
        if found:
            raise _ambiguous(kind, text, found)
        if namespace is not None:
            raise _unknown(kind, text, labels, f" (= {namespace + local!r})")
        if same:
            named = _quoted(same[:_SHOWN], max(0, len(same) - _SHOWN), "and")
            raise KgpipeError(
                f"unknown prefix {prefix!r} in {kind} {text!r}: declare it with --prefix "
                f"{prefix}=NAMESPACE (N-Triples declare none) or name the label by its end; "
                f"labels named {local!r}: {named}"
            )
    n = len(bare)
    found = [x for x in labels if len(x) > n > 0 and x.endswith(bare) and x[-n - 1] in _SEPARATORS]
    if len(found) == 1:
        return index[found[0]]
    if found:
        raise _ambiguous(kind, text, found)
    raise _unknown(kind, text, labels)


@dataclass(frozen=True)
class Vocabulary:
    """Entity and relation labels; the position of a label is its id.

    The labels are a tuple, or :class:`~kgpipe.data.labels.Labels` (an Arrow array: what the
    columnar reader gives, a fraction of a tuple's memory); any other sequence becomes a tuple.
    """

    entities: Sequence[str]
    relations: Sequence[str]

    def __post_init__(self) -> None:
        for name in ("entities", "relations"):
            labels = getattr(self, name)
            if not isinstance(labels, tuple | Labels):
                object.__setattr__(self, name, tuple(labels))

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

    def find_entity(self, text: str, prefixes: Mapping[str, str] | None = None) -> int:
        """The id of the entity that ``text`` names, for people typing labels.

        In order: the exact label; the label inside ``<...>``; a prefixed name ``p:local`` --
        ``p`` one of ``prefixes`` (``{"ex": "http://example.org/ns#"}``) or of
        :data:`WELL_KNOWN_PREFIXES`, else the last path segment of the label's namespace
        (``ns:term6`` for ``http://example.org/ns#term6``); the one label that ends with ``text``
        right after a ``/``, ``#`` or ``:`` (``term6``, ``ns#term6``). Nothing found, or several,
        raises a one-line :class:`~kgpipe.errors.KgpipeError` naming the closest labels or the
        candidates.
        """
        return _find("entity", text, self.entities, self.entity_index, prefixes)

    def find_relation(self, text: str, prefixes: Mapping[str, str] | None = None) -> int:
        """The id of the relation that ``text`` names; as :meth:`find_entity`."""
        return _find("relation", text, self.relations, self.relation_index, prefixes)

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
            try:
                store.write_produced(name, _label_lines(labels), size=0, checksum=False)
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


def _label_lines(labels: Sequence[str]) -> Callable[[str], None]:
    """A writer of ``id<TAB>label`` lines to a local path, a block of labels at a time (the
    lines of a large vocabulary are never one string)."""

    def produce(path: str) -> None:
        with open(path, "w", encoding="utf-8", newline="") as f:
            for at in range(0, len(labels), _WRITE_BLOCK):
                block = labels[at : at + _WRITE_BLOCK]
                f.write("".join(f"{i}\t{escape_label(x)}\n" for i, x in enumerate(block, at)))

    return produce


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
