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

import contextlib
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

from kgpipe.checkpoint import Checkpoint, CheckpointStore, TrainState
from kgpipe.config import (
    RESUMABLE_CHANGES,
    RunConfig,
    clean_storage_options,
    config_hash,
    config_to_yaml,
    parse_config,
)
from kgpipe.data import TripleDataset, Vocabulary, load_dataset
from kgpipe.devices import resolve_device, retain_freed_memory
from kgpipe.distributed.sharding import read_manifest, read_shards, stage_shards
from kgpipe.errors import ConfigError, RunError
from kgpipe.evaluation import FilterIndex, ProgressFn, evaluate
from kgpipe.export import export_embeddings, load_model, save_model
from kgpipe.models.model import KGEModel
from kgpipe.storage import RetryPolicy, Store, join_url
from kgpipe.training import Callback, EpochStats, Trainer
from kgpipe.training.checkpointing import CheckpointCallback

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

    def reset(self, history: Sequence[EpochStats | dict[str, Any]]) -> None:
        """Start again from a checkpoint's history (epochs after it are trained again)."""
        self.lines = [json.dumps(h.as_dict() if isinstance(h, EpochStats) else h) for h in history]

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


def retry_policy(config: RunConfig) -> RetryPolicy:
    ft = config.fault_tolerance
    return RetryPolicy(retries=ft.storage_retries, backoff_s=ft.storage_backoff_s)


def run_store(config: RunConfig) -> Store:
    """The store of ``config``'s run folder (``run.name`` must be set)."""
    assert config.run.name is not None
    url = join_url(config.run.root, config.run.name)
    return Store(url, config.run.storage_options, retry=retry_policy(config))


@dataclass
class StagedRun:
    """A run folder whose data is staged: what every later step needs, small and picklable."""

    url: str
    config: RunConfig
    num_entities: int
    num_relations: int
    num_train: int
    fingerprint: str
    resumed_epoch: int  # the committed epoch training continues from (0: a fresh start)

    @property
    def store(self) -> Store:
        return run_store(self.config)

    def checkpoints(self) -> CheckpointStore:
        c = self.config.checkpoint
        return CheckpointStore(self.store, keep_last=c.keep_last, keep_best=c.keep_best)

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


def _staged(store: Store) -> bool:
    """Staging finished (``data.json`` is written after the shards, valid/test and vocabulary)."""
    return store.exists("data.json") and store.exists("data/shards/manifest.json")


def prepare_run(
    config: RunConfig,
    *,
    overwrite: bool = False,
    resume: bool = False,
    warm_start: str | None = None,
    log: Log | None = None,
) -> StagedRun:
    """Create the run folder and stage the data, or (``resume``) reuse a run folder's staged data
    and continue from its latest committed checkpoint.

    ``warm_start`` (a previous run folder's URL) commits an epoch-0 checkpoint whose tables come
    from that run's model, matched by label (see :mod:`kgpipe.warmstart`).

    Bad input raises a :class:`~kgpipe.errors.KgpipeError` before anything is written.
    """
    say = log or (lambda _msg: None)
    config = config.with_run_name()
    store = run_store(config)
    exists = store.exists("config.yaml")
    if exists and resume:
        extended_from = _check_resumable(store, config)
        if extended_from is not None:
            say(f"extending {store.url} from {extended_from} to {config.training.epochs} epochs")
            store.write_text("config.yaml", config_to_yaml(config))
        if _staged(store):
            info = store.read_json("data.json")
            run = StagedRun(
                store.url,
                config,
                int(info["num_entities"]),
                int(info["num_relations"]),
                int(read_manifest(store).total),
                str(info["fingerprint"]),
                0,
            )
            found = run.checkpoints().latest()
            run.resumed_epoch = found[0].epoch if found else 0
            say(
                f"resuming {store.url} from the checkpoint of epoch {run.resumed_epoch}"
                if found
                else f"resuming {store.url}: staged data found, no committed checkpoint yet"
            )
            return run
        say(f"{store.url}: staging had not finished; staging again")
    elif exists and not overwrite:
        raise run_exists_error(store.url)
    dataset = load_dataset(config.data)  # every input error surfaces here, before any write
    say(dataset.summary())
    if config.training.schedule == "plateau" and dataset.valid.numel() == 0:
        raise ConfigError(
            f"training.schedule=plateau needs validation triples, and the valid split "
            f"({config.data.valid or config.data.dataset}) has none"
        )
    if exists:
        store.remove()

    store.write_text("config.yaml", config_to_yaml(config))
    dataset.vocab.write(store.url_of("vocab"), config.run.storage_options)
    # stage: shuffled training shards (any world size can read them), valid/test ids
    manifest = stage_shards(
        dataset.train, store, num_shards=config.distributed.shards, seed=config.run.seed
    )
    _save_ids(store, "data/valid.npy", dataset.valid)
    _save_ids(store, "data/test.npy", dataset.test)
    store.write_json(
        "data.json",
        {
            "fingerprint": dataset.fingerprint,
            "num_entities": dataset.num_entities,
            "num_relations": dataset.num_relations,
            "splits": {k: vars(v) for k, v in dataset.reports.items()},
        },
    )
    run = StagedRun(
        store.url,
        config,
        dataset.num_entities,
        dataset.num_relations,
        manifest.total,
        dataset.fingerprint,
        0,
    )
    if warm_start is not None:
        summary = _warm_start(run, dataset.vocab, warm_start)
        say(f"warm start from {warm_start}: {summary}")
    return run


