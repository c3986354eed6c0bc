"""The split files a data config names (:func:`sources`), and what reading them gives
(:class:`Parsed`), for :mod:`kgpipe.data.reading`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kgpipe.config import DataConfig
from kgpipe.data.benchmarks import (
    BENCHMARKS,
    BUNDLED,
    SPLITS,
    canonical_benchmark_name,
    resolve_benchmark,
)
from kgpipe.data.dedup import SpilledIds
from kgpipe.data.io import where_relative
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import DataError

__all__ = ["Parsed", "Source", "check_benchmark", "sources"]


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


def check_benchmark(src: Source, digest: str) -> None:
    if src.benchmark is not None:
        expected = BENCHMARKS[src.benchmark][src.split]
        if digest != expected:
            raise DataError(
                src.url,
                f"checksum mismatch: expected {expected}, got {digest} — the file is not the "
                f"published {src.benchmark} {src.split} split",
            )
