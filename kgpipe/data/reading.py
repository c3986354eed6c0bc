"""Reading a graph's split files into label ids: the columnar reader (:mod:`kgpipe.data.columnar`)
for tab-separated files, CSV files, N-Triples and Parquet files; the line parser
(:mod:`kgpipe.data.line_reading`) for the rest (a CSV file with a quoted field over several
lines or that pyarrow reads otherwise than the ``csv`` module, compressed Parquet, a text file
whose rows vary in field count under ``data.columns``)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kgpipe.config import DataConfig
from kgpipe.data.columnar import (
    BatchReader,
    FileScan,
    columnar_ids,
    retried_read,
    scan_file,
    sorted_labels,
)
from kgpipe.data.columnar_nt import Parsed as NtParsed
from kgpipe.data.columnar_nt import ntriples_batches, ntriples_row
from kgpipe.data.columnar_parquet import parquet_batches, parquet_row
from kgpipe.data.columnar_tsv import Layout, tsv_batches
from kgpipe.data.dedup import SpilledIds, close_all, ids_dtype, in_memory_bytes
from kgpipe.data.formats import detect_format
from kgpipe.data.formats.header import header_mode
from kgpipe.data.formats.text import comment_warning, resolve_columns
from kgpipe.data.io import (
    Fallback,
    reading_errors,
    split_compression,
)
from kgpipe.data.labels import Labels
from kgpipe.data.line_reading import read_lines
from kgpipe.data.line_scan import check_utf8, first_row, locate_problem, row_line
from kgpipe.data.sources import Parsed, Source, check_benchmark, sources
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import DataError
from kgpipe.storage import RetryPolicy

__all__ = ["Parsed", "Source", "read_splits", "sources"]  # the first, second and last: re-exported

_log = logging.getLogger("kgpipe.data")


def read_splits(srcs: list[Source], cfg: DataConfig, retry: RetryPolicy | None) -> Parsed:
    """Read ``srcs`` with the columnar reader where it applies, else with the line parser."""
    if all(_columnar_ok(src, cfg) for src in srcs):
        try:
            return _read_columnar(srcs, cfg, retry)
        except Fallback:
            pass
    if cfg.memory_budget is not None:
        _log.warning(
            "data.memory_budget applies to the columnar reader (tab-separated files, CSV files "
            "whose quoted fields keep to a line, N-Triples, Parquet files); %s is read by the "
            "line parser, which holds whole files in memory",
            ", ".join(src.url for src in srcs),
        )
    return read_lines(srcs, cfg, retry)


def _delimiter(cfg: DataConfig, src: Source) -> str:
    if src.benchmark is not None:
        return "\t"
    return cfg.delimiter or ("," if _format(src, cfg) == "csv" else "\t")


def _format(src: Source, cfg: DataConfig) -> str:
    return "tsv" if src.benchmark is not None else detect_format(src.url, cfg.format)


def _parquet(src: Source, cfg: DataConfig) -> bool:
    return src.benchmark is None and detect_format(src.url, cfg.format) == "parquet"


def _columnar_ok(src: Source, cfg: DataConfig) -> bool:
    if src.benchmark is not None:
        return True
    if _parquet(src, cfg):  # a compressed one cannot be read a row group at a time
        return split_compression(src.url)[1] is None
    delimiter = _delimiter(cfg, src)
    fmt = _format(src, cfg)
    if fmt == "ntriples":
        return True
    if len(delimiter.encode()) != 1 or delimiter in "\r\n\0":  # pyarrow refuses a NUL
        return False
    return fmt == "tsv" or (fmt == "csv" and delimiter != '"')


def _read_columnar(srcs: list[Source], cfg: DataConfig, retry: RetryPolicy | None) -> Parsed:
    warnings: list[str] = []  # said once every split is read, or before an error as the line
    caches: list[NtParsed] = []  # parser does (not when it reads them all again instead)
    try:
        out = _columnar(srcs, cfg, retry, warnings, caches)
    except DataError:
        for warning in warnings:
            _log.warning(warning)
        raise
    finally:
        for cache in caches:  # their disk space now, not when the traceback is dropped
            cache.close()
    for warning in warnings:
        _log.warning(warning)
    return out


def _columnar(
    srcs: list[Source],
    cfg: DataConfig,
    retry: RetryPolicy | None,
    warnings: list[str],
    caches: list[NtParsed],
) -> Parsed:
    block = cfg.read_block_bytes
    scans: dict[str, FileScan] = {}
    by_split = {src.split: src for src in srcs}
    dropped: dict[str, dict[str, int]] = {src.split: {} for src in srcs}  # N-Triples' literals
    readers = {
        src.split: _parquet_reader(src, cfg) or _nt_reader(src, cfg, dropped[src.split], caches)
        for src in srcs
    }
    layouts: dict[str, Layout] = {}
    for src in srcs:
        delimiter = _delimiter(cfg, src)
        parquet = readers[src.split] is not None  # or N-Triples: not read as delimited text
        fmt = _format(src, cfg)
        header: bool | str = False
        if not parquet:
            header, layout = _text_layout(src, cfg, fmt, delimiter, retry)
            layouts[src.split] = layout
        if not parquet:
            readers[src.split] = _text_reader(src, delimiter, block, fmt == "csv", layout)
        try:
            scan = scan_file(
                src.url,
                src.storage_options,
                delimiter=delimiter,
                header=header,
                block_size=block,
                train=scans.get("train"),
                retry=retry,
                read=readers[src.split],
            )
        except Fallback:
            if src.benchmark is not None or parquet:
                raise
            with reading_errors(src.url):  # the line parser's own error, in constant memory
                locate_problem(
                    src.url,
                    src.storage_options,
                    delimiter,
                    fmt=fmt,
                    header=header is True,
                    pick=None if cfg.columns is None else layout.pick,
                )
            raise  # none: the line parser reads it
        check_benchmark(src, scan.sha256)
        scans[src.split] = scan
        if scan.comment_triples:
            warnings.append(comment_warning(src.url, scan.comment_triples))

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
                delimiter=_delimiter(cfg, by_split[split]),
                block_size=block,
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
        delimiter = _delimiter(cfg, src)
        with reading_errors(src.url):
            if _parquet(src, cfg):
                return parquet_row(src.url, src.storage_options, cfg.columns, index)
            if _format(src, cfg) == "ntriples":
                keep = cfg.literals == "keep"
                return ntriples_row(src.url, src.storage_options, keep, index)
            return row_line(
                src.url,
                src.storage_options,
                delimiter,
                index,
                scans[split].header,
                layouts[split].pick,
                quoting=_format(src, cfg) == "csv",
            )

    return Parsed(
        rows=rows,
        lines={k: s.rows + dropped[k].get("dropped", 0) for k, s in scans.items()},
        literals_dropped={k: dropped[k].get("dropped", 0) for k in scans},
        digests={k: s.sha256 for k, s in scans.items()},
        headers={k: (s.header, _how(cfg, by_split[k])) for k, s in scans.items()},
        vocab=vocab,
        train_entities=len(train.entities),
        train_relations=len(train.relations),
        where=where,
        reader="columnar",
    )


def _how(cfg: DataConfig, src: Source) -> str:
    """How a file's header row was decided, as :func:`header_mode` says for the line parser."""
    if src.benchmark:
        return "benchmark"
    return header_mode(_format(src, cfg), cfg.header, cfg.columns)[1]


