"""Reading finished runs back: config, vocabulary, model (the final one or a committed
checkpoint's), the staged triples; evaluating them again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import yaml
from torch import Tensor

from kgpipe.checkpoint import Checkpoint, CheckpointStore
from kgpipe.config import RunConfig, clean_storage_options, parse_config
from kgpipe.data.dataset import load_dataset
from kgpipe.data.shards import MANIFEST, read_manifest, read_shards
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import RunError
from kgpipe.evaluation import FilterIndex, ProgressFn
from kgpipe.export import load_model
from kgpipe.model_file import map_checkpoint, map_stored
from kgpipe.models.model import KGEModel, spec_from_config
from kgpipe.query_candidates import QueryCandidates
from kgpipe.runs.finish import best_verified, test_results
from kgpipe.runs.folder import (
    CONFIG,
    DATA,
    TEST_IDS,
    TRIMMED,
    VALID_IDS,
    VOCAB,
    load_ids,
    staged_candidates,
)
from kgpipe.storage import Store, check_reachable

__all__ = [
    "CheckpointChoice",
    "LoadedRun",
    "check_not_trimmed",
    "evaluate_run",
    "final_model",
    "known_triples",
    "load_run",
    "open_run",
    "select_checkpoint",
]

#: which model of a run to read: ``None`` the final ``model.safetensors``, ``"best"`` the
#: committed checkpoint with the best validation MRR, ``"latest"`` the newest committed one, an
#: ``int`` the committed checkpoint of that epoch
CheckpointChoice = Literal["best", "latest"] | int | None


@dataclass
class LoadedRun:
    """A finished run read back from its folder."""

    url: str
    store: Store
    config: RunConfig
    vocab: Vocabulary
    model: KGEModel
    checkpoint: Checkpoint | None = None  # where the model came from, if not model.safetensors


def open_run(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Store, RunConfig]:
    """The store and resolved config of the run folder at ``url``.

    Credentials are never stored in ``config.yaml``: ``storage_options`` given here supply them
    for the run root, the environment (e.g. ``AWS_ACCESS_KEY_ID``) for the data.
    """
    store = Store(url, storage_options)
    check_reachable(store.fs, store.url)  # a dead object store: one line in seconds
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


def check_not_trimmed(store: Store) -> None:
    """Raise :class:`RunError` if ``store`` is a trial whose model its search removed."""
    if store.exists(TRIMMED):
        raise RunError(
            f"{store.url}: a trial its search trimmed (keep_trials: best) -- it keeps its "
            f"config and metrics, not its model; train it again: kgpipe train -c "
            f"{store.url_of(CONFIG)}"
        )


def final_model(store: Store, config: RunConfig) -> KGEModel:
    """The run's trained model (``model.safetensors``; :func:`check_not_trimmed` first); a
    sharded run's table stays in its file (mapped), as it was trained."""
    return map_stored(store) if config.distributed.strategy == "sharded" else load_model(store)


def load_run(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    checkpoint: CheckpointChoice = None,
) -> LoadedRun:
    """Read a finished run: config, vocabulary and trained model -- the final one, or that of a
    committed checkpoint (see :data:`CheckpointChoice`)."""
    store, config = open_run(url, storage_options)
    check_not_trimmed(store)
    if not store.exists(DATA):  # written last by staging
        raise RunError(
            f"{url}: its staging did not finish (the run stopped before it trained): train it "
            "again with the same command"
        )
    vocab = Vocabulary.read(store.url_of(VOCAB), storage_options)
    if checkpoint is None:
        return LoadedRun(url, store, config, vocab, final_model(store, config))
    checkpoints = CheckpointStore(store)
    chosen = select_checkpoint(checkpoints, checkpoint)
    if chosen.manifest.get("strategy") == "sharded":  # never the whole table in memory
        spec = spec_from_config(
            config.model, num_entities=vocab.num_entities, num_relations=vocab.num_relations
        )
        return LoadedRun(
            url, store, config, vocab, map_checkpoint(checkpoints, chosen, spec), chosen
        )
    state = checkpoints.load(chosen)
    model = KGEModel.build(
        config.model,
        num_entities=vocab.num_entities,
        num_relations=vocab.num_relations,
        seed=config.run.seed,
    )
    for name, table in (("entity", model.entity), ("relation", model.relation)):
        found = state.tables.get(name)
        if found is None or found.shape != table.shape:
            shape = "missing" if found is None else tuple(found.shape)
            raise RunError(
                f"{chosen.url}: its {name} table ({shape}) does not fit the run's model "
                f"({tuple(table.shape)})"
            )
        with torch.no_grad():
            table.copy_(found)
    return LoadedRun(url, store, config, vocab, model, chosen)


