"""The training loop: one process here, written so that every rank of a gang can run it.

A step is three explicit phases:

1. :meth:`Trainer.compute_gradients` -- this rank's share of the global batch gives a loss and,
   per table, the gradient of the rows it touched (:class:`~kgpipe.training.optim.RowGrad`). The
   loss is normalised by the *global* batch, so summing the ranks' gradients gives exactly the
   single-process gradient.
2. :meth:`Exchange.step` -- identity in one process; in a gang it sums the ranks' gradients.
3. the row-wise optimiser applies the (clipped) gradients to the touched rows only.

In a gang with step-level synchronisation every rank builds the same global batch and computes
the part ``part = (index, count)`` of it (whole chunks of shared negatives, or a slice of rows);
with epoch-level synchronisation every rank trains its own data and :meth:`Exchange.epoch_end`
combines the models.

Randomness: every epoch draws its permutation and its negatives from one ``torch.Generator``
seeded by ``(seed, epoch, stream)`` -- ``stream`` is the rank when ranks train different data and
0 when they share the global batch; nothing else is random, so the same config and seed give
bit-identical parameters on CPU, and a run resumed at an epoch boundary replays the same draws.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kgpipe.checkpoint import TrainState
from kgpipe.config import DropoutConfig, RegularizerConfig, TrainingConfig
from kgpipe.devices import resolve_precision
from kgpipe.models.interactions import BilinearInteraction, ComplEx, RotatE
from kgpipe.models.model import KGEModel
from kgpipe.training.losses import (
    linear_softmax_cross_entropy,
    negative_sampling_loss,
    one_vs_all_loss,
)
from kgpipe.training.optim import RowGrad, RowOptimizer, build_optimizer, lr_at, plateau_lr

__all__ = [
    "Callback",
    "EpochStats",
    "Exchange",
    "StepResult",
    "Trainer",
    "derive_seed",
]


def derive_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers (e.g. seed, epoch, rank) by NumPy's SeedSequence."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


# Tag that keeps dropout draws apart from every other seed derived from (seed, ...).
_DROPOUT_STREAM = 0xD20
_TABLE_KEY = 0x7FFFFFFF  # the key of the per-step table masks (chunk keys are chunk ids)


def _keep(gen: torch.Generator, shape: tuple[int, ...], p: float) -> Tensor:
    """Inverted-dropout multipliers of ``shape``: 0 with probability ``p``, else ``1/(1-p)``."""
    return (torch.rand(shape, generator=gen) >= p).float().div_(1.0 - p)


@dataclass
class StepResult:
    """What one rank computed for one step."""

    loss_sum: float  # sum of per-query losses of this rank (before normalisation)
    queries: int  # queries this rank scored
    grads: dict[str, RowGrad]


@dataclass
class EpochStats:
    """Per-epoch numbers; callbacks may add entries to ``extra`` (e.g. validation metrics)."""

    epoch: int
    loss: float
    triples: int
    seconds: float
    lr: float
    steps: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def triples_per_s(self) -> float:
        return self.triples / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "loss": self.loss,
            "triples": self.triples,
            "triples_per_s": self.triples_per_s,
            "seconds": self.seconds,
            "lr": self.lr,
            "steps": self.steps,
        }
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> EpochStats:
        """Inverse of :meth:`as_dict` (``triples_per_s`` is derived, so dropped)."""
        s = dict(row)
        s.pop("triples_per_s", None)
        core = {k: s.pop(k) for k in ("epoch", "loss", "triples", "seconds", "lr", "steps")}
        return cls(**core, extra=s)


class Callback:
    """Hooks into the training loop; override what you need (all are no-ops)."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first epoch."""

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        """Before an epoch (1-based ``epoch``)."""

    def on_batch_end(
        self, trainer: Trainer, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        """After a step: ``step`` of ``steps`` in this epoch, the step's mean loss."""

    def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
        """After an epoch; may add to ``stats.extra``."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last epoch."""


def _row_grad(rows: Tensor, leaf: Tensor) -> RowGrad:
    """The gradient of a gathered leaf (zeros if the loss did not depend on it)."""
    return RowGrad(rows, leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))


