"""Reading finished runs back: config, vocabulary, model; evaluating them again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from kgpipe.config import RunConfig, clean_storage_options, parse_config
from kgpipe.data.dataset import load_dataset
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import RunError
from kgpipe.evaluation import FilterIndex, ProgressFn
from kgpipe.export import load_model
from kgpipe.models.model import KGEModel
from kgpipe.runs.finish import test_results
from kgpipe.runs.folder import CONFIG, VOCAB
from kgpipe.storage import Store

__all__ = ["LoadedRun", "evaluate_run", "load_run", "open_run"]


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
    if not store.exists(CONFIG):
        raise RunError(f"{url}: not a kgpipe run folder (no config.yaml)")
    try:
        raw = yaml.safe_load(store.read_text(CONFIG))
    except yaml.YAMLError as err:
        raise RunError(f"{store.url_of(CONFIG)}: unreadable ({err})") from None
    for section in ("run", "data"):
        opts = clean_storage_options(raw.get(section, {}).get("storage_options", {}))
        if section == "run":
            opts = {**opts, **(storage_options or {})}
        raw.setdefault(section, {})["storage_options"] = opts
    return store, parse_config(raw, source=store.url_of(CONFIG))


def load_run(url: str, storage_options: dict[str, Any] | None = None) -> LoadedRun:
    """Read a finished run: config, vocabulary and trained model."""
    store, config = open_run(url, storage_options)
    vocab = Vocabulary.read(store.url_of(VOCAB), storage_options)
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
        cfg = cfg.model_copy(
            update={"evaluation": cfg.evaluation.model_copy(update={"batch_size": batch_size})}
        )
    index = FilterIndex.from_triples(
        [dataset.train, dataset.valid, dataset.test], dataset.num_relations
    )
    return test_results(cfg, run.model, triples, index, split, progress)