def select_checkpoint(
    checkpoints: CheckpointStore, which: Literal["best", "latest"] | int
) -> Checkpoint:
    """The committed checkpoint ``which`` names; a :class:`RunError` listing the committed
    epochs if there is none."""
    url = checkpoints.store.url
    committed = checkpoints.committed()
    epochs = ", ".join(str(c.epoch) for c in committed)
    if not committed:
        raise RunError(f"{url}: the run has no committed checkpoint")
    if which == "latest":
        return committed[-1]
    if which == "best":
        best = best_verified(checkpoints)  # a corrupt best gives way to the next (warned)
        if best is None:
            raise RunError(
                f"{url}: no committed checkpoint has a validation MRR (no validation ran: "
                "evaluation.every 0, or no validation data); "
                f"committed epochs: {epochs}"
            )
        return best
    for ckpt in committed:
        if ckpt.epoch == which:
            return ckpt
    raise RunError(f"{url}: no committed checkpoint of epoch {which}; committed epochs: {epochs}")


def known_triples(store: Store) -> list[Tensor]:
    """The staged train, valid and test id triples of the run folder at ``store`` (what a
    filtered ranking calls the known facts)."""
    if not (store.exists(DATA) and store.exists(MANIFEST)):
        raise RunError(f"{store.url}: the run's data is not staged")
    manifest = read_manifest(store)
    train = read_shards(store, manifest, list(range(manifest.num_shards)))
    return [train, load_ids(store, VALID_IDS), load_ids(store, TEST_IDS)]


def evaluate_run(
    url: str,
    *,
    split: str = "test",
    batch_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    checkpoint: CheckpointChoice = None,
    candidates: int | Literal["all"] | None = None,
) -> dict[str, Any]:
    """Evaluate a run's model on ``split`` (``valid`` or ``test``) of the triples it staged:
    the final model, or that of a committed checkpoint (then ``checkpoint_epoch`` says which).
    ``candidates``: ``k`` per-query candidates (the OGB-style protocol) or ``"all"`` entities
    instead of the run's own ``evaluation.candidates`` or ``data.candidates``."""
    if batch_size is not None and batch_size < 1:
        raise RunError(f"batch_size must be a positive number, not {batch_size}")
    if isinstance(candidates, int) and candidates < 1:
        raise RunError(f"candidates must be a positive number or 'all', not {candidates}")
    run = load_run(url, storage_options, checkpoint=checkpoint)
    if run.store.exists(DATA) and run.store.exists(MANIFEST):
        # the triples the run trained and was tested on, wherever the data paths point now
        # (relative ones depend on the working directory; a file may have changed since)
        train, valid, test = (t.long() for t in known_triples(run.store))
    else:  # its staged data removed (a search's trimmed trial): read again, checked
        dataset = load_dataset(run.config.data.model_copy(update={"candidates": None}))
        if dataset.vocab != run.vocab:
            raise RunError(
                f"{url}: the data now at the configured paths does not match the run's "
                f"vocabulary (entities {dataset.num_entities} vs {run.vocab.num_entities}); it "
                "has changed since training"
            )
        train, valid, test = dataset.train, dataset.valid, dataset.test
    triples = valid if split == "valid" else test
    if triples.numel() == 0:
        raise RunError(f"{url}: the run has no {split} split")
    cfg = run.config
    changes: dict[str, Any] = {}
    if batch_size is not None:
        changes["batch_size"] = batch_size
    if isinstance(candidates, int) and (
        problem := QueryCandidates.too_many(candidates, run.vocab.num_entities)
    ):
        raise RunError(f"candidates: {problem} (--candidates all)")
    if candidates is not None:
        changes["candidates"] = None if candidates == "all" else candidates
        changes["sampled"] = None  # validation only; the two exclude each other
    if changes:
        cfg = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update=changes)})
    index = FilterIndex.from_triples([train, valid, test], run.vocab.num_relations)
    if candidates is None:
        chosen = staged_candidates(run.store, cfg, split)
    else:  # drawn (evaluation.candidates: k) or all entities, not the run's files
        chosen = QueryCandidates.from_config(cfg, split)
    results = test_results(cfg, run.model, triples, index, split, progress, candidates=chosen)
    if run.checkpoint is not None:
        results["checkpoint_epoch"] = run.checkpoint.epoch
    return results
