"""Loading a knowledge graph's train/valid/test splits into integer triple tensors."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from kgpipe.config import DataConfig
from kgpipe.data.benchmarks import SPLITS
from kgpipe.data.candidates import SplitCandidates, entity_array, read_candidates
from kgpipe.data.dedup import (
    SpilledIds,
    close_all,
    first_occurrences,
    spilled_first_occurrences,
)
from kgpipe.data.reading import Parsed, Source, read_splits, sources
from kgpipe.data.split import keep_rows, split_record, split_triples
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import DataError
from kgpipe.storage import RetryPolicy

__all__ = ["SplitReport", "TripleDataset", "load_dataset"]


@dataclass(frozen=True)
class SplitReport:
    """What happened while reading one split."""

    #: URL read.
    source: str
    #: Data lines (or Parquet rows) parsed, excluding blank, comment and header lines; includes
    #: statements later dropped, so ``lines = triples + duplicates + literals_dropped``
    #: (``+ unseen`` when ``unseen_action == "drop"``, ``+ split_off`` with ``data.split``).
    lines: int
    #: Triples kept after removing duplicates and handling unseen entities/relations.
    triples: int
    #: Exact duplicate triples removed within this split (the first occurrence is kept).
    duplicates: int
    #: Distinct triples with an entity or relation not in train (always 0 for train).
    unseen: int
    #: ``"keep"``, ``"drop"`` or ``"error"`` for valid/test; ``"n/a"`` for train.
    unseen_action: str
    #: N-Triples statements skipped because their object is a literal.
    literals_dropped: int = 0
    #: SHA-256 (hex) of the file's decompressed content.
    sha256: str = ""
    #: Whether the file's first data line was a header row (skipped).
    header: bool = False
    #: How ``header`` was decided: ``"auto"`` (``data.header: auto``, from the file),
    #: ``"config"`` (``data.header: true/false``), ``"columns"`` (``data.columns`` names
    #: columns: a header is needed), ``"benchmark"`` (named benchmarks have none) or ``"n/a"``
    #: (Parquet, N-Triples).
    header_detected: str = "auto"
    #: Triples of this (train) file moved to valid/test by ``data.split``.
    split_off: int = 0
    #: ``"train"`` when this split's triples were split off the train file by ``data.split``.
    split_from: str = ""


@dataclass(frozen=True, eq=False)
class TripleDataset:
    """A graph's splits as int64 ``[n, 3]`` tensors of ``(head, relation, tail)`` ids."""

    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    vocab: Vocabulary
    reports: dict[str, SplitReport] = field(default_factory=dict)
    #: SHA-256 (hex) over the content of every input file, in split order (and the fractions
    #: and seed of ``data.split``, when set).
    fingerprint: str = ""
    #: What ``data.split`` did (``None`` without it): ``source``, ``seed``, the ``fractions``
    #: and the triples ``requested`` of valid/test, and the ``triples`` of every split.
    split: dict[str, Any] | None = None
    #: per-query candidates of valid/test read from ``data.candidates`` (row ``i``: triple ``i``)
    candidates: dict[str, SplitCandidates] = field(default_factory=dict)

    @property
    def num_entities(self) -> int:
        """Number of entities (train ones plus unseen valid/test ones that were kept)."""
        return self.vocab.num_entities

    @property
    def num_relations(self) -> int:
        """Number of relations."""
        return self.vocab.num_relations

    def summary(self) -> str:
        """A few human-readable lines with the counts of the graph and of each split."""
        out = [
            f"{_count(self.num_entities, 'entity', 'entities')}, "
            f"{_count(self.num_relations, 'relation', 'relations')} "
            f"(fingerprint {self.fingerprint[:12]})"
        ]
        for split in SPLITS:
            rep = self.reports.get(split)
            if rep is None:
                continue
            notes = [f"{rep.duplicates:,} duplicates removed"]
            if rep.unseen_action in ("keep", "drop"):
                verb = "kept" if rep.unseen_action == "keep" else "dropped"
                notes.append(f"{rep.unseen:,} with unseen entities/relations {verb}")
            if rep.literals_dropped:
                notes.append(f"{rep.literals_dropped:,} literal statements dropped")
            if rep.split_off:
                notes.append(f"{rep.split_off:,} moved to valid/test by data.split")
            if rep.split_from and self.split is not None:
                notes = [
                    f"split off {rep.split_from} by data.split: "
                    f"{self.split['fractions'][split]:.1%}, seed {self.split['seed']}"
                ]
            out.append(
                f"{split}: {rep.triples:,} triples ({', '.join(notes)}) from {rep.source}"
                f"{_header_note(rep)}"
            )
        if self.split is not None:
            short = [
                f"{self.split['triples'][k]:,} of {wanted:,} {k}"
                for k, wanted in self.split["requested"].items()
                if self.split["triples"][k] < wanted
            ]
            if short:
                out.append(
                    f"data.split took only {' and '.join(short)} triples: the others would "
                    "have left an entity or relation without a train triple"
                )
        return "\n".join(out)


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _header_note(rep: SplitReport) -> str:
    if rep.split_from:  # said on the line of the file it was split off
        return ""
    if rep.header_detected == "auto":
        detected = "header row detected and skipped" if rep.header else "no header row"
        return f"; {detected} (data.header: auto)"
    if rep.header and rep.header_detected in ("config", "columns"):
        return "; header row skipped"
    return ""