def _warm_start(run: StagedRun, vocab: Vocabulary, source: str) -> dict[str, int]:
    from kgpipe.training.optim import build_optimizer
    from kgpipe.warmstart import warm_start_tables

    previous = load_run(source, run.config.run.storage_options)
    cfg = run.config
    model = KGEModel.build(
        cfg.model,
        num_entities=run.num_entities,
        num_relations=run.num_relations,
        seed=cfg.run.seed,
    )
    try:
        ws = warm_start_tables(
            previous.vocab,
            previous.model.entity.data,
            previous.model.relation.data,
            vocab,
            model.entity.data,
            model.relation.data,
        )
    except ValueError as err:
        raise RunError(f"{source}: {err}") from None
    tables = {"entity": ws.entity, "relation": ws.relation}
    t = cfg.training
    optimizer = build_optimizer(t.optimizer, tables, lr=t.lr, betas=t.betas, eps=t.eps)
    state = TrainState(0, 0, tables, optimizer.state_dict(), [], torch.get_rng_state())
    meta = {**run.manifest_meta(1), "warm_start": {"source": source, **ws.summary()}}
    run.checkpoints().save(state, meta)
    return ws.summary()


def run_exists_error(url: str) -> RunError:
    return RunError(
        f"{url}: a run with this name exists; choose another run.name, pass --resume to "
        "continue it or --overwrite to replace it"
    )


def _check_resumable(store: Store, config: RunConfig) -> int | None:
    """Refuse to resume with a config that trains something else. Returns the stored epoch
    count when the only change is ``training.epochs`` under a constant or plateau learning-rate
    schedule: every epoch then trains the same whatever the total, so the run may go on to more
    epochs (or stop earlier) and end as a fresh run with the new count would."""
    _, stored = open_run(store.url, config.run.storage_options)
    old, new = stored.training, config.training
    if old.epochs != new.epochs and old.schedule == new.schedule in ("constant", "plateau"):
        same_length = config.model_copy(
            update={"training": new.model_copy(update={"epochs": old.epochs})}
        )
        if config_hash(same_length) == config_hash(stored):
            _check_extension(store, config, old.epochs)
            return old.epochs
    if config_hash(stored) != config_hash(config):
        a, b = stored.model_dump(mode="json"), config.model_dump(mode="json")
        for d in (a, b):
            d["run"] = {"seed": d["run"]["seed"]}
            d["data"].pop("storage_options")
        differ = [k for k in ("run", "data", "model", "training") if a[k] != b[k]]
        if not differ and a["evaluation"] != b["evaluation"]:
            differ = ["evaluation.every or .sampled (validations drive schedule=plateau)"]
        raise RunError(
            f"{store.url}: cannot resume: the config differs from the run's config.yaml in "
            f"{', '.join(differ) or 'the seed'} (only {', '.join(RESUMABLE_CHANGES)} may change "
            "-- evaluation.every and .sampled not under training.schedule=plateau -- and "
            "training.epochs under a constant or plateau learning-rate schedule)"
        )
    return None


