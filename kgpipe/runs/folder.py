"""The run folder ``{run.root}/{run.name}/``: what it holds, and the record of a staged run.

* ``config.yaml`` -- the resolved config (credentials redacted)
* ``data.json`` -- what was read (per split: source, lines, triples, duplicates, unseen), the
  input fingerprint and the graph's size; written last by staging, so its presence means
  "staged"
* ``vocab/entities.tsv``, ``vocab/relations.tsv`` -- ``id<TAB>label``
* ``data/shards/``, ``data/valid.npy``, ``data/test.npy`` -- staged training shards, split ids
* ``data/candidates/{valid,test}-{head,tail}.npy`` -- per-query candidate ids (``data.candidates``)
* ``checkpoints/epoch-NNNNNN/`` -- committed checkpoints (:mod:`kgpipe.checkpoint`)
* ``lease/`` -- who is writing the run folder (:mod:`kgpipe.runs.lease`)
* ``metrics.jsonl`` -- one JSON object per epoch
* ``model.safetensors`` -- the trained tables (no pickle)
* ``results.json`` -- final test metrics and the evaluation protocol
* ``report.md``, ``curves.png`` -- the end-of-run report and its curve
* ``embeddings/entities.parquet``, ``embeddings/relations.parquet``
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import RunConfig, config_hash
from kgpipe.data.candidates import SIDES, SplitCandidates
from kgpipe.data.shards import MANIFEST, read_manifest, read_shards
from kgpipe.errors import RunError
from kgpipe.models.model import KGEModel
from kgpipe.query_candidates import Candidates, FileCandidates, QueryCandidates
from kgpipe.runs.lease import LEASE, check_handle
from kgpipe.storage import RetryPolicy, Store, join_url

__all__ = [
    "CANDIDATES",
    "CONFIG",
    "DATA",
    "LEASE",
    "METRICS",
    "RESULTS",
    "TEST_IDS",
    "TRIMMED",
    "VALID_IDS",
    "VOCAB",
    "RunFolder",
    "StagedData",
    "load_ids",
    "retry_policy",
    "run_exists_error",
    "run_store",
    "save_candidates",
    "save_ids",
    "staged_candidates",
]

CONFIG = "config.yaml"
DATA = "data.json"
VOCAB = "vocab"
VALID_IDS = "data/valid.npy"
TEST_IDS = "data/test.npy"
CANDIDATES = "data/candidates"
METRICS = "metrics.jsonl"
RESULTS = "results.json"
REPORT = "report.md"
CURVES = "curves.png"
EMBEDDINGS = "embeddings"
#: left by a search in a trial's run folder whose model and checkpoints it removed
TRIMMED = "trimmed.json"


def retry_policy(config: RunConfig) -> RetryPolicy:
    """The storage retries of ``config`` (``fault_tolerance``)."""
    ft = config.fault_tolerance
    return RetryPolicy(retries=ft.storage_retries, backoff_s=ft.storage_backoff_s)


def run_store(config: RunConfig) -> Store:
    """The store of ``config``'s run folder (``run.name`` must be set)."""
    assert config.run.name is not None
    url = join_url(config.run.root, config.run.name)
    return Store(url, config.run.storage_options, retry=retry_policy(config))


def run_exists_error(url: str) -> RunError:
    return RunError(
        f"{url}: a run with this name exists; choose another run.name, pass --resume to "
        "continue it or --overwrite to replace it"
    )


def is_staged(store: Store) -> bool:
    """Staging finished (``data.json`` is written after the shards, valid/test and vocabulary)."""
    return store.exists(DATA) and store.exists(MANIFEST)


def save_ids(store: Store, rel: str, triples: Tensor) -> None:
    buf = io.BytesIO()
    np.save(buf, triples.numpy().astype(np.int64), allow_pickle=False)
    store.write_bytes(rel, buf.getvalue())


def load_ids(store: Store, rel: str) -> Tensor:
    return torch.from_numpy(np.load(io.BytesIO(store.read_bytes(rel)), allow_pickle=False))


def save_candidates(store: Store, split: str, found: SplitCandidates) -> None:
    """Write a split's candidate ids (a file per side, written whole or not at all)."""
    for side in SIDES:
        array = found.head if side == "head" else found.tail

        def produce(path: str, array: np.ndarray = array) -> None:
            with open(path, "wb") as f:  # a name would get ".npy" appended
                np.save(f, array, allow_pickle=False)

        rel = f"{CANDIDATES}/{split}-{side}.npy"
        store.write_produced(rel, produce, size=array.nbytes, checksum=False)


def _load_array(store: Store, rel: str) -> np.ndarray:
    """A staged array: memory-mapped from a local run folder, else downloaded (with retries) to
    a temporary file and read from it (one copy in memory, not the bytes and the array)."""
    if store.local:
        array: np.ndarray = np.load(store.path(rel), mmap_mode="r", allow_pickle=False)
        return array
    with store.local_copy(rel) as path:
        loaded: np.ndarray = np.load(path, allow_pickle=False)
    return loaded


