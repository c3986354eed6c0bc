"""Gradient and model exchange between the ranks of a gang (torch.distributed collectives).

Two primitives, both ending with the same result on every rank:

* :func:`Comm.dense_sum` -- ``all_reduce(SUM)`` of one flat buffer (small tables are bucketed into
  it together with their touched-row masks).
* :func:`Comm.sparse_sum` -- every rank contributes ``(rows, values)`` of the rows it touched;
  ``all_gather`` of the padded rows and values, then a per-row sum in rank order (deterministic,
  so ranks stay bit-identical). With ``compression`` the values travel as int8 with one float
  scale per row, or as the top-k rows by norm with error feedback (what is not sent is kept and
  added to the row's next contribution).

Bytes are counted from the tensors handed to each collective: an ``all_gather`` sends this rank's
payload to the ``W - 1`` others; a ring ``all_reduce`` sends ``2 (W - 1) / W`` of the buffer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from kgpipe.training.exchange import Exchange, Trainable
from kgpipe.training.optim import RowGrad

__all__ = ["Comm", "EpochExchange", "StepExchange"]


@dataclass
class Comm:
    """Collectives over the default process group, with time and byte accounting."""

    world_size: int
    compression: str = "none"
    topk_ratio: float = 0.1
    #: where exchanged tensors live: the training device (CUDA for NCCL, CPU for gloo)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seconds: float = 0.0
    bytes_sent: int = 0
    calls: int = 0
    residual: dict[str, Tensor] = field(default_factory=dict)

    def pop_stats(self) -> dict[str, Any]:
        out = {
            "comm_seconds": self.seconds,
            "bytes_sent": self.bytes_sent,
            "collectives": self.calls,
            "world_size": self.world_size,
        }
        self.seconds, self.bytes_sent, self.calls = 0.0, 0, 0
        return out

    # -- primitives -------------------------------------------------------------------------
    def _all_gather(self, t: Tensor) -> list[Tensor]:
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        t0 = time.perf_counter()
        dist.all_gather(out, t.contiguous())
        self.seconds += time.perf_counter() - t0
        self.bytes_sent += t.numel() * t.element_size() * (self.world_size - 1)
        self.calls += 1
        return out

    def dense_sum(self, buffer: Tensor) -> Tensor:
        """In-place ``all_reduce(SUM)`` of a flat buffer."""
        t0 = time.perf_counter()
        dist.all_reduce(buffer)
        self.seconds += time.perf_counter() - t0
        w = self.world_size
        self.bytes_sent += int(buffer.numel() * buffer.element_size() * 2 * (w - 1) / w)
        self.calls += 1
        return buffer

    def max_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return int(t[0])

    def first(self, value: float) -> float:
        """Rank 0's ``value``, on every rank: one number where each rank computed its own,
        equal but for the last bits (a CPU sum's rounding follows the thread count)."""
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        t0 = time.perf_counter()
        dist.broadcast(t, src=0)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return float(t[0])

    def row_counts(self, rows: Tensor) -> list[int]:
        """How many rows each rank holds (one small all_gather)."""
        counts = self._all_gather(
            torch.tensor([rows.numel()], dtype=torch.int64, device=self.device)
        )
        return [int(c[0]) for c in counts]

    def sparse_sum(
        self,
        key: str,
        rows: Tensor,
        values: Tensor,
        extra: Tensor | None = None,
        counts: list[int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Sum ``values`` (and uncompressed ``extra`` columns) per row over all ranks
        (``counts``: the ranks' :meth:`row_counts` of ``rows``, when already known).

        Returns the union of the rows (sorted) with their summed values and extras.
        """
        if extra is None:  # compress only what has no uncompressed companion columns
            rows, values = self._feedback(key, rows, values)
        if counts is None or self.compression == "topk":  # (top-k changes the rows)
            counts = self.row_counts(rows)
        width = max(counts)
        pad = width - rows.numel()
        d = values.shape[1]
        rows_p = torch.cat((rows, rows.new_full((pad,), -1)))
        payload: list[Tensor] = []
        if self.compression == "int8":
            scale = values.abs().amax(dim=1).clamp_min(1e-30) / 127.0
            q = torch.round(values / scale.unsqueeze(1)).to(torch.int8)
            payload = [
                torch.cat((q, q.new_zeros(pad, d))),
                torch.cat((scale, scale.new_zeros(pad))),
            ]
        else:
            payload = [torch.cat((values, values.new_zeros(pad, d)))]
        if extra is not None:
            payload.append(torch.cat((extra, extra.new_zeros(pad, extra.shape[1]))))
        # one all_gather for rows and float payloads: int64 row ids travel bit-exactly as two
        # float32 columns next to the values (and scales/extras); int8 values go separately
        floats = [p for p in payload if p.dtype == torch.float32]
        ints = [p for p in payload if p.dtype != torch.float32]
        cols = [rows_p.view(torch.float32).view(-1, 2)] + [
            p if p.dim() == 2 else p.unsqueeze(1) for p in floats
        ]
        packed = torch.cat(self._all_gather(torch.cat(cols, dim=1)))
        all_rows = packed[:, :2].contiguous().view(torch.int64).view(-1)
        unpacked, off = [], 2
        for p in floats:
            w = p.shape[1] if p.dim() == 2 else 1
            col = packed[:, off : off + w]
            unpacked.append(col if p.dim() == 2 else col.squeeze(1))
            off += w
        gathered_ints = [torch.cat(self._all_gather(p)) for p in ints]
        gathered = [gathered_ints[0], unpacked[0], *unpacked[1:]] if ints else unpacked
        keep = all_rows >= 0
        all_rows = all_rows[keep]
        if self.compression == "int8":
            vals = gathered[0][keep].float() * gathered[1][keep].unsqueeze(1)
        else:
            vals = gathered[0][keep]
        ext = gathered[-1][keep] if extra is not None else None
        out_rows, inv = torch.unique(all_rows, return_inverse=True)
        summed = vals.new_zeros(out_rows.numel(), d).index_add_(0, inv, vals)
        ext_sum = None
        if ext is not None:
            ext_sum = ext.new_zeros(out_rows.numel(), ext.shape[1]).index_add_(0, inv, ext)
        return out_rows, summed, ext_sum

    def _feedback(self, key: str, rows: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Top-k compression with error feedback.

        The stored residual of these rows is added to their values; the ``topk_ratio`` share of
        rows with the largest norm is sent, the rest becomes the new residual (and is sent when
        the row is touched again).
        """
        if self.compression != "topk" or rows.numel() == 0:
            return rows, values
        res = self.residual.get(key)
        need = int(rows.max()) + 1
        if res is None or res.shape[0] < need:  # grow lazily to the largest row seen
            grown = torch.zeros(need, values.shape[1], device=values.device)
            if res is not None:
                grown[: res.shape[0]] = res
            res = self.residual[key] = grown
        values = values + res.index_select(0, rows)
        k = max(1, round(self.topk_ratio * rows.numel()))
        top = torch.topk(values.norm(dim=1), k).indices.sort().values
        res.index_copy_(0, rows, values)
        res.index_fill_(0, rows[top], 0.0)
        return rows[top], values[top]


class StepExchange(Exchange):
    """Synchronous data parallelism: sum the ranks' row gradients every step.

    Relation tables (small) always go through one bucketed dense ``all_reduce`` together with a
    touched-row mask. Entity tables use the sparse exchange of touched rows unless ``mode`` is
    ``dense``, or ``auto`` finds the dense buffer smaller than what the ranks would gather.
    Compression forces the sparse path (an ``all_reduce`` cannot sum int8 or top-k payloads).
    """

    def __init__(
        self, comm: Comm, *, mode: str = "auto", dense_tables: tuple[str, ...] = ("relation",)
    ) -> None:
        self.comm = comm
        self.mode = mode
        self.dense_tables = dense_tables
        self._tables: dict[str, Tensor] = {}

    def bind(self, trainer: Trainable) -> None:
        self._tables = trainer.tables

    def _use_dense(self, name: str, counts: list[int] | None) -> bool:
        if self.comm.compression != "none":
            return False
        if name in self.dense_tables or self.mode == "dense":
            return True
        if self.mode == "sparse" or counts is None:
            return False
        # all_gather moves W x the most rows a rank touched; a ring all_reduce ~2 x the table.
        # Decided on every rank's count (the sparse path's own first exchange): ranks touch
        # different rows, and ranks that chose differently joined different collectives
        # (gloo killed a worker)
        return 2 * self._tables[name].shape[0] < self.comm.world_size * max(1, *counts)

    def step(self, grads: dict[str, RowGrad]) -> dict[str, RowGrad]:
        out: dict[str, RowGrad] = {}
        auto = self.mode == "auto" and self.comm.compression == "none"
        counts = {
            n: self.comm.row_counts(g.rows)
            for n, g in grads.items()
            if auto and n not in self.dense_tables
        }
        dense = [n for n in grads if self._use_dense(n, counts.get(n))]
        if dense:
            # one bucket: [table rows x (width + 1 mask column)] for every dense table
            parts = []
            for n in dense:
                t = self._tables[n]
                buf = torch.zeros(t.shape[0], t.shape[1] + 1, device=t.device)
                g = grads[n]
                buf[g.rows, :-1] = g.values
                buf[g.rows, -1] = 1.0
                parts.append(buf)
            flat = self.comm.dense_sum(torch.cat([p.reshape(-1) for p in parts]))
            off = 0
            for n, p in zip(dense, parts, strict=True):
                buf = flat[off : off + p.numel()].view_as(p)
                off += p.numel()
                rows = (buf[:, -1] > 0).nonzero().squeeze(-1)
                out[n] = RowGrad(rows, buf[rows, :-1].contiguous())
        for n, g in grads.items():
            if n in out:
                continue
            rows, values, _ = self.comm.sparse_sum(n, g.rows, g.values, counts=counts.get(n))
            out[n] = RowGrad(rows, values)
        return out

    def squared_norm(self, grads: dict[str, RowGrad]) -> float:
        """Rank 0's: every rank holds the same summed gradient, but a CPU sum of it rounds by
        the thread count, and ranks of other thread counts that clipped by their own norm
        applied other updates to replicas that must stay identical (and never re-synced)."""
        return self.comm.first(super().squared_norm(grads))

    def epoch_end(
        self, trainer: Trainable, loss_sum: float, queries: int, triples: int
    ) -> tuple[float, int, int]:
        # every rank saw the whole global batch: triples are already global
        buf = self.comm.dense_sum(
            torch.tensor([loss_sum, float(queries)], dtype=torch.float64, device=self.comm.device)
        )
        return float(buf[0]), int(buf[1]), triples

    def pop_stats(self) -> dict[str, Any]:
        return self.comm.pop_stats()


class EpochExchange(Exchange):
    """Model averaging once per epoch.

    Every rank starts the epoch from the same parameters and trains its own shards. At the end,
    for every row, the ranks' parameter changes are averaged weighted by how many samples touched
    the row on each rank; the optimiser state is combined with the same weights, so all ranks
    continue from identical parameters and state. This is model averaging, not gradient
    aggregation: it trades some quality per epoch for one exchange per epoch.
    """

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self._start: dict[str, Tensor] = {}
        self._counts: dict[str, Tensor] = {}

    def bind(self, trainer: Trainable) -> None:
        self._snapshot(trainer)

    def loaded(self, trainer: Trainable) -> None:
        # the epoch starts from the loaded tables: averaged from the fresh ones, the same sum
        # rounded otherwise (6e-8 apart from a run that went on, a reviewer measured)
        self._snapshot(trainer)

    def agree_steps(self, steps: int) -> int:
        # ranks hold unequal shares (16 shards over 3 ranks) and step unequally: every rank
        # counts with the largest share's steps, which rank 0 commits and every rank of a
        # resumed gang loads (dropout masks and learning rates follow the global step: a
        # resume changed training, and a linear schedule ended early on the smaller ranks)
        return self.comm.max_int(steps)

    def _snapshot(self, trainer: Trainable) -> None:
        self._start = {k: t.clone() for k, t in trainer.tables.items()}
        self._counts = {
            k: torch.zeros(t.shape[0], device=t.device) for k, t in trainer.tables.items()
        }

    def step(self, grads: dict[str, RowGrad]) -> dict[str, RowGrad]:
        for name, g in grads.items():
            c = (
                g.counts.float()
                if g.counts is not None
                else torch.ones(g.rows.numel(), device=g.rows.device)
            )
            self._counts[name].index_add_(0, g.rows, c)
        return grads

    def epoch_end(
        self, trainer: Trainable, loss_sum: float, queries: int, triples: int
    ) -> tuple[float, int, int]:
        opt = trainer.optimizer
        state = opt.state_dict()
        for name, table in trainer.tables.items():
            counts = self._counts[name]
            rows = (counts > 0).nonzero().squeeze(-1)
            c = counts[rows].unsqueeze(1)
            delta = (table[rows] - self._start[name][rows]) * c
            slots = [k for k in state if k.startswith(f"{name}.")]
            extra = torch.cat([c] + [state[k][rows] * c for k in slots], dim=1)
            out_rows, summed, ext = self.comm.sparse_sum(f"epoch.{name}", rows, delta, extra)
            assert ext is not None
            total = ext[:, :1]
            table[out_rows] = self._start[name][out_rows] + summed / total
            for i, k in enumerate(slots, start=1):
                w = state[k].shape[1]
                state[k][out_rows] = ext[:, 1 + (i - 1) * w : 1 + i * w] / total
        opt.step_count = self.comm.max_int(opt.step_count)
        buf = self.comm.dense_sum(
            torch.tensor(
                [loss_sum, float(queries), float(triples)],
                dtype=torch.float64,
                device=self.comm.device,
            )
        )
        self._snapshot(trainer)
        return float(buf[0]), int(buf[1]), int(buf[2])

    def pop_stats(self) -> dict[str, Any]:
        return self.comm.pop_stats()
