"""Synthetic knowledge graphs with planted structure, for scale tests (``kgpipe synth``).

What is planted, so that link prediction has something to learn:

* ``entities`` entities, each with a popularity rank ``q`` (0 the most popular) and a latent
  cluster ``q mod clusters``; popularity is a power law, the weight of rank ``q`` about
  ``(q + 1) ** -exponent`` (Zipf), so degrees are heavy-tailed. Entity ids are the ranks put
  through a seeded bijection ``(a * q + b) mod entities``: the hubs are spread over the labels.
* ``relations`` relations, drawn by the same power law over their ids (``r0`` the most
  frequent). Each relation maps every head cluster to one tail cluster: a seeded hash of
  (relation, cluster), i.e. a random function, so some relations are many-to-one.
* An edge: a relation, a head by popularity, and with probability ``1 - noise`` a tail from the
  cluster its relation maps the head's cluster to (by popularity within that cluster), otherwise
  a tail by popularity from all entities. A model that learns the clusters and the maps ranks
  the true tail far above the random baseline (filtered MRR about ``H(N) / N``).

Every draw is a closed-form inverse CDF: O(1) per edge, no per-entity table. Memory is
O(``chunk_edges``), whatever the size of the graph.

Determinism: edges are generated in fixed blocks of :data:`BLOCK_EDGES`; block ``b`` draws from
``numpy.random.default_rng(SeedSequence(seed, spawn_key=(0, b)))``, so blocks are independent and
the output depends on the parameters and the seed only, not on ``chunk_edges`` (which only sets
how many edges are written at a time: TSV bytes are identical for every chunk size; a Parquet
file's row groups follow the chunks, its rows do not).

Splits: each edge goes to train, valid or test by a seeded hash of its ``(head, relation,
tail)`` ids (fractions ``valid`` and ``test``), so an edge drawn twice always lands in the same
split: no leakage of duplicates from train into test. Edges are drawn with replacement; ``edges``
counts the rows written, duplicates included (kgpipe removes duplicates when it reads a graph).
A valid/test edge's entity may be missing from train (a low-degree entity); ``data.unseen: drop``
evaluates only the others.

Output: ``train``, ``valid`` and ``test`` files (a fraction of 0 writes none) -- TSV
``head<TAB>relation<TAB>tail`` with labels ``e123`` and ``r4``, no header, or Parquet with
string columns ``head, relation, tail`` -- then ``synth.json`` (the parameters, the rows of each
split) last, as the marker of a complete graph. On a local disk each file is written under a
temporary name (``*.tmp-*``) and renamed into place when complete; on an object store a file
becomes visible only when its upload completes (a failed upload is aborted). An interrupted run
leaves no ``synth.json``, and locally no complete-looking split file.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from kgpipe.errors import ConfigError, DataError
from kgpipe.storage import Store, check_reachable

__all__ = [
    "BLOCK_EDGES",
    "MARKER",
    "OUTPUT_FORMATS",
    "SynthResult",
    "SynthSpec",
    "default_clusters",
    "generate_edges",
    "split_codes",
    "write_synth",
]

#: edges per block of randomness (part of the definition of the output: do not change)
BLOCK_EDGES = 1 << 16
MARKER = "synth.json"
SPLITS = ("train", "valid", "test")
OUTPUT_FORMATS = {"tsv": ".tsv", "parquet": ".parquet"}
_MAX_IDS = 2**31 - 1
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_SCHEMA = pa.schema([("head", pa.string()), ("relation", pa.string()), ("tail", pa.string())])
_TSV = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")


def default_clusters(entities: int) -> int:
    """About ``sqrt(entities)`` clusters, at most 1,000."""
    return max(1, min(1000, round(math.sqrt(entities))))


@dataclass(frozen=True, kw_only=True)
class SynthSpec:
    """What to generate (the module docstring says how). ``clusters=None``: the default
    :func:`default_clusters`. Invalid values raise :class:`~kgpipe.errors.ConfigError`."""

    entities: int
    relations: int
    edges: int
    seed: int = 0
    clusters: int | None = None
    noise: float = 0.1
    exponent: float = 1.1
    valid: float = 0.01
    test: float = 0.01

    def __post_init__(self) -> None:
        for name, top in (("entities", _MAX_IDS), ("relations", _MAX_IDS), ("edges", 2**62)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ConfigError(f"{name} must be an integer from 1 to {top:,}, not {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, not {self.seed!r}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be from 0 to 2**63 - 1, not {self.seed}")
        if self.clusters is not None and (
            isinstance(self.clusters, bool)
            or not isinstance(self.clusters, int)
            or not 1 <= self.clusters <= self.entities
        ):
            raise ConfigError(
                f"clusters must be an integer from 1 to the entities ({self.entities:,}), "
                f"not {self.clusters!r}"
            )
        if not 0.0 <= self.noise <= 1.0:
            raise ConfigError(f"noise must be from 0 to 1, not {self.noise}")
        if not 0.0 <= self.exponent <= 10.0:
            raise ConfigError(f"exponent must be from 0 to 10, not {self.exponent}")
        for name in ("valid", "test"):
            if not 0.0 <= getattr(self, name) < 0.5:
                value = getattr(self, name)
                raise ConfigError(f"{name} must be a fraction from 0 to below 0.5, not {value}")

    @property
    def num_clusters(self) -> int:
        return self.clusters if self.clusters is not None else default_clusters(self.entities)


@dataclass(frozen=True)
class SynthResult:
    """What :func:`write_synth` wrote: the folder, the URL of each split's file (absolute paths
    on a local disk; only the splits with a fraction above 0), the rows of each split, and the
    content of ``synth.json``."""

    url: str
    files: dict[str, str]
    triples: dict[str, int]
    record: dict[str, Any]


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on ``uint64``: a bijection that scatters every input bit."""
    z = z ^ (z >> np.uint64(30))
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _key(seed: int, purpose: int) -> np.uint64:
    sequence = np.random.SeedSequence(seed, spawn_key=(1, purpose))
    return np.uint64(sequence.generate_state(1, np.uint64)[0])


