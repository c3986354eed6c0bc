"""The trainer factory: the one place a run's trainer is built and its callbacks ordered.

Both launchers use it -- the in-process one and every rank of a Dask gang -- so a trainer is
assembled the same way wherever it runs. The order of callbacks is fixed here:

1. the thread governor's ticker (records the thread count of the epoch) and, in a gang, the
   run's restarts so far (both go into the epoch's stats, so into the checkpoint's history);
2. validation, when due (adds ``valid_*`` to the epoch's stats) -- where the run's records are
   written (in-process, or rank 0 of a gang);
3. the checkpoint commit (its manifest records those stats) -- likewise;
4. the records of the epoch: ``metrics.jsonl`` in-process, the progress queue on rank 0;
5. rank callbacks (run next to the model, in-process or on every rank; their view has it);
6. the caller's callbacks (in-process; a gang relays events to them on the driver).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kgpipe.checkpoint import TrainState
from kgpipe.config import RunConfig, TrainingConfig
from kgpipe.distributed.sharded import ShardedExchange
from kgpipe.distributed.sharded_eval import evaluate_sharded
from kgpipe.evaluation import FilterIndex
from kgpipe.process import ThreadGovernor
from kgpipe.runs.callbacks import CheckpointCallback, Validation
from kgpipe.runs.folder import RunFolder, StagedData
from kgpipe.runs.sharded import ShardedCommit
from kgpipe.training.exchange import Exchange
from kgpipe.training.hooks import Callback, RankView, TrainerView
from kgpipe.training.loop import Trainer
from kgpipe.training.records import EpochStats

__all__ = ["BuiltTrainer", "GovernorTicker", "RecordRestarts", "build_trainer"]


class GovernorTicker(Callback):
    """Lets the thread governor look at the machine every step; records the epoch's count."""

    def __init__(self, governor: ThreadGovernor) -> None:
        self.governor = governor

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        self.governor.tick()

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        stats.extra["threads"] = self.governor.threads


class RecordRestarts(Callback):
    """Records the gang restarts of the run so far with each epoch it trains (an epoch trained
    again after a restart carries the new count), in the stats the checkpoint commits."""

    def __init__(self, restarts: int) -> None:
        self.restarts = restarts

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        stats.extra["restarts"] = self.restarts


class _WithModel(Callback):
    """Runs a rank callback with the view that also holds the model."""

    def __init__(self, inner: Callback, view: RankView) -> None:
        self.inner = inner
        self.view = view

    def on_train_start(self, trainer: TrainerView) -> None:
        self.inner.on_train_start(self.view)

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        self.inner.on_epoch_start(self.view, epoch)

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        self.inner.on_batch_end(self.view, epoch, step, steps, loss)

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        self.inner.on_epoch_end(self.view, stats)

    def on_train_end(self, trainer: TrainerView) -> None:
        self.inner.on_train_end(self.view)


@dataclass
class BuiltTrainer:
    """A trainer and the callback whose background upload must be closed with it."""

    trainer: Trainer
    saver: CheckpointCallback | ShardedCommit | None


def splits_validation(config: RunConfig, world_size: int) -> bool:
    """Whether every rank of a gang validates, each against its range of entities (full
    filtered ranking), rather than rank 0 alone (a sampled validation of a replicated gang, or a
    gang of one). A sharded gang always splits it: no rank holds every row."""
    ev = config.evaluation
    sharded = config.distributed.strategy == "sharded"
    files = config.data.candidates
    whole = ev.sampled is None and ev.candidates is None and (files is None or not files.valid)
    return world_size > 1 and bool(ev.every) and (whole or sharded)


def _call_each(calls: Sequence[Callable[[], None]]) -> None:
    for call in calls:
        call()


def build_trainer(
    run: RunFolder,
    data: StagedData,
    *,
    device: torch.device,
    until: int,
    train: torch.Tensor | None = None,
    training: TrainingConfig | None = None,
    rank: int = 0,
    world_size: int = 1,
    part: tuple[int, int] = (0, 1),
    stream: int = 0,
    exchange: Exchange | None = None,
    records: bool = True,
    recorder: Callback | None = None,
    governor: ThreadGovernor | None = None,
    rank_callbacks: Sequence[Callback] = (),
    callbacks: Sequence[Callback] = (),
    state: TrainState | None = None,
    restarts: int | None = None,
    fence: Callable[[], None] | None = None,
    commit_group: Any = None,
    interrupt: Callable[[], None] | None = None,
) -> BuiltTrainer:
    """The trainer of ``run`` to epoch ``until`` on ``train`` (this rank's training triples;
    default ``data.train``, which holds all of them wherever the trainer validates: the
    filter needs every known triple).

    ``records`` says whether this trainer validates and commits (one process, or rank 0);
    ``recorder`` reports each epoch (the metrics file, or rank 0's progress queue); ``training``
    replaces the config's section (a rank's share of the batch); ``restarts`` (a gang's) is
    recorded with every epoch; ``fence`` raises when commits must stop (a gang's driver is
    gone); ``commit_group``: the process group of a sharded commit's collectives;
    ``interrupt`` raises where the rank must stop (its task cancelled), called between
    validation chunks."""
    config = run.config
    sharded = exchange if isinstance(exchange, ShardedExchange) else None
    model = run.new_model(rows=sharded.own.cpu() if sharded else None).to(device)
    trainer = Trainer(
        model,
        data.train if train is None else train,
        training=training or config.training,
        regularizer=config.model.regularizer,
        dropout=config.model.dropout,
        seed=config.run.seed,
        stream=stream,
        part=part,
        exchange=exchange,
        rank=rank,
        world_size=world_size,
    )
    ordered: list[Callback] = []
    if governor is not None:
        ordered.append(GovernorTicker(governor))
    if restarts is not None:
        ordered.append(RecordRestarts(restarts))
    saver: CheckpointCallback | ShardedCommit | None = None
    split = splits_validation(config, world_size)
    if config.evaluation.every and (records or split):
        index = FilterIndex.from_triples([data.train, data.valid, data.test], run.num_relations)
        ticks = [f for f in (governor.tick if governor else None, interrupt) if f is not None]
        tick = functools.partial(_call_each, ticks) if ticks else None
        valid_part = (rank, world_size) if split else (0, 1)
        evaluator = None
        if sharded is not None:
            evaluator = functools.partial(evaluate_sharded, model, sharded)
        ordered.append(
            Validation(
                model,
                data.valid,
                index,
                config,
                tick=tick,
                part=valid_part,
                evaluator=evaluator,
                candidates=run.candidates("valid"),
            )
        )
    if sharded is not None:  # every rank writes its shards; rank 0 commits
        saver = ShardedCommit(
            run.checkpoints(fence=fence if records else None),
            trainer.state,
            sharded,
            every=config.checkpoint.every,
            until=until,
            meta=run.manifest_meta(world_size),
            group=commit_group,
            background=config.checkpoint.background,
        )
        ordered.append(saver)
    elif records:
        c = config.checkpoint
        saver = CheckpointCallback(
            run.checkpoints(fence=fence),
            trainer.state,
            every=c.every,
            until=until,
            meta=run.manifest_meta(world_size),
            background=c.background,
        )
        ordered.append(saver)
    if recorder is not None:
        ordered.append(recorder)
    ordered += [_WithModel(cb, RankView(trainer)) for cb in rank_callbacks]
    ordered += callbacks
    trainer.callbacks = ordered
    if state is not None:
        trainer.load_state(state)
    return BuiltTrainer(trainer, saver)
