"""Reading knowledge graphs: files from any fsspec URL, several formats, stable integer ids.

The entry point is :func:`load_dataset`, which turns a :class:`~kgpipe.config.DataConfig` into a
:class:`TripleDataset` (int64 ``[n, 3]`` tensors per split plus the :class:`Vocabulary`).
"""

from __future__ import annotations

from kgpipe.data.benchmarks import BENCHMARKS, BUNDLED, SPLITS, resolve_benchmark
from kgpipe.data.dataset import SplitReport, TripleDataset, load_dataset
from kgpipe.data.formats import FORMATS, LabeledTriples, detect_format, parse_triples
from kgpipe.data.io import read_bytes, split_compression
from kgpipe.data.vocab import Vocabulary

__all__ = [
    "BENCHMARKS",
    "BUNDLED",
    "FORMATS",
    "SPLITS",
    "LabeledTriples",
    "SplitReport",
    "TripleDataset",
    "Vocabulary",
    "detect_format",
    "load_dataset",
    "parse_triples",
    "read_bytes",
    "resolve_benchmark",
    "split_compression",
]