def _power(u: np.ndarray, lo: np.ndarray | float, hi: float, exponent: float) -> np.ndarray:
    """Inverse CDF of the density ``x ** -exponent`` on ``[lo, hi)`` at ``u`` in ``[0, 1)``."""
    if abs(exponent - 1.0) < 1e-9:
        return np.asarray(lo * np.exp(u * np.log(hi / np.asarray(lo, dtype=np.float64))))
    a = 1.0 - exponent
    lo_a = np.asarray(lo, dtype=np.float64) ** a
    return np.asarray((lo_a + u * (hi**a - lo_a)) ** (1.0 / a))


def _ranks(u: np.ndarray, n: int, exponent: float) -> np.ndarray:
    """Ranks in ``[0, n)``, rank ``q`` with probability about ``(q + 1) ** -exponent``."""
    ranks = np.floor(_power(u, 1.0, n + 1.0, exponent)).astype(np.int64) - 1
    return np.clip(ranks, 0, n - 1)  # rounding at the ends of the range


class _Structure:
    """The seeded constants of one graph: the entity bijection and the relation maps' key."""

    def __init__(self, spec: SynthSpec) -> None:
        self.spec = spec
        self.k = spec.num_clusters
        rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(2,)))
        n = spec.entities
        while True:  # a multiplier coprime to n: (a * q + b) mod n is a bijection
            self.a = int(rng.integers(1, n)) if n > 1 else 1
            if math.gcd(self.a, n) == 1:
                break
        self.b = int(rng.integers(0, n))
        self.map_key = _key(spec.seed, 0)

    def tail_cluster(self, relation: np.ndarray, cluster: np.ndarray) -> np.ndarray:
        """The cluster relation ``relation`` maps head cluster ``cluster`` to."""
        z = (relation * self.k + cluster).astype(np.uint64) + self.map_key
        return (_mix(z) % np.uint64(self.k)).astype(np.int64)

    def block(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Head, relation and tail ids (int64) of the edges of block ``b``."""
        spec, k, n = self.spec, self.k, self.spec.entities
        size = min(BLOCK_EDGES, spec.edges - b * BLOCK_EDGES)
        rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(0, b)))
        u = rng.random((4, size))
        relation = _ranks(u[0], spec.relations, spec.exponent)
        head = _ranks(u[1], n, spec.exponent)
        target = self.tail_cluster(relation, head % k)
        noisy = u[2] < spec.noise
        lo = np.where(noisy, 1.0, target + 1.0)
        x = np.maximum(np.floor(_power(u[3], lo, n + 1.0, spec.exponent)), lo)
        in_cluster = target + np.floor((x - lo) / k).astype(np.int64) * k
        tail = np.where(noisy, x.astype(np.int64) - 1, in_cluster)
        last = np.where(noisy, n - 1, target + (n - 1 - target) // k * k)
        tail = np.minimum(tail, last)
        return (self.a * head + self.b) % n, relation, (self.a * tail + self.b) % n


def generate_edges(
    spec: SynthSpec, *, chunk_edges: int = 1 << 20
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The graph's edges as ``(heads, relations, tails)`` int64 id arrays of ``chunk_edges``
    edges each (the last one shorter); the same edges in the same order for every chunk size."""
    if chunk_edges < 1:
        raise ConfigError(f"chunk_edges must be at least 1, not {chunk_edges}")
    structure = _Structure(spec)
    pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    count = 0
    for b in range(-(-spec.edges // BLOCK_EDGES)):
        block = structure.block(b)
        pending.append(block)
        count += len(block[0])
        while count >= chunk_edges:
            joined = [np.concatenate(cols) for cols in zip(*pending, strict=True)]
            yield joined[0][:chunk_edges], joined[1][:chunk_edges], joined[2][:chunk_edges]
            rest = (joined[0][chunk_edges:], joined[1][chunk_edges:], joined[2][chunk_edges:])
            pending, count = [rest], count - chunk_edges
    if count:
        joined = [np.concatenate(cols) for cols in zip(*pending, strict=True)]
        yield joined[0], joined[1], joined[2]


def split_codes(
    heads: np.ndarray, relations: np.ndarray, tails: np.ndarray, spec: SynthSpec
) -> np.ndarray:
    """0 (train), 1 (valid) or 2 (test) per edge: a seeded hash of its ids, in ``[0, 1)``, below
    ``spec.test`` is test, below ``spec.test + spec.valid`` valid. A function of the triple."""
    z = _mix(heads.astype(np.uint64) + _key(spec.seed, 1))
    z = _mix(z ^ relations.astype(np.uint64))
    z = _mix(z ^ tails.astype(np.uint64))
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.where(u < spec.test, 2, np.where(u < spec.test + spec.valid, 1, 0)).astype(np.int8)


def _labels(prefix: str, ids: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(pa.scalar(prefix), pc.cast(pa.array(ids), pa.string()), "")


class _Sink:
    """One output file written in pieces and committed whole (see the module docstring)."""

    def __init__(self, store: Store, name: str, fmt: str) -> None:
        self.path = store.path(name)
        self.tmp: str | None = None
        if store.local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.tmp = f"{self.path}.tmp-{uuid.uuid4().hex}"
            self.file: Any = open(self.tmp, "wb")  # noqa: SIM115 -- closed by commit/abort
        else:
            self.file = store.fs.open(self.path, "wb")
        self.parquet = pq.ParquetWriter(self.file, _SCHEMA) if fmt == "parquet" else None
        self.rows = 0
        self.done = False

    def write(self, heads: np.ndarray, relations: np.ndarray, tails: np.ndarray) -> None:
        columns = [_labels("e", heads), _labels("r", relations), _labels("e", tails)]
        table = pa.Table.from_arrays(columns, schema=_SCHEMA)
        if self.parquet is not None:
            self.parquet.write_table(table)
        else:
            buf = io.BytesIO()
            pcsv.write_csv(table, buf, _TSV)
            self.file.write(buf.getbuffer())
        self.rows += len(heads)

    def commit(self) -> None:
        if self.parquet is not None:
            self.parquet.close()
        if self.tmp is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.path)
        else:
            self.file.close()
        self.done = True

    def abort(self) -> None:
        if self.done:
            return
        self.done = True
        if self.parquet is not None:  # its footer is never written: pyarrow would try when the
            self.parquet.is_open = False  # writer is collected, to the closed file (a traceback)
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                self.file.close()
                os.unlink(self.tmp)
            return
        discard = getattr(self.file, "discard", None)
        if callable(discard):  # s3fs: abort the multipart upload; nothing becomes visible
            with contextlib.suppress(Exception):
                discard()
            self.file.closed = True  # not closed: closing would commit the partial upload


def _absolute(store: Store, name: str) -> str:
    return store.path(name) if store.local else store.url_of(name)


def write_synth(
    spec: SynthSpec,
    out: str,
    *,
    fmt: str = "tsv",
    chunk_edges: int = 1 << 20,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SynthResult:
    """Generate the graph of ``spec`` into the folder ``out`` (a path or any fsspec URL) as
    ``fmt`` (``tsv`` or ``parquet``), ``chunk_edges`` edges at a time, calling
    ``progress(edges done, edges)`` after each chunk.

    A folder that holds ``synth.json`` or split files of either format already is refused
    (:class:`~kgpipe.errors.DataError`) unless ``overwrite``, which removes them first (the
    marker first). Storage errors pass through (the CLI words them)."""
    if fmt not in OUTPUT_FORMATS:
        raise ConfigError(f"format must be one of {', '.join(OUTPUT_FORMATS)}, not {fmt!r}")
    if chunk_edges < 1:
        raise ConfigError(f"chunk_edges must be at least 1, not {chunk_edges}")
    store = Store(out, storage_options)
    if not store.local:
        check_reachable(store.fs, store.url)
    names = {s: f"{s}{OUTPUT_FORMATS[fmt]}" for s in SPLITS}
    owned = [MARKER] + [f"{s}{ext}" for ext in OUTPUT_FORMATS.values() for s in SPLITS]
    existing = [name for name in owned if store.exists(name)]
    if existing and not overwrite:
        held = ", ".join(existing)
        raise DataError(store.url, f"holds {held} already (kgpipe synth --overwrite replaces them)")
    for name in existing:
        store.remove(name)
    wanted = {"train": 1.0, "valid": spec.valid, "test": spec.test}
    sinks: dict[str, _Sink] = {}
    done = 0
    try:
        for split in SPLITS:
            if wanted[split] > 0:
                sinks[split] = _Sink(store, names[split], fmt)
        for heads, relations, tails in generate_edges(spec, chunk_edges=chunk_edges):
            codes = split_codes(heads, relations, tails, spec)
            for code, split in enumerate(SPLITS):
                rows = np.flatnonzero(codes == code)
                if len(rows):
                    sinks[split].write(heads[rows], relations[rows], tails[rows])
            done += len(heads)
            if progress is not None:
                progress(done, spec.edges)
        for sink in sinks.values():
            sink.commit()
    except BaseException:
        for sink in sinks.values():
            sink.abort()
        raise
    triples = {s: sinks[s].rows if s in sinks else 0 for s in SPLITS}
    record: dict[str, Any] = {
        "generator": "kgpipe synth",
        **asdict(spec),
        "clusters": spec.num_clusters,
        "block_edges": BLOCK_EDGES,
        "format": fmt,
        "files": {s: names[s] for s in sinks},
        "triples": triples,
    }
    store.write_json(MARKER, record)
    files = {s: _absolute(store, names[s]) for s in sinks}
    return SynthResult(url=store.url, files=files, triples=triples, record=record)