def load_dataset(cfg: DataConfig, *, retry: RetryPolicy | None = None) -> TripleDataset:
    """Read, parse and index the splits described by ``cfg``.

    Splits come from ``cfg.dataset`` (a named benchmark, checksum-verified) and/or the
    ``cfg.train``/``valid``/``test`` URLs (which override the benchmark's files). A CSV/TSV
    file's header row is skipped per ``cfg.header`` (``auto``: see
    :mod:`kgpipe.data.formats.header`). Duplicate triples are removed within each split (first
    occurrence kept, file order preserved); valid/test triples with entities or relations not in
    train are kept, dropped or rejected according to ``cfg.unseen``. ``cfg.split`` then moves
    valid/test triples out of train (:mod:`kgpipe.data.split`). Ids: see
    :class:`~kgpipe.data.vocab.Vocabulary`.

    Raises :class:`~kgpipe.errors.DataError` for unreadable or malformed files, checksum
    mismatches and (with ``unseen="error"``) unseen entities/relations. Reads from object
    stores are retried by ``retry`` (the run's ``fault_tolerance`` storage policy).
    """
    srcs = sources(cfg)
    by_split = {src.split: src for src in srcs}
    parsed = read_splits(srcs, cfg, retry)
    try:
        return _load(cfg, by_split, parsed, retry)
    finally:  # spilled ids a failure left unread
        close_all([ids for ids in parsed.rows.values() if isinstance(ids, SpilledIds)])


def _load(
    cfg: DataConfig, by_split: dict[str, Source], parsed: Parsed, retry: RetryPolicy | None
) -> TripleDataset:
    full = parsed.vocab
    n_train_entities, n_train_relations = parsed.train_entities, parsed.train_relations

    tensors: dict[str, torch.Tensor] = {}
    reports: dict[str, SplitReport] = {}
    kept: dict[str, tuple[np.ndarray, int]] = {}  # rows kept, rows read: for candidates
    for split in list(parsed.rows):
        src = by_split[split]
        ids = parsed.rows.pop(split)  # one split's ids at a time
        read = ids.written if isinstance(ids, SpilledIds) else len(ids)
        rows, first = _deduplicated(ids, full, cfg)
        del ids
        duplicates = read - len(rows)
        unseen = 0
        action = "n/a"
        if split != "train":
            action = cfg.unseen
            mask = (
                (rows[:, 0] >= n_train_entities)
                | (rows[:, 1] >= n_train_relations)
                | (rows[:, 2] >= n_train_entities)
            )
            unseen = int(mask.sum())
            if unseen and action == "error":
                _raise_unseen(src.url, parsed, split, rows, first(), mask, n_train_entities, unseen)
            if unseen and action == "drop":
                rows = rows[~mask]
            if cfg.candidates is not None and getattr(cfg.candidates, split) is not None:
                kept[split] = (first()[~mask] if unseen and action == "drop" else first(), read)
        tensors[split] = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        reports[split] = SplitReport(
            source=src.url,
            lines=parsed.lines[split],
            triples=len(rows),
            duplicates=duplicates,
            unseen=unseen,
            unseen_action=action,
            literals_dropped=parsed.literals_dropped[split],
            sha256=parsed.digests[split],
            header=parsed.headers[split][0],
            header_detected=parsed.headers[split][1],
        )
    split_info = _split(cfg, tensors, reports) if cfg.split is not None else None

    if cfg.unseen == "keep":
        vocab = full
    else:
        vocab = Vocabulary(
            entities=full.entities[:n_train_entities],
            relations=full.relations[:n_train_relations],
        )

    candidates = _candidates(cfg, by_split, parsed, kept, vocab, retry)
    fingerprint = hashlib.sha256()
    for split in parsed.digests:
        fingerprint.update(f"{split}\t{parsed.digests[split]}\n".encode())
    for split, found in candidates.items():  # only where there are: older fingerprints stay
        for side, info in found.sources.items():
            fingerprint.update(f"candidates\t{split}\t{side}\t{info['sha256']}\n".encode())
    if cfg.split is not None:
        fingerprint.update(
            f"split\t{cfg.split.valid}\t{cfg.split.test}\t{cfg.split.seed}\n".encode()
        )

    empty = torch.zeros((0, 3), dtype=torch.int64)
    return TripleDataset(
        train=tensors["train"],
        valid=tensors.get("valid", empty),
        test=tensors.get("test", empty.clone()),
        vocab=vocab,
        reports=reports,
        fingerprint=fingerprint.hexdigest(),
        split=split_info,
        candidates=candidates,
    )


