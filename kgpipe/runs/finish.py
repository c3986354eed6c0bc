"""Finishing a run: the final model (the best validated checkpoint under early stopping, else
the latest), the filtered test evaluation with its protocol, and the embeddings export."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from kgpipe.checkpoint import Checkpoint, CheckpointStore
from kgpipe.config import RunConfig
from kgpipe.data.vocab import Vocabulary
from kgpipe.devices import resolve_device
from kgpipe.errors import RunError
from kgpipe.evaluation import FilterIndex, ProgressFn, evaluate
from kgpipe.export import export_embeddings, save_model
from kgpipe.export_shards import export_sharded
from kgpipe.model_file import write_sharded_model
from kgpipe.models.model import KGEModel, spec_from_config
from kgpipe.process import ThreadGovernor, configure
from kgpipe.query_candidates import Candidates
from kgpipe.runs.folder import EMBEDDINGS, RESULTS, VOCAB, RunFolder, StagedData

__all__ = [
    "best_verified",
    "chosen_checkpoint",
    "evaluation_protocol",
    "finish_run",
    "test_results",
]

Evaluator = Callable[..., dict[str, Any]]

Log = Callable[[str], None]


def evaluation_protocol(
    config: RunConfig, *, candidates: str = "all", split: str = "test"
) -> dict[str, Any]:
    """The protocol stated next to every metric we write."""
    protocol: dict[str, Any] = {
        "task": "link prediction, both sides (head and tail queries)",
        "ranking": "filtered",
        "filter": ["train", "valid", "test"],
        "candidates": "all entities" if candidates == "all" else candidates,
        "ties": "realistic (mean of optimistic and pessimistic rank)",
        "unseen": config.data.unseen,
        "metrics": ["mrr", "mr", "hits@1", "hits@3", "hits@10"],
    }
    if candidates.startswith("per-query-"):
        protocol["candidate_sets"] = {
            "per_query": config.evaluation.candidates,
            "seed": config.evaluation.candidates_seed,
            "drawn": "uniformly, with replacement, from the entities other than the answer; "
            "fixed per split, triple and side (kgpipe.query_candidates)",
            "filtered": "candidates that form a known true triple do not count",
            "comparable_with_full_ranking": False,
        }
    files = config.data.candidates
    if candidates.startswith("files-") and files is not None:
        side = getattr(files, split)
        protocol["candidate_sets"] = {
            "per_query": int(candidates.removeprefix("files-")),
            "files": {"head": side.head, "tail": side.tail} if side is not None else None,
            "read": "row i of each file holds the candidates of the split's triple i "
            "(data.candidates, kgpipe.data.candidates)",
            "filtered": "candidates that form a known true triple do not count"
            if files.filtered
            else "no: every candidate counts, as in OGB's evaluator",
            "comparable_with_full_ranking": False,
        }
        if not files.filtered:
            protocol["ranking"] = "unfiltered among the candidates"
            protocol["filter"] = []
    return protocol


def test_results(
    config: RunConfig,
    model: KGEModel,
    triples: Tensor,
    index: FilterIndex,
    split: str,
    progress: ProgressFn | None = None,
    *,
    candidates: Candidates | None = None,
    evaluator: Evaluator | None = None,
) -> dict[str, Any]:
    """Filtered metrics of ``triples`` as ``results.json`` states them (with the protocol),
    ranked against ``candidates`` (:meth:`RunFolder.candidates`; None: all entities).
    ``evaluator``: :func:`~kgpipe.evaluation.evaluate`'s stand-in with the model bound (a
    sharded gang's ranks: :func:`~kgpipe.distributed.sharded_eval.evaluate_sharded`)."""
    t0 = time.perf_counter()
    rank = evaluator or (lambda *args, **kwargs: evaluate(model, *args, **kwargs))
    m = rank(
        triples,
        index,
        batch_size=config.evaluation.batch_size,
        progress=progress,
        candidates=candidates,
    )
    seconds = time.perf_counter() - t0
    return {
        "split": split,
        **{k: m[k] for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10")},
        "head": m["head"],
        "tail": m["tail"],
        "triples": m["triples"],
        "protocol": evaluation_protocol(config, candidates=m["candidates"], split=split),
        "model": config.model.name,
        "seconds": seconds,
    }


def finish_run(
    run: RunFolder,
    *,
    history: Sequence[dict[str, Any]],
    restarts: int = 0,
    seconds: float | None = None,
    log: Log | None = None,
    eval_progress: ProgressFn | None = None,
    tested: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Write the final model, evaluate it on test, export embeddings; returns ``results.json``'s
    content (``None`` without a test split or with ``evaluation.test`` off). ``tested``: the
    test metrics of the chosen checkpoint ranked already (by a sharded gang's ranks,
    :meth:`~kgpipe.launch.dask.DaskLauncher.test_split`), used when they name its epoch."""
    say = log or (lambda _msg: None)
    config, store = run.config, run.store
    checkpoints = run.checkpoints()
    chosen = chosen_checkpoint(run, checkpoints)
    if chosen is not None and config.evaluation.patience and chosen.valid_mrr is not None:
        say(f"keeping the best validated model (epoch {chosen.epoch}, MRR {chosen.valid_mrr:.4f})")
    if tested is not None and (chosen is None or tested.get("model_epoch") != chosen.epoch):
        tested = None  # another checkpoint's: ranked here
    sharded = chosen is not None and chosen.manifest.get("strategy") == "sharded"
    if sharded:  # never the whole table in this process: written a block at a time, mapped
        assert chosen is not None
        spec = spec_from_config(
            config.model, num_entities=run.num_entities, num_relations=run.num_relations
        )
        model = write_sharded_model(checkpoints, chosen, spec, store)
    else:
        model = _whole_model(run, checkpoints, chosen)
        save_model(model, store)
    return _test_and_export(
        run, checkpoints, model, chosen, sharded, history, restarts, seconds, say, eval_progress,
        tested,
    )  # fmt: skip


def best_verified(checkpoints: CheckpointStore, *, verify: bool = True) -> Checkpoint | None:
    """The committed checkpoint with the best validation MRR (the earliest on ties) whose files
    verify: a corrupt one gives way to the next best (``verify=False``: the best, not read)."""
    scored = [c for c in checkpoints.committed() if c.valid_mrr is not None]
    ranked = sorted(scored, key=lambda c: (-float(c.valid_mrr or 0), c.epoch))
    return next((c for c in ranked if not verify or checkpoints.verify(c)), None)


def chosen_checkpoint(
    run: RunFolder, checkpoints: CheckpointStore | None = None, *, verify: bool = True
) -> Checkpoint | None:
    """The checkpoint a finished run's model is: the best validated one that verifies under
    early stopping (``evaluation.patience``; a corrupt best gives way to the next), else the
    latest verified one (None: ``training.epochs: 0``; ``verify=False``: the best or the latest
    committed one, its files not read)."""
    checkpoints = checkpoints or run.checkpoints()
    config = run.config
    chosen = best_verified(checkpoints, verify=verify) if config.evaluation.patience else None
    if chosen is None and not verify:
        return next(iter(reversed(checkpoints.committed())), None)
    if chosen is None:
        chosen = checkpoints.latest_verified()
        if chosen is None and config.training.epochs > 0:
            raise RunError(f"{run.url}: no committed checkpoint to finish from")
    return chosen


def _whole_model(
    run: RunFolder, checkpoints: CheckpointStore, chosen: Checkpoint | None
) -> KGEModel:
    """The model of ``chosen`` (its tables, no optimiser state) in memory; the seeded initial
    model without one (``training.epochs: 0``)."""
    model = run.new_model()
    if chosen is not None:
        state = checkpoints.load_tables(chosen)  # the tables only: no optimiser state
        with torch.no_grad():
            model.entity.copy_(state.tables["entity"])
            model.relation.copy_(state.tables["relation"])
    return model


def _test_and_export(
    run: RunFolder,
    checkpoints: CheckpointStore,
    model: KGEModel,
    chosen: Checkpoint | None,
    sharded: bool,
    history: Sequence[dict[str, Any]],
    restarts: int,
    seconds: float | None,
    say: Log,
    eval_progress: ProgressFn | None,
    tested: dict[str, Any] | None,
) -> dict[str, Any] | None:
    config, store = run.config, run.store
    vocab = Vocabulary.read(store.url_of(VOCAB), config.run.storage_options, retry=run.retry)
    results: dict[str, Any] | None = None
    data = run.staged(train=tested is None)  # the filter's triples, where it ranks here
    if config.evaluation.test and data.test.numel() and tested is not None:
        results = {k: v for k, v in tested.items() if k != "model_epoch"}
    elif config.evaluation.test and data.test.numel():
        say(f"evaluating on test ({data.test.shape[0]} triples, both sides)")
        results = _test_here(run, model, data, eval_progress)
        results["ranked_by"], results["ranks"] = "driver", 1
        if sharded:  # it exports from its shards: no copy of the mapped table, no GPU copy kept
            model.to("meta")
        else:
            model.cpu()
    if results is not None:
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
        store.write_json(RESULTS, results)
    elif store.exists(RESULTS):  # an earlier finish's test of another model: not this one's
        store.remove(RESULTS)
    if sharded:
        assert chosen is not None
        # a part per shard, from the checkpoint's shard tensors (one shard at a time)
        export_sharded(
            checkpoints, chosen, vocab, model.spec, store.url_of(EMBEDDINGS),
            storage_options=config.run.storage_options, retry=run.retry,
        )  # fmt: skip
    else:
        export_embeddings(
            model,
            vocab,
            store.url_of(EMBEDDINGS),
            storage_options=config.run.storage_options,
            retry=run.retry,
        )
    return results


def _test_here(
    run: RunFolder, model: KGEModel, data: StagedData, eval_progress: ProgressFn | None
) -> dict[str, Any]:
    """The test metrics of ``model`` ranked in this process."""
    config = run.config
    index = FilterIndex.from_triples([data.train, data.valid, data.test], run.num_relations)
    t = config.training
    # the run's process settings: (batch x entities) score blocks reuse their pages under
    # allocator retain, and the threads follow the machine unless pinned
    configure(threads=t.threads, allocator=t.allocator, deterministic=t.deterministic)
    governor = ThreadGovernor().start() if t.threads is None else None

    def progress(done: int, total: int) -> None:
        if governor is not None:
            governor.tick()
        if eval_progress is not None:
            eval_progress(done, total)

    model.to(resolve_device(t.device))  # rank on the GPU if there is one
    return test_results(
        config, model, data.test, index, "test", progress, candidates=run.candidates("test")
    )