def _check_extension(store: Store, config: RunConfig, old_epochs: int) -> None:
    """Refuse to change ``training.epochs`` of a run that validated at its last epoch off the
    ``evaluation.every`` grid (a run ends with a validation) when validations steer training:
    a run started with the new count would not have made it, and under the plateau schedule it
    changes the learning rate, under early stopping when the run stops."""
    every = config.evaluation.every
    if not every or not (config.training.schedule == "plateau" or config.evaluation.patience):
        return
    committed = CheckpointStore(store).committed()
    history = committed[-1].manifest["history"] if committed else []
    off_grid = [h["epoch"] for h in history if "valid_mrr" in h and h["epoch"] % every]
    if off_grid:
        steer = (
            "training.schedule=plateau"
            if config.training.schedule == "plateau"
            else "early stopping"
        )
        raise RunError(
            f"{store.url}: cannot change training.epochs from {old_epochs} to "
            f"{config.training.epochs}: the run validated at epoch {off_grid[0]}, off the "
            f"evaluation.every={every} grid (its last epoch), and under {steer} that validation "
            "changes how the run goes on; start a new run with the new count"
        )


def load_staged(store: Store) -> tuple[Tensor, Tensor, Tensor]:
    """All staged training triples (shard order), valid and test ids."""
    manifest = read_manifest(store)
    train_all = read_shards(store, manifest, list(range(manifest.num_shards)))
    return train_all, _load_ids(store, "data/valid.npy"), _load_ids(store, "data/test.npy")


@dataclass
class SegmentResult:
    """Where training stands after :meth:`Session.train_until` (small; no tensors)."""

    epoch: int
    checkpoint: str
    history: list[dict[str, Any]]
    restarts: int


class Session:
    """Trains a staged run segment by segment, committing a checkpoint at every segment end.

    In-process runs keep their trainer between segments; Dask runs launch a gang per segment
    from the last committed checkpoint, relaunching it after failures (see
    :func:`kgpipe.distributed.driver.train_on_dask`).
    """

    def __init__(
        self,
        run: StagedRun,
        *,
        callbacks: Sequence[Callback] = (),
        client: Any = None,
        log: Log | None = None,
        restarts: int = 0,
    ) -> None:
        self.run = run
        self.callbacks = list(callbacks)
        self.client = client
        self.say = log or (lambda _msg: None)
        self.restarts = restarts  # gang relaunches of this run so far
        self.checkpoints = run.checkpoints()
        self.writer = _MetricsWriter(run.store)
        self._trainer: Trainer | None = None
        self._ckpt_cb: CheckpointCallback | None = None
        self._staged: tuple[Tensor, Tensor, Tensor] | None = None

    def _latest(self) -> tuple[Checkpoint, TrainState] | None:
        return self.checkpoints.resume_point()

    def train_until(self, until: int) -> SegmentResult:
        """Train from the latest committed checkpoint to epoch ``until`` (committed)."""
        config = self.run.config
        if config.distributed.uses_dask:
            from kgpipe.distributed.driver import train_on_dask

            outcome = train_on_dask(
                self.run,
                until=until,
                client=self.client,
                callbacks=[self.writer, *self.callbacks],
                log=self.say,
                restarts_so_far=self.restarts,
            )
            self.restarts = outcome.restarts
        else:
            self._train_in_process(until)
        committed = self.checkpoints.committed()  # manifests only: no re-download of the state
        if not committed or committed[-1].epoch != until:
            raise RunError(f"{self.run.url}: training to epoch {until} left no checkpoint of it")
        ckpt = committed[-1]
        return SegmentResult(until, ckpt.url, list(ckpt.manifest["history"]), self.restarts)

    def _train_in_process(self, until: int) -> None:
        config = self.run.config
        trainer = self._trainer
        committed = self.checkpoints.committed() if trainer is not None else []
        if trainer is None or not committed or committed[-1].epoch != trainer.epoch:
            latest = self._latest()
            trainer = self._build_trainer(latest[1] if latest else None)
        assert self._ckpt_cb is not None
        self._ckpt_cb.until = until
        if trainer.epoch >= until:
            return
        self.say(
            f"training {config.model.name} (dim {config.model.dim}, "
            f"{'bf16' if trainer.bf16 else 'fp32'} scores) epochs "
            f"{trainer.epoch + 1}..{until} of {config.training.epochs}, "
            f"{trainer.steps_per_epoch} steps each -> {self.run.url}"
        )
        try:
            trainer.fit(until=until)
        except BaseException:
            self.close()
            raise

    def _build_trainer(self, state: TrainState | None) -> Trainer:
        config, run = self.run.config, self.run
        if self._staged is None:
            self._staged = load_staged(run.store)
        train_all, valid, test = self._staged
        self.close()
        if config.training.threads:
            torch.set_num_threads(config.training.threads)
        if config.training.allocator == "retain":
            retain_freed_memory()
        model = KGEModel.build(
            config.model,
            num_entities=run.num_entities,
            num_relations=run.num_relations,
            seed=config.run.seed,
        ).to(resolve_device(config.training.device))
        index = FilterIndex.from_triples([train_all, valid, test], run.num_relations)
        self._ckpt_cb = CheckpointCallback(
            self.checkpoints,
            every=config.checkpoint.every,
            until=config.training.epochs,
            meta=run.manifest_meta(1),
            background=config.checkpoint.background,
        )
        trainer = Trainer(
            model,
            train_all,
            training=config.training,
            regularizer=config.model.regularizer,
            dropout=config.model.dropout,
            seed=config.run.seed,
            callbacks=[
                _Validation(valid, index, config),
                self._ckpt_cb,
                self.writer,
                *self.callbacks,
            ],
        )
        if state is not None:
            trainer.load_state(state)
        self.writer.reset(trainer.history)
        self._trainer = trainer
        return trainer

    def close(self) -> None:
        """Finish a pending background checkpoint upload and release its thread."""
        if self._ckpt_cb is not None:
            cb, self._ckpt_cb = self._ckpt_cb, None
            self._trainer = None
            cb.close()


