"""Reading a graph's split files into label ids: the columnar reader for tab-separated and
Parquet files (:mod:`kgpipe.data.columnar`), the line parser for every other format and
option."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kgpipe.config import DataConfig
from kgpipe.data.benchmarks import (
    BENCHMARKS,
    BUNDLED,
    SPLITS,
    canonical_benchmark_name,
    resolve_benchmark,
)
from kgpipe.data.columnar import (
    BatchReader,
    FileScan,
    columnar_ids,
    scan_file,
    sorted_labels,
)
from kgpipe.data.columnar_parquet import parquet_batches, parquet_row
from kgpipe.data.dedup import SpilledIds, close_all, ids_dtype, in_memory_bytes
from kgpipe.data.formats import LabeledTriples, detect_format, parse_triples
from kgpipe.data.formats.header import detect_header, header_mode, without_first
from kgpipe.data.formats.text import comment_warning
from kgpipe.data.io import (
    Fallback,
    read_bytes,
    reading_errors,
    split_compression,
    where_relative,
)
from kgpipe.data.labels import Labels
from kgpipe.data.line_scan import locate_problem, row_line
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import DataError
from kgpipe.storage import RetryPolicy

__all__ = ["Parsed", "Source", "read_splits", "sources"]

_log = logging.getLogger("kgpipe.data")


@dataclass(frozen=True)
class Source:
    split: str
    url: str
    storage_options: dict[str, Any] | None
    benchmark: str | None  # set when the file is a published benchmark split (checksum-verified)


def sources(cfg: DataConfig) -> list[Source]:
    """The split files ``cfg`` names, train first."""
    urls: dict[str, str] = {}
    name: str | None = None
    so: dict[str, Any] | None = cfg.storage_options or None
    out: list[Source] = []
    if cfg.dataset is not None:
        name = canonical_benchmark_name(cfg.dataset)
        urls = resolve_benchmark(name, cfg.root)
        train_url = urls["train"]
        local = "://" not in train_url or train_url.startswith("file://")
        if (
            cfg.root is not None
            and cfg.train is None
            and local
            and not os.path.exists(train_url.removeprefix("file://"))
        ):
            raise DataError(
                train_url,
                f"file not found{where_relative(train_url)}: data.dataset {name} is read from "
                f"data.root ({cfg.root}) as {name}/train.txt, valid.txt and test.txt; kgpipe "
                f"bundles only {', '.join(sorted(BUNDLED))}: get the published split's three "
                "files (their checksums are checked) and set data.root to the folder above "
                f"{name}/",
            )
    for split in SPLITS:
        override: str | None = getattr(cfg, split)
        if override is not None:
            out.append(Source(split, override, so, None))
        elif name is not None:
            # The bundled copies are local package files: no storage options apply to them.
            out.append(Source(split, urls[split], so if cfg.root is not None else None, name))
    return out


@dataclass(frozen=True)
class Parsed:
    """Every split as ids in file order (duplicates included), with what the report needs."""

    #: [n, 3] int64, or int32 from the columnar reader; in a file within ``data.memory_budget``
    rows: dict[str, np.ndarray | SpilledIds]
    lines: dict[str, int]  # triples read (+ literal statements dropped)
    literals_dropped: dict[str, int]
    digests: dict[str, str]
    headers: dict[str, tuple[bool, str]]
    vocab: Vocabulary  # train labels first
    train_entities: int
    train_relations: int
    #: ``(line, excerpt)`` of the ``i``-th triple read from a split, for error messages
    where: Callable[[str, int], tuple[int | None, str | None]]
    reader: str  # "columnar" or "lines"


def read_splits(srcs: list[Source], cfg: DataConfig, retry: RetryPolicy | None) -> Parsed:
    """Read ``srcs`` with the columnar reader where it applies, else with the line parser."""
    if all(_columnar_ok(src, cfg) for src in srcs):
        try:
            return _read_columnar(srcs, cfg, retry)
        except Fallback:
            pass
    if cfg.memory_budget is not None:
        _log.warning(
            "data.memory_budget applies to the columnar reader of tab-separated and Parquet "
            "files; %s is read by the line parser, which holds whole files in memory",
            ", ".join(src.url for src in srcs),
        )
    return _read_lines(srcs, cfg, retry)


def _delimiter(cfg: DataConfig) -> str:
    return cfg.delimiter or "\t"


def _parquet(src: Source, cfg: DataConfig) -> bool:
    return src.benchmark is None and detect_format(src.url, cfg.format) == "parquet"


def _columnar_ok(src: Source, cfg: DataConfig) -> bool:
    if src.benchmark is not None:
        return True
    if _parquet(src, cfg):  # a compressed one cannot be read a row group at a time
        return split_compression(src.url)[1] is None
    delimiter = _delimiter(cfg)
    if len(delimiter.encode()) != 1 or delimiter in "\r\n" or cfg.columns is not None:
        return False
    return detect_format(src.url, cfg.format) == "tsv" and cfg.header is not True


def _check_benchmark(src: Source, digest: str) -> None:
    if src.benchmark is not None:
        expected = BENCHMARKS[src.benchmark][src.split]
        if digest != expected:
            raise DataError(
                src.url,
                f"checksum mismatch: expected {expected}, got {digest} — the file is not the "
                f"published {src.benchmark} {src.split} split",
            )


def _read_columnar(srcs: list[Source], cfg: DataConfig, retry: RetryPolicy | None) -> Parsed:
    block = cfg.read_block_bytes
    scans: dict[str, FileScan] = {}
    blocks: dict[str, int] = {}  # the block each file is read in (larger for a long line)
    by_split = {src.split: src for src in srcs}
    readers = {src.split: _parquet_reader(src, cfg) for src in srcs}
    for src in srcs:
        delimiter = "\t" if src.benchmark else _delimiter(cfg)
        parquet = readers[src.split] is not None
        header: bool | str = False if src.benchmark or parquet else cfg.header
        size = block
        while True:
            try:
                scan = scan_file(
                    src.url,
                    src.storage_options,
                    delimiter=delimiter,
                    header=header,
                    block_size=size,
                    train=scans.get("train"),
                    retry=retry,
                    read=readers[src.split],
                )
                break
            except Fallback:
                if src.benchmark is not None or parquet:
                    raise
                with reading_errors(src.url):  # the line parser's own error, in constant memory
                    longest = locate_problem(src.url, src.storage_options, delimiter)
                if longest < size:
                    raise
                # a line longer than a block, which pyarrow cannot split: read again, in
                # blocks that hold it, not the whole file by the line parser
                size = 2 * longest
        _check_benchmark(src, scan.sha256)
        scans[src.split], blocks[src.split] = scan, size
        if scan.comment_triples:
            _log.warning(comment_warning(src.url, scan.comment_triples))

    train = scans["train"]
    extra_e = [s.entities for k, s in scans.items() if k != "train"]
    extra_r = [s.relations for k, s in scans.items() if k != "train"]
    entities = _ordered(train.entities, extra_e)
    relations = _ordered(train.relations, extra_r)
    budget = cfg.memory_budget_bytes
    dtype = ids_dtype(len(entities), len(relations))

    def spill(scan: FileScan) -> SpilledIds | None:
        """A file for the ids of a split whose deduplication in memory would pass the budget."""
        if budget is None or in_memory_bytes(scan.rows) <= budget:
            return None
        return SpilledIds(scan.url, scan.rows, dtype, cfg.spill_dir)

    rows: dict[str, np.ndarray | SpilledIds] = {}
    spilled: list[SpilledIds] = []
    try:
        for split, scan in scans.items():
            target = spill(scan)
            if target is not None:
                spilled.append(target)
            rows[split] = columnar_ids(
                scan,
                by_split[split].storage_options,
                delimiter="\t" if by_split[split].benchmark else _delimiter(cfg),
                block_size=blocks[split],
                entities=entities,
                relations=relations,
                retry=retry,
                spill=target,
                buffer_bytes=None if budget is None else budget // 4,
                read=readers[split],
            )
    except BaseException:
        close_all(spilled)  # their disk space now, not when the traceback is dropped
        raise
    pa.default_memory_pool().release_unused()  # the blocks' memory, back to the system
    # the entity labels stay in their Arrow array (a tuple of Python strings is ~3x the size)
    vocab = Vocabulary(entities=Labels(entities), relations=tuple(relations.to_pylist()))

    def where(split: str, index: int) -> tuple[int | None, str | None]:
        src = by_split[split]
        delimiter = "\t" if src.benchmark else _delimiter(cfg)
        with reading_errors(src.url):
            if readers[split] is not None:
                return parquet_row(src.url, src.storage_options, cfg.columns, index)
            return row_line(src.url, src.storage_options, delimiter, index, scans[split].header)

    return Parsed(
        rows=rows,
        lines={k: s.rows for k, s in scans.items()},
        literals_dropped={k: 0 for k in scans},
        digests={k: s.sha256 for k, s in scans.items()},
        headers={k: (s.header, _how(cfg, by_split[k], readers[k])) for k, s in scans.items()},
        vocab=vocab,
        train_entities=len(train.entities),
        train_relations=len(train.relations),
        where=where,
        reader="columnar",
    )


def _how(cfg: DataConfig, src: Source, reader: BatchReader | None) -> str:
    """How a file's header row was decided, as :func:`header_mode` says for the line parser."""
    if src.benchmark:
        return "benchmark"
    if reader is not None:
        return "n/a"
    return "auto" if cfg.header == "auto" else "config"