def _candidates(
    cfg: DataConfig,
    by_split: dict[str, Source],
    parsed: Parsed,
    kept: dict[str, tuple[np.ndarray, int]],
    vocab: Vocabulary,
    retry: RetryPolicy | None,
) -> dict[str, SplitCandidates]:
    """The candidates of ``data.candidates``, for the rows each split kept."""
    if cfg.candidates is None:
        return {}
    labels = entity_array(vocab.entities)
    out: dict[str, SplitCandidates] = {}
    for split in ("valid", "test"):
        files = getattr(cfg.candidates, split)
        if files is None:
            continue
        if split not in kept:
            raise DataError(
                files.head, f"candidates for the {split} split, and the run has no {split} file"
            )
        src = by_split[split].url
        if parsed.literals_dropped[split]:
            raise DataError(
                files.head,
                f"candidate rows follow the statements of {src}, and staging dropped "
                f"{parsed.literals_dropped[split]} with a literal object (data.literals: keep)",
            )
        rows, read = kept[split]
        out[split] = read_candidates(
            {"head": files.head, "tail": files.tail},
            cfg.storage_options,
            entities=labels,
            lines=read,
            kept=rows,
            triples_source=src,
            retry=retry,
        )
    return out


def _deduplicated(
    ids: np.ndarray | SpilledIds, vocab: Vocabulary, cfg: DataConfig
) -> tuple[np.ndarray, Callable[[], np.ndarray]]:
    """A split's distinct rows in file order, and a function giving the lines they were on."""
    ne, nr = vocab.num_entities, vocab.num_relations
    if isinstance(ids, SpilledIds):
        assert cfg.memory_budget_bytes is not None
        try:
            rows, kept = spilled_first_occurrences(ids, ne, nr, cfg.memory_budget_bytes)
        finally:
            ids.close()
        return rows, lambda: np.flatnonzero(kept)
    first = first_occurrences(ids, ne, nr)
    return (ids[first] if len(first) < len(ids) else ids), lambda: first


def _split(
    cfg: DataConfig, tensors: dict[str, torch.Tensor], reports: dict[str, SplitReport]
) -> dict[str, Any]:
    """Apply ``data.split`` to the train triples in ``tensors``/``reports`` (in place); what it
    did, for :attr:`TripleDataset.split`."""
    assert cfg.split is not None
    rows = tensors["train"].numpy()
    parts = split_triples(rows, valid=cfg.split.valid, test=cfg.split.test, seed=cfg.split.seed)
    base = reports["train"]
    fractions = {"valid": cfg.split.valid, "test": cfg.split.test}
    for split, fraction in fractions.items():
        if not fraction:
            continue
        index = parts.valid if split == "valid" else parts.test
        tensors[split] = torch.from_numpy(np.ascontiguousarray(rows[index]))
        reports[split] = replace(
            base,
            lines=len(index),
            triples=len(index),
            duplicates=0,
            literals_dropped=0,
            split_from="train",
        )
    # train's rows moved to the front of the array in place (rows[train] copied them all)
    tensors["train"] = torch.from_numpy(keep_rows(rows, parts.in_train))
    moved = len(parts.valid) + len(parts.test)
    reports["train"] = replace(base, triples=parts.train_count, split_off=moved)
    return split_record(parts, base.source, seed=cfg.split.seed, **fractions)


def _raise_unseen(
    url: str,
    parsed: Parsed,
    split: str,
    rows: np.ndarray,
    first: np.ndarray,
    mask: np.ndarray,
    n_train_entities: int,
    count: int,
) -> None:
    vocab = parsed.vocab
    pos = int(np.flatnonzero(mask)[0])
    src_index = int(first[pos])
    h, r, t = (int(x) for x in rows[pos])
    if h >= n_train_entities:
        what = f"entity {vocab.entities[h]!r}"
    elif t >= n_train_entities:
        what = f"entity {vocab.entities[t]!r}"
    else:
        what = f"relation {vocab.relations[r]!r}"
    plural = "triple uses" if count == 1 else "triples use"
    line, excerpt = parsed.where(split, src_index)
    raise DataError(
        url,
        f"{count:,} {plural} an entity or relation not in train (first: {what}); "
        "set data.unseen to 'keep' or 'drop' to accept them",
        line=line,
        excerpt=excerpt,
    )