def staged_candidates(store: Store, config: RunConfig, split: str) -> Candidates | None:
    """The candidate sets ``split`` of the run in ``store`` is ranked against: the staged files of
    ``data.candidates`` (memory-mapped where the run folder is local), else drawn as
    ``evaluation.candidates`` says (None: all entities)."""
    given = config.data.candidates
    if given is None or getattr(given, split) is None:
        return QueryCandidates.from_config(config, split)
    head, tail = (_load_array(store, f"{CANDIDATES}/{split}-{s}.npy") for s in SIDES)
    return FileCandidates(split, head, tail, filtered=given.filtered)


@dataclass
class StagedData:
    """The staged triples of a run: all training shards (in shard order), valid and test ids."""

    train: Tensor
    valid: Tensor
    test: Tensor


@dataclass
class RunFolder:
    """A run folder whose data is staged: what every later step needs, small and picklable
    (Prefect tasks pass it between each other; ranks rebuild it from its fields)."""

    url: str
    config: RunConfig
    num_entities: int
    num_relations: int
    num_train: int
    fingerprint: str
    resumed_epoch: int  # the committed epoch training continues from (0: a fresh start)
    lease: str | None = None  # the lease this run's writer holds: NUMBER/TOKEN (:mod:`.lease`)

    @property
    def store(self) -> Store:
        return run_store(self.config)

    @property
    def retry(self) -> RetryPolicy:
        return retry_policy(self.config)

    def new_model(self, rows: torch.Tensor | None = None) -> KGEModel:
        """The run's model as its seed initialises it (on the CPU); with ``rows``, only those
        entity rows (a rank of a sharded gang)."""
        return KGEModel.build(
            self.config.model,
            num_entities=self.num_entities,
            num_relations=self.num_relations,
            seed=self.config.run.seed,
            rows=rows,
        )

    def checkpoints(self, *, fence: Callable[[], None] | None = None) -> CheckpointStore:
        """The run's checkpoints; commits check first that this writer still holds the run
        folder's lease (wherever they happen: this process or rank 0 of a gang), and pass
        ``fence`` (which raises when they may not)."""
        c = self.config.checkpoint
        store = self.store
        checks = [f for f in (fence,) if f is not None]
        if self.lease is not None:
            checks.append(functools.partial(check_handle, store, self.lease))

        def all_checks() -> None:
            for check in checks:
                check()

        return CheckpointStore(
            store,
            keep_last=c.keep_last,
            keep_best=c.keep_best,
            fence=all_checks if checks else None,
        )

    def candidates(self, split: str) -> Candidates | None:
        """The candidate sets of ``split`` (:func:`staged_candidates`)."""
        return staged_candidates(self.store, self.config, split)

    def candidate_shape(self, split: str) -> tuple[int, int] | None:
        """``(rows, k)`` of the staged candidate files of ``split`` (rows as read, before the
        rows of dropped triples went), or None without any."""
        given = self.config.data.candidates
        if given is None or getattr(given, split) is None:
            return None
        read = self.store.read_json(DATA).get("candidates", {}).get(split)
        return None if read is None else (int(read["head"]["rows"]), int(read["head"]["k"]))

    def manifest_meta(self, world_size: int) -> dict[str, Any]:
        """What every checkpoint manifest of this run records besides the state."""
        return {
            "config_hash": config_hash(self.config),
            "data_fingerprint": self.fingerprint,
            "world_size": world_size,
            "sync": self.config.distributed.sync if world_size > 1 else "none",
            "optimizer": self.config.training.optimizer,
            "model": self.config.model.name,
        }

    def staged(self, *, train: bool = True, triples: Tensor | None = None) -> StagedData:
        """The staged triples (``train=False``: only valid and test, an empty train;
        ``triples``: the training triples, already read, such as the machine's shared copy)."""
        store = self.store
        if triples is not None:
            train_all = triples
        elif train:
            manifest = read_manifest(store)
            train_all = read_shards(store, manifest, list(range(manifest.num_shards)))
        else:
            train_all = torch.zeros(0, 3, dtype=torch.long)
        return StagedData(train_all, load_ids(store, VALID_IDS), load_ids(store, TEST_IDS))

    @classmethod
    def read(cls, config: RunConfig, *, resumed_epoch: int = 0) -> RunFolder:
        """The record of the staged run folder of ``config``."""
        store = run_store(config)
        if not is_staged(store):
            raise RunError(f"{store.url}: the run's data is not staged")
        info = store.read_json(DATA)
        return cls(
            store.url,
            config,
            int(info["num_entities"]),
            int(info["num_relations"]),
            int(read_manifest(store).total),
            str(info["fingerprint"]),
            resumed_epoch,
        )