class Exchange:
    """How a gang of ranks combines its work (the identity in one process)."""

    def bind(self, trainer: Trainer) -> None:
        """Called once by the trainer that uses this exchange."""

    def step(self, grads: dict[str, RowGrad]) -> dict[str, RowGrad]:
        """Combine the ranks' row gradients of one step (step-level synchronisation)."""
        return grads

    def epoch_end(
        self, trainer: Trainer, loss_sum: float, queries: int, triples: int
    ) -> tuple[float, int, int]:
        """Combine models after an epoch (epoch-level synchronisation); return the global
        ``(loss_sum, queries, triples)`` of the epoch."""
        return loss_sum, queries, triples

    def pop_stats(self) -> dict[str, Any]:
        """Communication statistics since the last call (seconds, bytes sent, ...)."""
        return {}


class _KvsAllIndex:
    """Training queries ``(anchor, relation, side)`` with their true answers in CSR form."""

    def __init__(self, train: Tensor, num_relations: int, reciprocal: bool) -> None:
        h, r, t = train[:, 0], train[:, 1], train[:, 2]
        if reciprocal:
            anchors = torch.cat((h, t))
            rels = torch.cat((r, r + num_relations))
            answers = torch.cat((t, h))
            sides = torch.zeros(anchors.shape[0], dtype=torch.long, device=train.device)
            nrel = 2 * num_relations
        else:
            anchors = torch.cat((h, t))
            rels = torch.cat((r, r))
            answers = torch.cat((t, h))
            sides = torch.cat((torch.zeros_like(h), torch.ones_like(t)))
            nrel = num_relations
        key = (sides * (int(anchors.max()) + 1) + anchors) * nrel + rels
        order = torch.argsort(key, stable=True)
        key, answers = key[order], answers[order]
        _, counts = torch.unique_consecutive(key, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        o = order[first]
        self.anchor = anchors[o]
        self.relation = rels[o]
        self.side = sides[o]
        self.offsets = torch.cat(
            (torch.zeros(1, dtype=torch.long, device=train.device), torch.cumsum(counts, 0))
        )
        self.answers = answers

    def __len__(self) -> int:
        return int(self.anchor.shape[0])

    def labels(self, queries: Tensor, num_entities: int) -> Tensor:
        start, end = self.offsets[queries], self.offsets[queries + 1]
        counts = end - start
        dev = queries.device
        row = torch.repeat_interleave(torch.arange(queries.shape[0], device=dev), counts)
        pos = torch.repeat_interleave(start - torch.cumsum(counts, 0) + counts, counts)
        pos = pos + torch.arange(row.shape[0], device=dev)
        out = torch.zeros(queries.shape[0], num_entities, device=dev)
        out[row, self.answers[pos]] = 1.0
        return out


class Trainer:
    """Trains a :class:`KGEModel` in place on integer triples ``(n, 3)``."""

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
    ) -> None:
        if train.ndim != 2 or train.shape[1] != 3:
            raise ValueError("train must have shape (n, 3)")
        self.model = model
        # training happens where the model's tables are (model.to(device) before this)
        self.device = model.entity.device
        self.train_triples = train.long().to(self.device)
        self.cfg = training
        # fp32 or bf16 score products (training.precision: auto decides by model and device)
        self.bf16 = resolve_precision(training.precision, model.spec.name, self.device) == "bf16"
        self.reg = regularizer
        self.dropout = dropout if dropout is not None and dropout.active else None
        self.seed = seed
        self.stream = stream
        self.part = part
        self.callbacks = list(callbacks)
        self.exchange = exchange or Exchange()
        self.tables = {"entity": model.entity.data, "relation": model.relation.data}
        self.optimizer = optimizer or build_optimizer(
            training.optimizer, self.tables, lr=training.lr, betas=training.betas, eps=training.eps
        )
        self.kvsall = (
            _KvsAllIndex(self.train_triples, model.spec.num_relations, model.spec.reciprocal)
            if training.mode == "kvsall"
            else None
        )
        if training.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.epoch = 0  # epochs completed
        self.global_step = 0
        self.history: list[EpochStats] = []
        self._plateau_cache: tuple[int, float] | None = None  # (len(history), rate)
        self.stop_requested = False
        self.exchange.bind(self)

    # -- schedule -------------------------------------------------------------------------------
    @property
    def examples_per_epoch(self) -> int:
        return len(self.kvsall) if self.kvsall is not None else int(self.train_triples.shape[0])

    @property
    def steps_per_epoch(self) -> int:
        steps = math.ceil(self.examples_per_epoch / self.cfg.batch_size)
        cap = self.cfg.max_steps_per_epoch
        return min(steps, cap) if cap else steps

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.cfg.epochs

    def current_lr(self) -> float:
        c = self.cfg
        if c.schedule == "plateau":
            return lr_at(
                self.global_step,
                base=self._plateau_base(),
                warmup_steps=c.warmup_steps,
                total_steps=self.total_steps,
                schedule="constant",
            )
        return lr_at(
            self.global_step,
            base=c.lr,
            warmup_steps=c.warmup_steps,
            total_steps=self.total_steps,
            schedule=c.schedule,
        )

    def _plateau_base(self) -> float:
        """The rate the valid MRRs in :attr:`history` leave (``schedule: plateau``); computed
        once per epoch (history only grows between :meth:`load_state` calls, which reset it)."""
        if self._plateau_cache is None or self._plateau_cache[0] != len(self.history):
            scores = [float(s.extra["valid_mrr"]) for s in self.history if "valid_mrr" in s.extra]
            p = self.cfg.plateau
            rate = plateau_lr(
                self.cfg.lr,
                scores,
                factor=p.factor,
                patience=p.patience,
                threshold=p.threshold,
                min_lr=p.min_lr,
            )
            self._plateau_cache = (len(self.history), rate)
        return self._plateau_cache[1]

    def generator(self, epoch: int) -> torch.Generator:
        """The generator of all random draws of ``epoch`` (1-based) of this random stream."""
        return torch.Generator().manual_seed(derive_seed(self.seed, epoch, self.stream))

    # -- dropout --------------------------------------------------------------------------------
    # Masks are drawn on the CPU from a generator seeded by (seed, stream, global step, key): a
    # step's masks do not depend on the device, on how ranks split the step, or on a resume.
    def _dropout_gen(self, key: int) -> torch.Generator:
        seed = derive_seed(self.seed, self.stream, self.global_step, key, _DROPOUT_STREAM)
        return torch.Generator().manual_seed(seed)

    def _chunk_dropout(
        self, chunk_ids: Tensor, c: int, n: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """Multipliers for the heads, tails, negatives ``(k, c|n, d)`` and relations of the
        negative-sampling chunks with global ids ``chunk_ids`` (one generator per chunk)."""
        if self.dropout is None:
            return None
        pe, pr = self.dropout.entity, self.dropout.relation
        de, dr = self.tables["entity"].shape[1], self.tables["relation"].shape[1]
        parts: list[list[Tensor]] = [[], [], [], []]
        for g in chunk_ids.tolist():
            gen = self._dropout_gen(int(g))
            draws = (_keep(gen, (c, de), pe), _keep(gen, (c, de), pe), _keep(gen, (n, de), pe))
            for i, m in enumerate((*draws, _keep(gen, (c, dr), pr))):
                parts[i].append(m)
        h, t, neg, r = (torch.stack(p).to(self.device) for p in parts)
        return h, t, neg, r

    def _table_dropout(self, ent: Tensor, rel: Tensor, rel_rows: Tensor) -> tuple[Tensor, Tensor]:
        """The whole entity table and the gathered relation rows with this step's dropout (one
        mask per step for every rank, so the ranks of a split step agree)."""
        if self.dropout is None:
            return ent, rel
        gen = self._dropout_gen(_TABLE_KEY)
        ent = ent * _keep(gen, tuple(ent.shape), self.dropout.entity).to(self.device)
        rel_mask = _keep(gen, tuple(self.tables["relation"].shape), self.dropout.relation)
        return ent, rel * rel_mask.to(self.device)[rel_rows]

    # -- gradients ------------------------------------------------------------------------------
    def _gather(self, name: str, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Unique touched rows, a leaf copy of them requiring grad, and the inverse index."""
        rows, inv = torch.unique(ids, return_inverse=True)
        leaf = self.tables[name].index_select(0, rows).requires_grad_(True)
        return rows, leaf, inv

    def _regularization(
        self, h: Tensor, r: Tensor, t: Tensor, *, weights: Tensor | None = None
    ) -> Tensor:
        """Regularisation of the rows ``(b, d)`` of a batch's triples, weighted per triple."""
        kind, w = self.reg.type, self.reg.weight
        if kind == "none" or w == 0.0:
            return h.new_zeros(())
        inter = self.model.interaction
        if isinstance(inter, RotatE):
            r = r[..., :0]  # RotatE relations are phases: nothing to shrink
        cplx = isinstance(inter, ComplEx | RotatE)

        def penalty(x: Tensor) -> Tensor:
            if kind == "n3" and cplx:
                re, im = x.chunk(2, dim=-1)
                return (re * re + im * im).clamp_min(1e-30).pow(1.5).sum(-1)
            if kind == "n3":
                return x.abs().pow(3).sum(-1)
            return x.abs().pow(self.reg.p).sum(-1)

        per = penalty(h) + penalty(r) + penalty(t)
        if weights is not None:
            per = per * weights
        return w * per.sum()

    def compute_gradients(
        self, batch: Tensor, negatives: Tensor | None, *, global_queries: int, global_batch: int
    ) -> StepResult:
        """Loss and row gradients of this rank's part of a step.

        ``batch`` holds this rank's positives ``(b, 3)`` (or, in KvsAll mode, query ids ``(b,)``);
        ``negatives`` the shared negative entities ``(chunks, n)`` of its chunks.
        """
        mode = self.cfg.mode
        if mode != "negative_sampling" and self.part[1] > 1:
            batch = batch.tensor_split(self.part[1])[self.part[0]]
        if mode == "negative_sampling":
            assert negatives is not None
            return self._ns_gradients(batch, negatives, global_queries, global_batch)
        if mode == "1vsall":
            return self._one_vs_all_gradients(batch, global_queries, global_batch)
        return self._kvsall_gradients(batch, global_queries)

    def _side_chunks(self, batch: Tensor, num_chunks: int) -> tuple[Tensor, Tensor]:
        """Pad a side's positives to ``num_chunks`` chunks: triples ``(c, C, 3)``, weights."""
        c = self.cfg.chunk_size
        n = batch.shape[0]
        pad = num_chunks * c - n
        weights = torch.ones(num_chunks * c, device=self.device)
        if pad:
            batch = torch.cat((batch, batch[:1].expand(pad, 3)))
            weights[n:] = 0.0
        return batch.view(num_chunks, c, 3), weights

    def _ns_gradients(
        self, batch: Tensor, negatives: Tensor, global_queries: int, global_batch: int
    ) -> StepResult:
        inter = self.model.interaction
        spec = self.model.spec
        c, n = self.cfg.chunk_size, negatives.shape[1]
        n_tail = (batch.shape[0] + 1) // 2
        sides = [("tail", batch[:n_tail]), ("head", batch[n_tail:])]
        chunk_counts = [math.ceil(s.shape[0] / c) for _, s in sides]
        assert sum(chunk_counts) == negatives.shape[0], "one negative set per chunk"
        ent_table, rel_table = self.tables["entity"], self.tables["relation"]

        # Every use of a table is its own autograd leaf gathered with index_select: backward then
        # stops at the gathered rows, and one index_add_ per table coalesces their gradients.
        # (Letting autograd scatter into one leaf costs a zero-filled table copy per use.)
        leaves: dict[str, list[tuple[Tensor, Tensor]]] = {"entity": [], "relation": []}

        def gather(table: str, ids: Tensor, shape: tuple[int, ...]) -> Tensor:
            src = ent_table if table == "entity" else rel_table
            leaf = src.index_select(0, ids.reshape(-1)).requires_grad_(True)
            leaves[table].append((ids.reshape(-1), leaf))
            return leaf.view(*shape, -1)

        total = ent_table.new_zeros(())
        loss_sum = 0.0
        regularize = self.reg.type != "none" and self.reg.weight > 0
        chunk_off = 0
        index, count = self.part
        queries = 0
        for (side, pos), n_chunks in zip(sides, chunk_counts, strict=True):
            if not n_chunks:
                continue
            triples, weights = self._side_chunks(pos, n_chunks)
            # this part's chunks: global chunk ids congruent to the part index
            ids = torch.arange(n_chunks, device=self.device)
            mine = ids[(ids + chunk_off) % count == index]
            chunk_neg = negatives[chunk_off + mine]
            masks = self._chunk_dropout((chunk_off + mine).cpu(), c, n)
            chunk_off += n_chunks
            nc = int(mine.numel())
            if not nc:
                continue
            triples = triples[mine]
            weights = weights.view(n_chunks, c)[mine].reshape(-1)
            queries += int(weights.sum())
            h = gather("entity", triples[..., 0], (nc, c))
            t = gather("entity", triples[..., 2], (nc, c))
            rel_ids = triples[..., 1]
            if side == "head" and spec.reciprocal:
                rel_ids = rel_ids + spec.num_relations  # head queries use the inverse relation
            r = gather("relation", rel_ids, (nc, c))
            cand = gather("entity", chunk_neg, (nc, n))
            h_raw, r_raw, t_raw = h, r, t  # regularised before dropout
            if masks is not None:
                h, t, cand, r = h * masks[0], t * masks[1], cand * masks[2], r * masks[3]
            with self._scoring():
                if side == "tail":
                    pos_score = inter.score(h, r, t)
                    neg_score = inter.score_tails(h, r, cand)
                elif spec.reciprocal:
                    pos_score = inter.score(t, r, h)
                    neg_score = inter.score_tails(t, r, cand)
                else:
                    pos_score = inter.score(h, r, t)
                    neg_score = inter.score_heads(r, t, cand)
            pos_score, neg_score = pos_score.float(), neg_score.float()
            per = negative_sampling_loss(
                self.cfg.loss,
                pos_score.reshape(-1),
                neg_score.reshape(-1, n),
                margin=self.cfg.margin,
                temperature=self.cfg.adversarial_temperature,
                label_smoothing=self.cfg.label_smoothing,
            )
            weighted = (per * weights).sum()
            total = total + weighted / global_queries
            loss_sum += float(weighted.detach())
            if regularize:
                flat = (nc * c, -1)
                reg = self._regularization(
                    h_raw.reshape(flat), r_raw.reshape(flat), t_raw.reshape(flat), weights=weights
                )
                total = total + reg / global_batch
        if leaves["entity"]:
            total.backward()
        grads = {name: self._coalesce(uses, name) for name, uses in leaves.items()}
        return StepResult(loss_sum=loss_sum, queries=queries, grads=grads)

    def _coalesce(self, uses: list[tuple[Tensor, Tensor]], table: str) -> RowGrad:
        """Sum the gradients of gathered rows per unique row id."""
        if not uses:  # this part had no work in this step
            width = self.tables[table].shape[1]
            return RowGrad(
                torch.zeros(0, dtype=torch.long, device=self.device),
                torch.zeros(0, width, device=self.device),
            )
        ids = torch.cat([i for i, _ in uses])
        rows, inv, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        values = torch.cat(
            [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for _, leaf in uses]
        )
        out = values.new_zeros(rows.shape[0], values.shape[1])
        out.index_add_(0, inv, values)
        return RowGrad(rows, out, counts)

    def _scoring(self) -> contextlib.AbstractContextManager[Any]:
        """Where scores are computed: bf16 autocast of the matrix products in mixed precision.

        Only the products run in bfloat16 (with float32 accumulation); the tables, the loss and
        the gradients handed to the optimiser stay float32.
        """
        if self.bf16:
            device = self.tables["entity"].device.type
            return torch.autocast(device_type=device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _all_entities(self) -> tuple[Tensor, Tensor]:
        table = self.tables["entity"]
        rows = torch.arange(table.shape[0], device=table.device)
        # a leaf sharing the table's storage: the table changes only in the optimiser step,
        # after backward, so no copy of it is needed
        return rows, table.detach().requires_grad_(True)

    def _one_vs_all_gradients(
        self, batch: Tensor, global_queries: int, global_batch: int
    ) -> StepResult:
        inter = self.model.interaction
        spec = self.model.spec
        h_id, r_id, t_id = batch[:, 0], batch[:, 1], batch[:, 2]
        ent_rows, ent = self._all_entities()
        rel_ids = torch.cat((r_id, r_id + spec.num_relations)) if spec.reciprocal else r_id
        rel_rows, rel, rel_inv = self._gather("relation", rel_ids)
        b = batch.shape[0]
        # regularised before dropout (gathered only when there is a penalty)
        reg_rows = (
            (ent[h_id], rel[rel_inv[:b]], ent[t_id])
            if self.reg.type != "none" and self.reg.weight
            else None
        )
        ent_leaf, rel_leaf = ent, rel
        ent, rel = self._table_dropout(ent, rel, rel_rows)
        h, t = ent[h_id], ent[t_id]
        r = rel[rel_inv[:b]]
        targets = torch.cat((t_id, h_id))
        if (
            spec.reciprocal
            and self.cfg.loss == "cross_entropy"
            and isinstance(inter, BilinearInteraction)
        ):
            # scores and loss fused, block by block: no (2b, E) score matrix
            queries = inter.tail_query(torch.cat((h, t)), torch.cat((r, rel[rel_inv[b:]])))
            loss = linear_softmax_cross_entropy(
                queries,
                ent,
                targets,
                label_smoothing=self.cfg.label_smoothing,
                dtype=torch.bfloat16 if self.bf16 else None,
                block=max(64, min(1024, (1 << 23) // ent.shape[0])),
            )
        else:
            # Tail queries (h, r, ?) then head queries (?, r, t); the loss takes all 2b rows at
            # once (slicing the score matrix would cost a zero-filled copy of it in backward).
            with self._scoring():
                if spec.reciprocal:  # head queries as (t, r⁻¹, ?): one product for both
                    scores = inter.score_tails(
                        torch.cat((h, t)), torch.cat((r, rel[rel_inv[b:]])), ent
                    )
                else:
                    scores = torch.cat((inter.score_tails(h, r, ent), inter.score_heads(r, t, ent)))
            loss = one_vs_all_loss(
                self.cfg.loss,
                scores if self.cfg.loss == "cross_entropy" else scores.float(),
                targets,
                label_smoothing=self.cfg.label_smoothing,
            ).sum()
        return self._finish_one_vs_all(
            loss, reg_rows, ent_rows, ent_leaf, rel_rows, rel_leaf, b, global_queries, global_batch
        )

    def _finish_one_vs_all(
        self,
        loss: Tensor,
        reg_rows: tuple[Tensor, Tensor, Tensor] | None,
        ent_rows: Tensor,
        ent: Tensor,
        rel_rows: Tensor,
        rel: Tensor,
        b: int,
        global_queries: int,
        global_batch: int,
    ) -> StepResult:
        total = loss / global_queries
        if reg_rows is not None:
            total = total + self._regularization(*reg_rows) / global_batch
        total.backward()
        return StepResult(
            loss_sum=float(loss.detach()),
            queries=2 * b,
            grads={"entity": _row_grad(ent_rows, ent), "relation": _row_grad(rel_rows, rel)},
        )

    def _kvsall_gradients(self, queries: Tensor, global_queries: int) -> StepResult:
        assert self.kvsall is not None
        inter = self.model.interaction
        idx = self.kvsall
        ent_rows, ent = self._all_entities()
        anchors, rels, sides = idx.anchor[queries], idx.relation[queries], idx.side[queries]
        rel_rows, rel_leaf, rel_inv = self._gather("relation", rels)
        ent_leaf = ent
        ent, rel = self._table_dropout(ent, rel_leaf, rel_rows)
        a, r = ent[anchors], rel[rel_inv]
        tail = (sides == 0).nonzero().squeeze(-1)
        head = (sides == 1).nonzero().squeeze(-1)
        order = torch.cat((tail, head))
        labels = idx.labels(queries[order], ent.shape[0])
        with self._scoring():
            scores = torch.cat(
                (
                    inter.score_tails(a[tail], r[tail], ent),
                    inter.score_heads(r[head], a[head], ent),
                )
            ).float()
        loss = one_vs_all_loss(
            self.cfg.loss, scores, labels, label_smoothing=self.cfg.label_smoothing
        ).sum()
        (loss / global_queries).backward()
        return StepResult(
            loss_sum=float(loss.detach()),
            queries=int(queries.shape[0]),
            grads={
                "entity": _row_grad(ent_rows, ent_leaf),
                "relation": _row_grad(rel_rows, rel_leaf),
            },
        )

    # -- optimisation ---------------------------------------------------------------------------
    def _clip(self, grads: dict[str, RowGrad]) -> None:
        max_norm = self.cfg.clip_grad_norm
        if max_norm is None:
            return
        norm = math.sqrt(sum(float(g.values.pow(2).sum()) for g in grads.values()))
        if norm > max_norm:
            scale = max_norm / (norm + 1e-12)
            for g in grads.values():
                g.values.mul_(scale)

    def _draw_negatives(self, batch_size: int, gen: torch.Generator) -> Tensor | None:
        """The shared negatives ``(chunks, n)`` of a global batch (negative sampling only).

        The whole global batch's negatives are drawn in one call, so the draw does not depend on
        how a distributed run later splits the chunks across ranks.
        """
        if self.cfg.mode != "negative_sampling":
            return None
        c = self.cfg.chunk_size
        n_tail = (batch_size + 1) // 2
        n_chunks = math.ceil(n_tail / c) + math.ceil((batch_size - n_tail) / c)
        # drawn with the CPU generator wherever training runs: the same draws on any device
        return torch.randint(
            0, self.model.spec.num_entities, (n_chunks, self.cfg.negatives), generator=gen
        ).to(self.device)

    def train_epoch(self) -> EpochStats:
        """Run one epoch; returns its stats (also appended to :attr:`history`)."""
        epoch = self.epoch + 1
        for cb in self.callbacks:
            cb.on_epoch_start(self, epoch)
        gen = self.generator(epoch)
        n = self.examples_per_epoch
        perm = torch.randperm(n, generator=gen).to(self.device)
        steps = self.steps_per_epoch
        bs = self.cfg.batch_size
        loss_total, queries_total = 0.0, 0
        start = time.perf_counter()
        lr = self.current_lr()
        for step in range(steps):
            ids = perm[step * bs : (step + 1) * bs]
            batch = ids if self.kvsall is not None else self.train_triples[ids]
            b = int(batch.shape[0])
            negatives = self._draw_negatives(b, gen)
            global_queries = 2 * b if self.cfg.mode == "1vsall" else b
            result = self.compute_gradients(
                batch, negatives, global_queries=global_queries, global_batch=b
            )
            grads = self.exchange.step(result.grads)
            self._clip(grads)
            lr = self.current_lr()
            self.optimizer.step(grads, lr=lr)
            self.global_step += 1
            loss_total += result.loss_sum
            queries_total += result.queries
            step_loss = result.loss_sum / max(1, result.queries)  # this part's mean
            for cb in self.callbacks:
                cb.on_batch_end(self, epoch, step + 1, steps, step_loss)
        full = steps * bs >= n
        if self.kvsall is None:
            triples = n if full else steps * bs
        else:  # KvsAll steps over queries; report the training triples they cover
            triples = int(self.train_triples.shape[0]) if full else steps * bs
        loss_total, queries_total, triples = self.exchange.epoch_end(
            self, loss_total, queries_total, triples
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
            cb.on_epoch_end(self, stats)
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
        self._plateau_cache = None

    def fit(self, epochs: int | None = None, *, until: int | None = None) -> list[EpochStats]:
        """Train until ``training.epochs`` (or ``epochs`` more, or epoch ``until``) are done."""
        if until is not None:
            target = until
        else:
            target = self.cfg.epochs if epochs is None else self.epoch + epochs
        for cb in self.callbacks:
            cb.on_train_start(self)
        while self.epoch < target and not self.stop_requested:
            self.train_epoch()
        for cb in self.callbacks:
            cb.on_train_end(self)
        return self.history
