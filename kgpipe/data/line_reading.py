"""The line parser's reading of a graph's split files (:mod:`kgpipe.data.formats`): each file
read whole and parsed into a Python string per field, for what the columnar reader of
:mod:`kgpipe.data.reading` does not take."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np

from kgpipe.config import DataConfig
from kgpipe.data.dedup import SpilledIds
from kgpipe.data.formats import LabeledTriples, detect_format, parse_triples
from kgpipe.data.formats.header import detect_header, header_mode, without_first
from kgpipe.data.formats.text import comment_warning
from kgpipe.data.io import read_bytes
from kgpipe.data.sources import Parsed, Source, check_benchmark
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import DataError
from kgpipe.storage import RetryPolicy

__all__ = ["read_lines"]

_log = logging.getLogger("kgpipe.data")


def _parse(
    src: Source, cfg: DataConfig, retry: RetryPolicy | None
) -> tuple[LabeledTriples, str, bool, str]:
    """The file's triples, its SHA-256, and ``(header, how)`` (see :func:`header_mode`)."""
    data = read_bytes(src.url, src.storage_options, retry=retry)
    digest = hashlib.sha256(data).hexdigest()
    if src.benchmark is not None:
        check_benchmark(src, digest)
        # Published benchmarks are plain TSV whatever the options for the user's own files say.
        triples = parse_triples(
            data, source=src.url, fmt="tsv", delimiter=None, header=False, columns=None
        )
        return triples, digest, False, "benchmark"
    fmt = detect_format(src.url, cfg.format)
    header, how = header_mode(fmt, cfg.header, cfg.columns)
    triples = parse_triples(
        data,
        source=src.url,
        fmt=fmt,
        delimiter=cfg.delimiter,
        header=header,
        columns=cfg.columns,
        literals=cfg.literals,
    )
    return triples, digest, header, how


def _ids(labels: list[str], index: dict[str, int] | Any) -> np.ndarray:
    return np.fromiter(map(index.__getitem__, labels), dtype=np.int64, count=len(labels))


def read_lines(srcs: list[Source], cfg: DataConfig, retry: RetryPolicy | None) -> Parsed:
    parsed: dict[str, LabeledTriples] = {}
    digests: dict[str, str] = {}
    headers: dict[str, tuple[bool, str]] = {}
    by_split = {src.split: src for src in srcs}
    for src in srcs:  # train first: header detection in valid/test compares with train
        lt, digests[src.split], header, how = _parse(src, cfg, retry)
        if lt.comment_triples:
            _log.warning(comment_warning(src.url, lt.comment_triples))
        if how == "auto":
            header = detect_header(lt, parsed.get("train"))
            if header:
                lt = without_first(lt, src.url)
        parsed[src.split], headers[src.split] = lt, (header, how)

    train = parsed["train"]
    if not train.heads:
        raise DataError(
            by_split["train"].url,
            f"no triples left: all {train.literals_dropped:,} statements have a literal object "
            "(set data.literals: keep to keep literals as entities)",
        )
    # Provisional ids: train labels sorted, then the labels seen only in valid/test, sorted.
    train_entities = set(train.heads)
    train_entities.update(train.tails)
    train_relations = set(train.relations)
    extra_entities: set[str] = set()
    extra_relations: set[str] = set()
    for split in ("valid", "test"):
        if split in parsed:
            lt = parsed[split]
            extra_entities.update(lt.heads)
            extra_entities.update(lt.tails)
            extra_relations.update(lt.relations)
    full = Vocabulary.from_labels(train_entities, train_relations, extra_entities, extra_relations)
    ent_index, rel_index = full.entity_index, full.relation_index
    rows: dict[str, np.ndarray | SpilledIds] = {
        split: np.stack(
            [_ids(lt.heads, ent_index), _ids(lt.relations, rel_index), _ids(lt.tails, ent_index)],
            axis=1,
        )
        for split, lt in parsed.items()
    }

    def where(split: str, index: int) -> tuple[int | None, str | None]:
        lt = parsed[split]
        excerpt = "\t".join((lt.heads[index], lt.relations[index], lt.tails[index]))
        return lt.line_numbers[index], excerpt

    return Parsed(
        rows=rows,
        lines={k: len(lt) + lt.literals_dropped for k, lt in parsed.items()},
        literals_dropped={k: lt.literals_dropped for k, lt in parsed.items()},
        digests=digests,
        headers=headers,
        vocab=full,
        train_entities=len(train_entities),
        train_relations=len(train_relations),
        where=where,
        reader="lines",
    )
