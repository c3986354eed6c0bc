"""The training loop: one process here, written so that every rank of a gang can run it.

A step is three explicit phases:

1. the step strategy of ``training.mode`` (:mod:`kgpipe.training.steps`) computes this rank's
   share of the global batch: a loss and, per table, the gradients of the rows it touched,
   normalised by the *global* batch so that the ranks' gradients sum to the single-process one;
2. :meth:`Exchange.step` -- identity in one process; in a gang it sums the ranks' gradients;
3. the row-wise optimiser applies the (clipped) gradients to the touched rows only.

In a gang with step-level synchronisation every rank builds the same global batch and computes
the part ``part = (index, count)`` of it; with epoch-level synchronisation every rank trains its
own data and :meth:`Exchange.epoch_end` combines the models. Randomness: :mod:`.rng`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
from torch import Tensor

from kgpipe.checkpoint import TrainState
from kgpipe.config import DropoutConfig, RegularizerConfig, TrainingConfig
from kgpipe.devices import resolve_precision
from kgpipe.errors import Diverged
from kgpipe.models.model import KGEModel
from kgpipe.training.dropout import Dropout
from kgpipe.training.exchange import Exchange
from kgpipe.training.hooks import Callback, LiveView
from kgpipe.training.losses import LOSSES
from kgpipe.training.optim import RowGrad, RowOptimizer, build_optimizer
from kgpipe.training.records import EpochStats, StepResult
from kgpipe.training.regularizers import REGULARIZERS
from kgpipe.training.rng import epoch_generator
from kgpipe.training.schedules import SCHEDULES
from kgpipe.training.steps import STEPS, StepKit

__all__ = ["Trainer", "clip_grad_norm"]


def clip_grad_norm(
    grads: dict[str, RowGrad], max_norm: float | None, exchange: Exchange | None = None
) -> None:
    """Scale all row gradients in place so that their global norm is at most ``max_norm``
    (the norm over every rank's rows when ``exchange`` shards the table)."""
    if max_norm is None:
        return
    norm = math.sqrt((exchange or Exchange()).squared_norm(grads))
    if norm > max_norm:
        scale = max_norm / (norm + 1e-12)
        for g in grads.values():
            g.values.mul_(scale)


class Trainer:
    """Trains a :class:`KGEModel` in place on integer triples ``(n, 3)``.

    The parts -- step strategy, loss, regulariser, dropout, optimiser, schedule -- are taken
    from their registries by the names in ``training``; ``callbacks`` see a read-only view of
    the trainer (it implements :class:`~kgpipe.training.hooks.TrainerView`).

    Process-wide settings (``training.threads``, ``.allocator``, ``.deterministic``) are not the
    trainer's to make: the launchers make them (:func:`kgpipe.process.configure`), and so must
    code that builds a trainer directly and wants them.
    """

    def __init__(
        self,
        model: KGEModel,
        train: Tensor,
        *,
        training: TrainingConfig,
        regularizer: RegularizerConfig,
        seed: int,
        dropout: DropoutConfig | None = None,
        stream: int = 0,
        part: tuple[int, int] = (0, 1),
        callbacks: Sequence[Callback] = (),
        exchange: Exchange | None = None,
        optimizer: RowOptimizer | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if train.ndim != 2 or train.shape[1] != 3:
            raise ValueError("train must have shape (n, 3)")
        self.model = model
        # training happens where the model's tables are (model.to(device) before this)
        self.device = model.entity.device
        self.cfg = training
        self.seed = seed
        self.stream = stream
        self.rank = rank
        self.world_size = world_size
        self.callbacks = list(callbacks)
        self.exchange = exchange or Exchange()
        self.tables = {"entity": model.entity.data, "relation": model.relation.data}
        self.optimizer = optimizer or build_optimizer(
            training.optimizer, self.tables, lr=training.lr, betas=training.betas, eps=training.eps
        )
        inter = model.interaction
        self.regularizer = REGULARIZERS.get(regularizer.type)(
            inter, weight=regularizer.weight, p=regularizer.p
        )
        self.dropout = (
            Dropout(entity=dropout.entity, relation=dropout.relation, seed=seed, stream=stream)
            if dropout is not None and dropout.active
            else None
        )
        # fp32 or bf16 score products (training.precision: auto decides by model and device)
        self.bf16 = resolve_precision(training.precision, model.spec.name, self.device) == "bf16"
        loss = LOSSES.get(training.loss)(
            margin=training.margin,
            temperature=training.adversarial_temperature,
            label_smoothing=training.label_smoothing,
        )
        kit = StepKit(
            interaction=inter,
            spec=model.spec,
            tables=dict(self.tables),  # its own dict: a sharded step swaps in fetched rows
            device=self.device,
            loss=loss,
            regularizer=self.regularizer,
            dropout=self.dropout,
            bf16=self.bf16,
            part=part,
        )
        self.strategy = STEPS.get(training.mode)(
            kit,
            (train if train.dtype in (torch.int32, torch.int64) else train.long()).to(
                self.device
            ),  # int32 stays int32 (half the memory); each batch is widened
            chunk_size=training.chunk_size,
            negatives=training.negatives,
        )
        self._agreed_steps = self.exchange.agree_steps(self.steps_per_epoch)
        self.schedule = SCHEDULES.get(training.schedule)(
            base=training.lr,
            warmup_steps=training.warmup_steps,
            total_steps=self.total_steps,
            **training.plateau.model_dump(),
        )
        self.epoch = 0  # epochs completed
        self.global_step = 0
        self.history: list[EpochStats] = []
        self.view = LiveView(self)  # what callbacks get: read-only, as on a gang's driver
        self.exchange.bind(self)

    # -- the view callbacks get ---------------------------------------------------------------
    @property
    def epochs(self) -> int:
        return self.cfg.epochs

    @property
    def steps_per_epoch(self) -> int:
        steps = math.ceil(self.strategy.examples() / self.cfg.batch_size)
        cap = self.cfg.max_steps_per_epoch
        return min(steps, cap) if cap else steps

    @property
    def total_steps(self) -> int:
        return self._agreed_steps * self.cfg.epochs

    def current_lr(self) -> float:
        return self.schedule.rate(self.global_step)

    def generator(self, epoch: int) -> torch.Generator:
        """The generator of all random draws of ``epoch`` (1-based) of this random stream."""
        return epoch_generator(self.seed, epoch, self.stream)

    # -- a step -------------------------------------------------------------------------------
    def compute_gradients(
        self, batch: Tensor, draws: Tensor | None, *, global_queries: int, global_batch: int
    ) -> StepResult:
        """Loss and row gradients of this rank's part of a step.

        ``batch`` holds the global batch's positives ``(b, 3)`` (in KvsAll mode, query ids
        ``(b,)``); ``draws`` the step's random draws (the shared negatives ``(chunks, n)``).
        """
        return self.strategy.gradients(
            batch,
            draws,
            global_step=self.global_step,
            global_queries=global_queries,
            global_batch=global_batch,
        )

    def train_epoch(self) -> EpochStats:
        """Run one epoch; returns its stats (also appended to :attr:`history`)."""
        epoch = self.epoch + 1
        for cb in self.callbacks:
            cb.on_epoch_start(self.view, epoch)
        self.schedule.observe(
            [float(s.extra["valid_mrr"]) for s in self.history if "valid_mrr" in s.extra]
        )
        gen = self.generator(epoch)
        n = self.strategy.examples()
        # int32 where it fits: the same permutation and generator state as int64, half the bytes
        order = torch.int32 if n <= 2**31 else torch.int64
        perm = torch.randperm(n, generator=gen, dtype=order).to(self.device)
        steps = self.steps_per_epoch
        bs = self.cfg.batch_size
        loss_total, queries_total = 0.0, 0
        start = time.perf_counter()
        lr = self.current_lr()
        for step in range(steps):
            batch = self.strategy.batch(perm[step * bs : (step + 1) * bs])
            b = int(batch.shape[0])
            draws = self.strategy.draw(b, gen)
            batch, draws = self.exchange.pull(self.strategy, batch, draws)
            result = self.compute_gradients(
                batch, draws, global_queries=self.strategy.global_queries(b), global_batch=b
            )
            grads = self.exchange.step(result.grads)
            clip_grad_norm(grads, self.cfg.clip_grad_norm, self.exchange)
            lr = self.current_lr()
            self.optimizer.step(grads, lr=lr)
            self.global_step += 1
            loss_total += result.loss_sum
            queries_total += result.queries
            step_loss = result.loss_sum / max(1, result.queries)  # this part's mean
            for cb in self.callbacks:
                cb.on_batch_end(self.view, epoch, step + 1, steps, step_loss)
        triples = self.strategy.triples_covered(n if steps * bs >= n else steps * bs)
        loss_total, queries_total, triples = self.exchange.epoch_end(
            self, loss_total, queries_total, triples
        )
        self.global_step = self.exchange.agree_steps(self.global_step)
        if not math.isfinite(loss_total):  # before the epoch counts: nothing of it is committed
            raise Diverged(
                f"epoch {epoch}: the training loss is {loss_total / max(1, queries_total)}: "
                f"training diverged (try a lower training.lr than {self.cfg.lr:g}, or "
                "training.clip_grad_norm)"
            )
        seconds = time.perf_counter() - start
        self.epoch = epoch
        stats = EpochStats(
            epoch=epoch,
            loss=loss_total / max(1, queries_total),
            triples=triples,
            seconds=seconds,
            lr=lr,
            steps=steps,
        )
        stats.extra.update(self.exchange.pop_stats())
        if "comm_seconds" in stats.extra:
            stats.extra["compute_seconds"] = seconds - stats.extra["comm_seconds"]
        for cb in self.callbacks:
            cb.on_epoch_end(self.view, stats)
        self.history.append(stats)
        return stats

    # -- checkpoints ----------------------------------------------------------------------------
    def state(self, history: Sequence[EpochStats] | None = None) -> TrainState:
        """The resumable state (live tensors: snapshot it before training goes on)."""
        rows = self.history if history is None else history
        return TrainState(
            epoch=self.epoch,
            global_step=self.global_step,
            tables=dict(self.tables),
            optimizer=self.optimizer.state_dict(),
            history=[s.as_dict() for s in rows],
            rng=torch.get_rng_state(),
        )

    def load_state(self, state: TrainState) -> None:
        """Continue from ``state`` (tables, optimiser, counters and history)."""
        with torch.no_grad():
            for name, table in self.tables.items():
                if state.tables[name].shape != table.shape:
                    raise ValueError(
                        f"checkpoint table {name} has shape {tuple(state.tables[name].shape)}, "
                        f"the model {tuple(table.shape)}"
                    )
                table.copy_(state.tables[name])
        self.optimizer.load_state_dict(state.optimizer)
        self.epoch = state.epoch
        self.global_step = state.global_step
        self.history = [EpochStats.from_dict(h) for h in state.history]
        self.exchange.loaded(self)

    def fit(self, epochs: int | None = None, *, until: int | None = None) -> list[EpochStats]:
        """Train until ``training.epochs`` (or ``epochs`` more, or epoch ``until``) are done."""
        if until is not None:
            target = until
        else:
            target = self.cfg.epochs if epochs is None else self.epoch + epochs
        if target > self.cfg.epochs and not self.schedule.extendable:
            raise ValueError(
                f"training.schedule={self.cfg.schedule} reaches 0 at training.epochs="
                f"{self.cfg.epochs}: epochs past it would train at rate 0 (set training.epochs)"
            )
        for cb in self.callbacks:
            cb.on_train_start(self.view)
        while self.epoch < target:
            self.train_epoch()
        for cb in self.callbacks:
            cb.on_train_end(self.view)
        return self.history
