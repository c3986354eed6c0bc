"""Staging a run folder, or deciding to resume one.

Staging validates the input (every input error surfaces before anything is written), writes
the config, the vocabulary, the shuffled training shards (any world size can read them), the
valid/test ids and, last, ``data.json``. A resume reuses a staged folder and continues from its
latest committed checkpoint (:mod:`kgpipe.runs.resume` says when it may).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kgpipe.config import RunConfig, config_to_yaml
from kgpipe.data.dataset import load_dataset
from kgpipe.data.shards import stage_shards
from kgpipe.distributed.clusters import CLUSTERS
from kgpipe.errors import ConfigError
from kgpipe.process import check_guarded_script, check_not_reimported
from kgpipe.query_candidates import QueryCandidates
from kgpipe.runs.folder import (
    CONFIG,
    DATA,
    LEASE,
    TEST_IDS,
    VALID_IDS,
    VOCAB,
    RunFolder,
    is_staged,
    retry_policy,
    run_exists_error,
    run_store,
    save_candidates,
    save_ids,
)
from kgpipe.runs.lease import RunLease
from kgpipe.runs.parsed import file_versions, keep_parsed, take_parsed
from kgpipe.runs.resume import check_resumable
from kgpipe.runs.warmstart import commit_warm_start
from kgpipe.storage import check_reachable
from kgpipe.training.schedules import SCHEDULES

__all__ = ["preflight", "prepare_run", "run_lease"]

Log = Callable[[str], None]

NO_VALIDATION = (
    "no validation data: no early stopping, best-checkpoint selection or valid MRR; "
    "set data.valid or data.split"
)


def _warner(log: Log | None, warn: Log | None) -> Log:
    """Where warnings go: ``warn``, else ``log`` (marked WARNING), else the ``kgpipe.runs``
    logger at WARNING level."""
    if warn is not None:
        return warn
    if log is not None:
        return lambda msg: log(f"WARNING: {msg}")
    return logging.getLogger("kgpipe.runs").warning


def _valid_source(config: RunConfig) -> str:
    data = config.data
    if data.split is not None:
        return f"data.split of {data.train}"
    return str(data.valid or data.dataset or "none given")


def run_lease(config: RunConfig, *, holder: str) -> RunLease:
    """The lease of ``config``'s run folder (``run.name`` set), to hold with ``with`` around
    staging, training and finishing; ``holder`` says who is writing, for whoever is refused."""
    store = run_store(config)
    check_reachable(store.fs, store.url)  # the run's first touch of its root: fail fast
    return RunLease(store, ttl_s=config.fault_tolerance.lease_ttl_s, holder=holder)


def _check_placement(config: RunConfig) -> None:
    """Where the ranks would train, checked before anything is written (a run refused after
    staging left its folder, which the corrected command then found existing): dask-cuda for
    ``cluster: cuda``, a GPU for ``device: cuda`` on a cluster started here, and a scheduler
    address that answers (instead of a 30-s timeout after staging)."""
    import importlib.util

    from kgpipe.distributed.clusters import CLUSTERS, is_address
    from kgpipe.endpoints import tcp_problem

    cluster = config.distributed.cluster
    if cluster == "cuda" and importlib.util.find_spec("dask_cuda") is None:
        raise ConfigError("distributed.cluster=cuda needs dask-cuda: pip install 'kgpipe[gpu]'")
    if config.training.device == "cuda" and cluster in CLUSTERS:
        from kgpipe.devices import resolve_device

        resolve_device("cuda")  # a ConfigError naming torch's build where it sees no GPU
    scheme = cluster.split("://", 1)[0] if "://" in cluster else "tcp"
    if cluster not in CLUSTERS and is_address(cluster) and scheme == "tcp":
        host = cluster.split("://", 1)[-1]
        problem = tcp_problem(host if ":" in host.rstrip("/") else f"{host}:8786")
        if problem:
            raise ConfigError(
                f"distributed.cluster={cluster}: the Dask scheduler cannot be reached ({problem})"
            )


def _check_new_run(config: RunConfig) -> None:
    """What a new run may not start with (a run started before the check resumes as it was)."""
    reg = config.model.regularizer
    if reg.type != "none" and not reg.weight:
        raise ConfigError(
            f"model.regularizer.type={reg.type} with weight 0 penalises nothing: give "
            "model.regularizer.weight (e.g. 0.01), or type none"
        )


def _check_trainable(config: RunConfig) -> None:
    """What a run may not train with, refused where it starts or resumes, not wherever a
    config is read: a finished run that has it is still read (evaluate, predict, export)."""
    check_not_reimported("training")
    check_processes(config)
    _check_placement(config)
    d = config.distributed
    if d.sync == "epoch" and d.workers > 1 and config.training.mode == "kvsall":
        raise ConfigError(
            "distributed.sync=epoch splits the training triples among the ranks, so a kvsall "
            "query's answers held by other ranks would be trained as false: use sync=step or "
            "training.mode 1vsall/negative_sampling"
        )
    if config.evaluation.patience and not config.checkpoint.keep_best:
        raise ConfigError(
            "checkpoint.keep_best=false with evaluation.patience: under early stopping the "
            "run's model is its best validated checkpoint, which retention would remove"
        )


def preflight(
    config: RunConfig, *, overwrite: bool = False, resume: bool = False, keep: bool = False
) -> RunConfig:
    """Check, before anything runs, that ``config`` may start: an existing run folder needs
    ``resume`` (then its config must allow it) or ``overwrite``, and a new run's input must
    read and parse. Writes nothing; returns the config with its run name set (and, resuming,
    the run's epoch target: :mod:`kgpipe.runs.resume`). ``keep``: the parsed graph is kept for
    the :func:`prepare_run` that follows in this process, which then does not read the files
    again unless they changed (:mod:`kgpipe.runs.parsed`)."""
    _check_trainable(config)
    config = config.with_run_name()
    store = run_store(config)
    exists = store.exists(CONFIG)
    if exists and resume:
        return check_resumable(store, config).config
    if exists and not overwrite and is_staged(store):  # (one whose staging stopped: again)
        raise run_exists_error(store.url)
    _check_new_run(config)
    versions = file_versions(config.data) if keep else None
    dataset = load_dataset(config.data, retry=retry_policy(config))
    _check_candidates(config, dataset.num_entities)
    if keep:
        keep_parsed(config.data, versions, dataset)
    return config


def check_processes(config: RunConfig) -> None:
    """A run on a Dask cluster it starts, from a script's top level outside the main guard,
    is refused before anything is written (:func:`~kgpipe.process.check_guarded_script`)."""
    dist = config.distributed
    if dist.uses_dask and dist.cluster in CLUSTERS:
        check_guarded_script(f"training on the {dist.cluster} Dask cluster")


def check_trainable_data(config: RunConfig) -> None:
    """The checks of a new run's input that do not need its run folder (a search's base
    config, before its study starts): the graph reads and parses, and the evaluation it asks
    for fits it. Writes nothing."""
    dataset = load_dataset(config.data, retry=retry_policy(config))
    _check_candidates(config, dataset.num_entities)


def _check_candidates(config: RunConfig, num_entities: int) -> None:
    k = config.evaluation.candidates
    problem = None if k is None else QueryCandidates.too_many(k, num_entities)
    if problem is not None:
        raise ConfigError(f"evaluation.candidates: {problem} (leave it unset)")


def prepare_run(
    config: RunConfig,
    *,
    overwrite: bool = False,
    resume: bool = False,
    warm_start: str | None = None,
    log: Log | None = None,
    warn: Log | None = None,
) -> RunFolder:
    """Create the run folder and stage the data, or (``resume``) reuse a run folder's staged data
    and continue from its latest committed checkpoint.

    ``warm_start`` (a previous run folder's URL) commits an epoch-0 checkpoint whose tables come
    from that run's model, matched by label (see :mod:`kgpipe.runs.warmstart`).

    ``log`` hears what staging does (the data read, per split), ``warn`` what the user should
    fix (default: ``log``, marked ``WARNING:``; without either, the ``kgpipe.runs`` logger), such
    as a run without validation data.

    Bad input raises a :class:`~kgpipe.errors.KgpipeError` before anything is written.
    """
    say = log or (lambda _msg: None)
    _check_trainable(config)
    config = config.with_run_name()
    store = run_store(config)
    exists = store.exists(CONFIG)
    if exists and resume:
        plan = check_resumable(store, config)
        config = plan.config
        if plan.extended_from is not None:
            say(
                f"extending {store.url} from {plan.extended_from} to {config.training.epochs} epochs"
            )
            store.write_text(CONFIG, config_to_yaml(config))
        if plan.note:
            say(plan.note)
        for path in store.remove_partial_writes():
            say(f"removed {path}, a partial write of an interrupted run")
        if is_staged(store):
            run = RunFolder.read(config)
            found = run.checkpoints().latest_verified()
            run.resumed_epoch = found.epoch if found else 0
            say(
                f"resuming {store.url} from the checkpoint of epoch {run.resumed_epoch}"
                if found
                else f"resuming {store.url}: staged data found, no committed checkpoint yet"
            )
            return run
        say(f"{store.url}: staging had not finished; staging again")
    elif exists and not overwrite:
        if is_staged(store):
            raise run_exists_error(store.url)
        # staging stopped before its end (data.json, written last): nothing a run made is
        # there, so it is staged again (a retried staging task found its own folder "exists")
        say(f"{store.url}: staging had not finished; staging again")
    _check_new_run(config)
    # input errors: before writes; a pre-flight check in this process may have parsed it
    dataset = take_parsed(config.data) or load_dataset(config.data, retry=retry_policy(config))
    say(dataset.summary())
    _check_candidates(config, dataset.num_entities)
    if SCHEDULES.get(config.training.schedule).follows_validation and dataset.valid.numel() == 0:
        raise ConfigError(
            f"training.schedule={config.training.schedule} needs validation triples, and the "
            f"valid split ({_valid_source(config)}) has none"
        )
    if dataset.valid.numel() == 0:
        _warner(log, warn)(NO_VALIDATION)
    test = dataset.reports.get("test")
    if test is not None and test.unseen and not test.triples and config.evaluation.test:
        # every test triple dropped (data.unseen: drop): the run would end with no test metrics
        _warner(log, warn)(
            f"no test triples left: all {test.unseen:,} read from {test.source} have entities "
            "or relations not in train (dropped, data.unseen: drop), so there will be no test "
            "metrics"
        )
    if exists:  # replace the run folder's contents; the lease (held by this writer) stays
        for name in store.list():
            if name != LEASE:
                store.remove(name)

    store.write_text(CONFIG, config_to_yaml(config))
    dataset.vocab.write(store.url_of(VOCAB), config.run.storage_options, retry=store.retry)
    manifest = stage_shards(
        dataset.train, store, num_shards=config.distributed.shards, seed=config.run.seed
    )
    save_ids(store, VALID_IDS, dataset.valid)
    save_ids(store, TEST_IDS, dataset.test)
    for split, sets in dataset.candidates.items():
        save_candidates(store, split, sets)
    run = RunFolder(
        store.url,
        config,
        dataset.num_entities,
        dataset.num_relations,
        manifest.total,
        dataset.fingerprint,
        0,
    )
    if warm_start is not None:  # before data.json: a staged folder without it is incomplete
        summary = commit_warm_start(run, dataset.vocab, warm_start)
        say(f"warm start from {warm_start}: {summary}")
    store.write_json(  # last: a folder with it is staged (a resume trains from there)
        DATA,
        {
            "fingerprint": dataset.fingerprint,
            "num_entities": dataset.num_entities,
            "num_relations": dataset.num_relations,
            "splits": {k: vars(v) for k, v in dataset.reports.items()},
            "split": dataset.split,
            **(
                {"candidates": {k: v.sources for k, v in dataset.candidates.items()}}
                if dataset.candidates
                else {}
            ),
        },
    )
    return run