def committed_history(run: StagedRun) -> list[dict[str, Any]]:
    """The epoch history in the newest checkpoint manifest (empty when there is none); reads
    manifests only -- training verifies the state it resumes from."""
    committed = run.checkpoints().committed()
    return list(committed[-1].manifest["history"]) if committed else []


def should_stop(history: Sequence[dict[str, Any]], patience: int | None) -> bool:
    """Early stopping: the last ``patience`` validations brought no better valid MRR."""
    if not patience:
        return False
    scores = [float(h["valid_mrr"]) for h in history if "valid_mrr" in h]
    if len(scores) <= patience:
        return False
    return max(scores[-patience:]) <= max(scores[:-patience])


def segment_ends(start: int, config: RunConfig) -> list[int]:
    """The epochs after ``start`` at which a segment ends: validation epochs and the last."""
    every = config.evaluation.every
    last = config.training.epochs
    ends = [e for e in range(start + 1, last + 1) if every and e % every == 0]
    if start < last and (not ends or ends[-1] != last):
        ends.append(last)
    return ends


def finish_run(
    run: StagedRun,
    *,
    history: Sequence[dict[str, Any]],
    restarts: int = 0,
    seconds: float | None = None,
    log: Log | None = None,
    eval_progress: ProgressFn | None = None,
) -> dict[str, Any] | None:
    """Write the final model (the best validated checkpoint with early stopping, else the
    latest), evaluate on test, export embeddings; returns ``results.json``'s content."""
    say = log or (lambda _msg: None)
    config, store = run.config, run.store
    checkpoints = run.checkpoints()
    chosen = checkpoints.best() if config.evaluation.patience else None
    state: TrainState | None = None
    if chosen is not None:
        state = checkpoints.load(chosen)
        say(f"keeping the best validated model (epoch {chosen.epoch}, MRR {chosen.valid_mrr:.4f})")
    else:
        found = checkpoints.latest()
        if found is None and config.training.epochs > 0:
            raise RunError(f"{run.url}: no committed checkpoint to finish from")
        chosen, state = found if found else (None, None)
    model = KGEModel.build(
        config.model,
        num_entities=run.num_entities,
        num_relations=run.num_relations,
        seed=config.run.seed,
    )
    if state is not None:  # else training.epochs == 0: the seeded initial model
        with torch.no_grad():
            model.entity.copy_(state.tables["entity"])
            model.relation.copy_(state.tables["relation"])
    save_model(model, store)
    vocab = Vocabulary.read(store.url_of("vocab"), config.run.storage_options)
    results: dict[str, Any] | None = None
    train_all, valid, test = load_staged(store)
    if config.evaluation.test and test.numel():
        say(f"evaluating on test ({test.shape[0]} triples, both sides)")
        index = FilterIndex.from_triples([train_all, valid, test], run.num_relations)
        if config.training.allocator == "retain":
            retain_freed_memory()  # (batch x entities) score blocks reuse their pages
        model.to(resolve_device(config.training.device))  # rank on the GPU if there is one
        results = _results(config, model, test, index, "test", eval_progress)
        model.cpu()
        results["training"] = {
            "epochs": len(history),
            "model_epoch": chosen.epoch if chosen else 0,
            "checkpoint": chosen.url if chosen else None,
            "restarts": restarts,
            "world_size": config.distributed.workers,
            "train_seconds": sum(float(h["seconds"]) for h in history),
            "wall_seconds": seconds,
            "resumed_from_epoch": run.resumed_epoch,
        }
        store.write_json("results.json", results)
    export_embeddings(
        model, vocab, store.url_of("embeddings"), storage_options=config.run.storage_options
    )
    return results


