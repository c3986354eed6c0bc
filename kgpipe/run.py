"""A whole run, in one process: stage data, train, evaluate, export -- into a run folder.

The run folder ``{run.root}/{run.name}/`` is a contract (see README):

* ``config.yaml`` -- the resolved config
* ``data.json`` -- what was read (per split: source, lines, triples, duplicates, unseen) and the
  input fingerprint
* ``vocab/entities.tsv``, ``vocab/relations.tsv`` -- ``id<TAB>label``
* ``metrics.jsonl`` -- one JSON object per epoch
* ``model.safetensors`` -- the trained tables (no pickle)
* ``results.json`` -- final test metrics and the evaluation protocol
* ``embeddings/entities.parquet``, ``embeddings/relations.parquet``
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor

from kgpipe.config import RunConfig, clean_storage_options, config_to_yaml, parse_config
from kgpipe.data import TripleDataset, Vocabulary, load_dataset
from kgpipe.distributed.sharding import read_shards, stage_shards
from kgpipe.errors import RunError
from kgpipe.evaluation import FilterIndex, ProgressFn, evaluate
from kgpipe.export import export_embeddings, load_model, save_model
from kgpipe.models.model import KGEModel
from kgpipe.storage import Store, join_url
from kgpipe.training import Callback, EpochStats, Trainer

__all__ = [
    "LoadedRun",
    "RunResult",
    "evaluate_run",
    "evaluation_protocol",
    "load_run",
    "open_run",
    "train",
]

Log = Callable[[str], None]


@dataclass
class RunResult:
    """What :func:`train` produced."""

    url: str
    config: RunConfig
    history: list[EpochStats]
    results: dict[str, Any] | None
    seconds: float


def evaluation_protocol(config: RunConfig, *, candidates: str = "all") -> dict[str, Any]:
    """The protocol stated next to every metric we write."""
    return {
        "task": "link prediction, both sides (head and tail queries)",
        "ranking": "filtered",
        "filter": ["train", "valid", "test"],
        "candidates": "all entities" if candidates == "all" else candidates,
        "ties": "realistic (mean of optimistic and pessimistic rank)",
        "unseen": config.data.unseen,
        "metrics": ["mrr", "mr", "hits@1", "hits@3", "hits@10"],
    }


class _MetricsWriter(Callback):
    """Rewrites ``metrics.jsonl`` after every epoch (object stores cannot append)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lines: list[str] = []

    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
        self.lines.append(json.dumps(stats.as_dict()))
        self.store.write_text("metrics.jsonl", "\n".join(self.lines) + "\n")


class _Validation(Callback):
    """Filtered validation every ``every`` epochs; adds ``valid_*`` entries to the epoch stats."""

    def __init__(self, valid: Tensor, index: FilterIndex, config: RunConfig) -> None:
        self.valid = valid
        self.index = index
        self.cfg = config.evaluation
        self.total_epochs = config.training.epochs

    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
        every = self.cfg.every
        due = every and (stats.epoch % every == 0 or stats.epoch == self.total_epochs)
        if not due or self.valid.numel() == 0:
            return
        t0 = time.perf_counter()
        m = evaluate(
            trainer.model,
            self.valid,
            self.index,
            batch_size=self.cfg.batch_size,
            sampled=self.cfg.sampled,
        )
        keys = ("mrr", "mr", "hits@1", "hits@3", "hits@10")
        stats.extra.update({f"valid_{k}": m[k] for k in keys})
        stats.extra["valid_candidates"] = m["candidates"]
        stats.extra["valid_seconds"] = time.perf_counter() - t0


def _save_ids(store: Store, rel: str, triples: Tensor) -> None:
    buf = io.BytesIO()
    np.save(buf, triples.numpy().astype(np.int64), allow_pickle=False)
    store.write_bytes(rel, buf.getvalue())


def _load_ids(store: Store, rel: str) -> Tensor:
    return torch.from_numpy(np.load(io.BytesIO(store.read_bytes(rel)), allow_pickle=False))


def staged_validation(store: Store, config: RunConfig, *, train_all: Tensor) -> Callback:
    """The validation callback of a run whose data was staged into ``store``."""
    valid = _load_ids(store, "data/valid.npy")
    test = _load_ids(store, "data/test.npy")
    num_relations = int(store.read_json("data.json")["num_relations"])
    index = FilterIndex.from_triples([train_all, valid, test], num_relations)
    return _Validation(valid, index, config)


def _filter_index(dataset: TripleDataset) -> FilterIndex:
    return FilterIndex.from_triples(
        [dataset.train, dataset.valid, dataset.test], dataset.num_relations
    )