def _text_layout(
    src: Source, cfg: DataConfig, fmt: str, delimiter: str, retry: RetryPolicy | None
) -> tuple[bool | str, Layout]:
    """A text file's ``data.header`` as the line parser takes it (True, False or ``"auto"``:
    :func:`header_mode`), and its rows' layout: with ``data.columns``, the fields of its first
    row and the three the columns pick (named in the header row, or by index)."""
    if src.benchmark is not None:
        return False, Layout()
    header, how = header_mode(fmt, cfg.header, cfg.columns)
    mode: bool | str = "auto" if how == "auto" else header
    if cfg.columns is None:
        return mode, Layout()
    first = retried_read(
        src.url,
        src.storage_options,
        retry,
        lambda: first_row(src.url, src.storage_options, delimiter, csv=fmt == "csv"),
    )
    with reading_errors(src.url):
        if first is None:  # nothing but comments and blank lines: the line parser says so
            raise Fallback(src.url)
        number, line, fields = first
        names = fields if header else None
        try:
            pick = resolve_columns(
                cfg.columns,
                names,
                source=src.url,
                line=number if header else None,
                excerpt=line if header else None,
            )
        except DataError:
            check_utf8(src.url, src.storage_options)  # the line parser decodes the file first
            raise
    return mode, Layout(len(fields), pick)


def _nt_reader(
    src: Source, cfg: DataConfig, counts: dict[str, int], caches: list[NtParsed]
) -> BatchReader | None:
    """An N-Triples file's statements, a block of ``cfg.read_block_bytes`` at a time; None for
    a file of another format."""
    if _format(src, cfg) != "ntriples":
        return None
    keep = cfg.literals == "keep"
    parsed = NtParsed(cfg.spill_dir)  # the first read's statements, for the second
    caches.append(parsed)
    return lambda _c: ntriples_batches(
        src.url, src.storage_options, keep, cfg.read_block_bytes, counts, parsed
    )


def _parquet_reader(src: Source, cfg: DataConfig) -> BatchReader | None:
    """A Parquet file's batches, ``cfg.read_block_bytes`` / 64 rows at a time (a triple's row
    takes some tens of bytes in the batch); None for a file of another format."""
    if not _parquet(src, cfg):
        return None
    rows = max(1 << 12, cfg.read_block_bytes // 64)
    memo: dict[str, Any] = {}  # the file's SHA-256, hashed once for its two reads
    return lambda _c: parquet_batches(src.url, src.storage_options, cfg.columns, rows, memo)


def _text_reader(
    src: Source, delimiter: str, block_size: int, csv: bool, layout: Layout
) -> BatchReader:
    """A text file's blocks (a CSV file's while pyarrow reads its quoting as the ``csv`` module
    does: :mod:`~kgpipe.data.columnar_tsv`)."""
    return lambda comments: tsv_batches(
        src.url, src.storage_options, delimiter, block_size, comments, csv=csv, layout=layout
    )


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