def _parquet_reader(src: Source, cfg: DataConfig) -> BatchReader | None:
    """A Parquet file's batches, ``cfg.read_block_bytes`` / 64 rows at a time (a triple's row
    takes some tens of bytes in the batch); None for a tab-separated file."""
    if not _parquet(src, cfg):
        return None
    rows = max(1 << 12, cfg.read_block_bytes // 64)
    memo: dict[str, Any] = {}  # the file's SHA-256, hashed once for its two reads
    return lambda _c: parquet_batches(src.url, src.storage_options, cfg.columns, rows, memo)


def _ordered(train: pa.Array, extra: list[pa.Array]) -> pa.Array:
    """Train labels sorted, then the others not in train, sorted (:class:`Vocabulary`)."""
    first = sorted_labels(train)
    if not extra:
        return first
    more = pc.unique(pa.chunked_array(extra, type=pa.large_string()))
    if isinstance(more, pa.ChunkedArray):
        more = more.combine_chunks()
    more = pc.filter(more, pc.invert(pc.is_in(more, value_set=first)))
    return pa.concat_arrays([first, sorted_labels(more)])


def _parse(
    src: Source, cfg: DataConfig, retry: RetryPolicy | None
) -> tuple[LabeledTriples, str, bool, str]:
    """The file's triples, its SHA-256, and ``(header, how)`` (see :func:`header_mode`)."""
    data = read_bytes(src.url, src.storage_options, retry=retry)
    digest = hashlib.sha256(data).hexdigest()
    if src.benchmark is not None:
        _check_benchmark(src, digest)
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


def _read_lines(srcs: list[Source], cfg: DataConfig, retry: RetryPolicy | None) -> Parsed:
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