def train(
    config: RunConfig,
    *,
    callbacks: Sequence[Callback] = (),
    overwrite: bool = False,
    log: Log | None = None,
    eval_progress: ProgressFn | None = None,
) -> RunResult:
    """Train, evaluate and export one run in this process; returns where it went and the results.

    Bad input (data, config, an existing run folder without ``overwrite``) raises a
    :class:`~kgpipe.errors.KgpipeError` before anything is written.
    """
    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    config = config.with_run_name()
    assert config.run.name is not None
    url = join_url(config.run.root, config.run.name)
    store = Store(url, config.run.storage_options)
    if store.exists("config.yaml") and not overwrite:
        raise RunError(
            f"{url}: a run with this name exists; choose another run.name or pass --overwrite"
        )
    dataset = load_dataset(config.data)  # every input error surfaces here, before any write
    say(dataset.summary())
    if config.training.threads:
        torch.set_num_threads(config.training.threads)
    if overwrite:
        store.remove()

    store.write_text("config.yaml", config_to_yaml(config))
    store.write_json(
        "data.json",
        {
            "fingerprint": dataset.fingerprint,
            "num_entities": dataset.num_entities,
            "num_relations": dataset.num_relations,
            "splits": {k: vars(v) for k, v in dataset.reports.items()},
        },
    )
    dataset.vocab.write(store.url_of("vocab"), config.run.storage_options)

    # stage: shuffled training shards (any world size can read them), valid/test ids
    manifest = stage_shards(
        dataset.train, store, num_shards=config.distributed.shards, seed=config.run.seed
    )
    _save_ids(store, "data/valid.npy", dataset.valid)
    _save_ids(store, "data/test.npy", dataset.test)
    train_order = read_shards(store, manifest, list(range(manifest.num_shards)))

    model = KGEModel.build(
        config.model,
        num_entities=dataset.num_entities,
        num_relations=dataset.num_relations,
        seed=config.run.seed,
    )
    index = _filter_index(dataset)
    writer = _MetricsWriter(store)
    if config.distributed.uses_dask:
        from kgpipe.distributed.driver import train_on_dask

        say(
            f"training {config.model.name} (dim {config.model.dim}) for "
            f"{config.training.epochs} epochs on {config.distributed.workers} Dask workers "
            f"(sync={config.distributed.sync}) -> {url}"
        )
        gang = train_on_dask(
            config,
            store,
            num_entities=dataset.num_entities,
            num_relations=dataset.num_relations,
            num_train=int(train_order.shape[0]),
            callbacks=[writer, *callbacks],
            log=say,
        )
        model.entity.data.copy_(gang.entity)
        model.relation.data.copy_(gang.relation)
        history = gang.history
    else:
        trainer = Trainer(
            model,
            train_order,
            training=config.training,
            regularizer=config.model.regularizer,
            seed=config.run.seed,
            callbacks=[_Validation(dataset.valid, index, config), writer, *callbacks],
        )
        say(
            f"training {config.model.name} (dim {config.model.dim}) for "
            f"{config.training.epochs} epochs, {trainer.steps_per_epoch} steps each -> {url}"
        )
        history = trainer.fit()
    save_model(model, store)

    results: dict[str, Any] | None = None
    if config.evaluation.test and dataset.test.numel():
        say(f"evaluating on test ({dataset.test.shape[0]} triples, both sides)")
        results = _results(config, model, dataset.test, index, "test", eval_progress)
        store.write_json("results.json", results)
    export_embeddings(
        model, dataset.vocab, store.url_of("embeddings"), storage_options=config.run.storage_options
    )
    return RunResult(url, config, history, results, time.perf_counter() - t_start)


def _results(
    config: RunConfig,
    model: KGEModel,
    triples: Tensor,
    index: FilterIndex,
    split: str,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    m = evaluate(model, triples, index, batch_size=config.evaluation.batch_size, progress=progress)
    seconds = time.perf_counter() - t0
    return {
        "split": split,
        **{k: m[k] for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10")},
        "head": m["head"],
        "tail": m["tail"],
        "triples": m["triples"],
        "protocol": evaluation_protocol(config, candidates=m["candidates"]),
        "model": config.model.name,
        "seconds": seconds,
    }


@dataclass
class LoadedRun:
    """A finished run read back from its folder."""

    url: str
    store: Store
    config: RunConfig
    vocab: Vocabulary
    model: KGEModel


def open_run(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Store, RunConfig]:
    """The store and resolved config of the run folder at ``url``.

    Credentials are never stored in ``config.yaml``: ``storage_options`` given here supply them
    for the run root, the environment (e.g. ``AWS_ACCESS_KEY_ID``) for the data.
    """
    store = Store(url, storage_options)
    if not store.exists("config.yaml"):
        raise RunError(f"{url}: not a kgpipe run folder (no config.yaml)")
    try:
        raw = yaml.safe_load(store.read_text("config.yaml"))
    except yaml.YAMLError as err:
        raise RunError(f"{store.url_of('config.yaml')}: unreadable ({err})") from None
    for section in ("run", "data"):
        opts = clean_storage_options(raw.get(section, {}).get("storage_options", {}))
        if section == "run":
            opts = {**opts, **(storage_options or {})}
        raw.setdefault(section, {})["storage_options"] = opts
    return store, parse_config(raw, source=store.url_of("config.yaml"))


def load_run(url: str, storage_options: dict[str, Any] | None = None) -> LoadedRun:
    """Read a finished run: config, vocabulary and trained model."""
    store, config = open_run(url, storage_options)
    vocab = Vocabulary.read(store.url_of("vocab"), storage_options)
    model = load_model(store)
    return LoadedRun(url, store, config, vocab, model)


def evaluate_run(
    url: str,
    *,
    split: str = "test",
    batch_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Re-read a run's data and evaluate its model on ``split`` (``valid`` or ``test``)."""
    run = load_run(url, storage_options)
    dataset = load_dataset(run.config.data)
    if dataset.vocab != run.vocab:
        raise RunError(
            f"{url}: the data now at the configured paths does not match the run's vocabulary "
            f"(entities {dataset.num_entities} vs {run.vocab.num_entities}); it has changed since "
            "training"
        )
    triples = dataset.valid if split == "valid" else dataset.test
    if triples.numel() == 0:
        raise RunError(f"{url}: the run has no {split} split")
    cfg = run.config
    if batch_size is not None:
        cfg = parse_config(
            {
                **cfg.model_dump(mode="json"),
                "evaluation": {**cfg.evaluation.model_dump(), "batch_size": batch_size},
            }
        )
    return _results(cfg, run.model, triples, _filter_index(dataset), split, progress)