def train(
    config: RunConfig,
    *,
    callbacks: Sequence[Callback] = (),
    overwrite: bool = False,
    resume: bool = False,
    log: Log | None = None,
    eval_progress: ProgressFn | None = None,
) -> RunResult:
    """Train, evaluate and export one run without Prefect; returns where it went and the results.

    ``resume`` continues the run folder's latest committed checkpoint (if the folder exists).
    Bad input (data, config, an existing run folder without ``overwrite``/``resume``) raises a
    :class:`~kgpipe.errors.KgpipeError` before anything is written.
    """
    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    run = prepare_run(config, overwrite=overwrite, resume=resume, log=say)
    with contextlib.ExitStack() as stack:
        client = None
        if run.config.distributed.uses_dask:
            from kgpipe.distributed.cluster import open_cluster

            client = stack.enter_context(
                open_cluster(run.config.distributed, log=say, fault=run.config.fault_tolerance)
            )
        session = Session(run, callbacks=callbacks, client=client, log=say)
        stack.callback(session.close)
        rows = committed_history(run)
        for end in segment_ends(run.resumed_epoch, run.config):
            rows = session.train_until(end).history
            if should_stop(rows, run.config.evaluation.patience):
                say(f"early stopping after epoch {end}: no better valid MRR")
                break
    results = finish_run(
        run,
        history=rows,
        restarts=session.restarts,
        seconds=time.perf_counter() - t_start,
        log=say,
        eval_progress=eval_progress,
    )
    return RunResult(
        run.url,
        run.config,
        [EpochStats.from_dict(h) for h in rows],
        results,
        time.perf_counter() - t_start,
    )


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
        cfg = cfg.model_copy(
            update={"evaluation": cfg.evaluation.model_copy(update={"batch_size": batch_size})}
        )
    return _results(cfg, run.model, triples, _filter_index(dataset), split, progress)


# -- series of runs (scheduled retraining) ----------------------------------------------------------
def _series_store(config: RunConfig) -> Store:
    return Store(config.run.root, config.run.storage_options, retry=retry_policy(config))


def latest_of_series(config: RunConfig, series: str) -> dict[str, Any] | None:
    """The record of the series' latest finished run (``{root}/{series}.latest.json``)."""
    store = _series_store(config)
    rel = f"{series}.latest.json"
    return store.read_json(rel) if store.exists(rel) else None


def record_latest_of_series(config: RunConfig, series: str, record: dict[str, Any]) -> None:
    _series_store(config).write_json(f"{series}.latest.json", record)


def source_fingerprint(config: RunConfig) -> str:
    """The content fingerprint of the configured input (all splits)."""
    return load_dataset(config.data).fingerprint
