"""Row-wise sparse optimisers for embedding tables.

A step receives, per table, the ids of the rows a batch touched (unique) and their gradients.
Only those rows and their optimiser state change; untouched rows keep both parameters and state
("lazy" updates, as in PyTorch-BigGraph and torch's SparseAdam). On rows that are touched at every
step this is exactly dense Adam / Adagrad (tested against ``torch.optim``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from kgpipe.registry import Registry

__all__ = [
    "OPTIMIZERS",
    "RowAdagrad",
    "RowAdam",
    "RowGrad",
    "RowOptimizer",
    "build_optimizer",
]


@dataclass
class RowGrad:
    """Gradient of a table restricted to its touched rows (``rows`` unique)."""

    rows: Tensor  # int64 (u,)
    values: Tensor  # float (u, d)
    counts: Tensor | None = None  # int64 (u,): how many samples touched each row


class RowOptimizer(ABC):
    """Base: holds per-table state tensors shaped like the tables.

    Every optimiser takes the options of ``training`` it might use (``lr``, ``betas``, ``eps``).
    """

    name: ClassVar[str]

    def __init__(
        self,
        tables: dict[str, Tensor],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.tables = tables
        self.lr = lr
        self.eps = eps
        self.step_count = 0

    def step(self, grads: dict[str, RowGrad], *, lr: float | None = None) -> None:
        self.step_count += 1
        lr = self.lr if lr is None else lr
        for name, g in grads.items():
            if not g.rows.numel():
                continue
            if _covers_in_order(g.rows, self.tables[name].shape[0]):
                self._update_all(name, g.values, lr)
            else:
                self._update(name, g.rows, g.values, lr)

    @abstractmethod
    def _update(self, name: str, rows: Tensor, grad: Tensor, lr: float) -> None:
        """Apply one step to ``rows`` of table ``name``."""

    @abstractmethod
    def _update_all(self, name: str, grad: Tensor, lr: float) -> None:
        """Apply one step to every row of table ``name`` (``grad`` shaped like the table), in
        place: the same arithmetic as :meth:`_update` without gathering and scattering rows."""

    @abstractmethod
    def state_dict(self) -> dict[str, Tensor]:
        """State tensors keyed ``{table}.{slot}`` plus ``step`` (safetensors-friendly)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore what :meth:`state_dict` returned."""


OPTIMIZERS: Registry[RowOptimizer] = Registry(
    "optimizer", doc="row-wise sparse optimisers: training.optimizer"
)


def _covers_in_order(rows: Tensor, n: int) -> bool:
    """Whether unique ``rows`` are ``0..n-1`` in order (a 1-vs-all step touches every entity).

    Unique ids in ``[0, n)`` that number ``n`` are a permutation; ascending, the identity."""
    if rows.numel() != n:
        return False
    return n < 2 or bool((rows[1:] > rows[:-1]).all())


@OPTIMIZERS.register("adam")
class RowAdam(RowOptimizer):
    """Adam with lazy row-wise moments; bias correction uses the global step count."""

    def __init__(
        self,
        tables: dict[str, Tensor],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        super().__init__(tables, lr=lr, betas=betas, eps=eps)
        self.beta1, self.beta2 = betas
        self.exp_avg = {k: torch.zeros_like(t) for k, t in tables.items()}
        self.exp_avg_sq = {k: torch.zeros_like(t) for k, t in tables.items()}

    @torch.no_grad()
    def _update(self, name: str, rows: Tensor, grad: Tensor, lr: float) -> None:
        b1, b2 = self.beta1, self.beta2
        m = self.exp_avg[name].index_select(0, rows).mul_(b1).add_(grad, alpha=1 - b1)
        v = self.exp_avg_sq[name].index_select(0, rows).mul_(b2).addcmul_(grad, grad, value=1 - b2)
        self.exp_avg[name].index_copy_(0, rows, m)
        self.exp_avg_sq[name].index_copy_(0, rows, v)
        bc1 = 1 - b1**self.step_count
        bc2 = 1 - b2**self.step_count
        denom = v.sqrt().div_(math.sqrt(bc2)).add_(self.eps)
        table = self.tables[name]
        new = table.index_select(0, rows).addcdiv_(m, denom, value=-lr / bc1)
        table.index_copy_(0, rows, new)

    @torch.no_grad()
    def _update_all(self, name: str, grad: Tensor, lr: float) -> None:
        b1, b2 = self.beta1, self.beta2
        m = self.exp_avg[name].mul_(b1).add_(grad, alpha=1 - b1)
        v = self.exp_avg_sq[name].mul_(b2).addcmul_(grad, grad, value=1 - b2)
        bc1 = 1 - b1**self.step_count
        bc2 = 1 - b2**self.step_count
        denom = v.sqrt().div_(math.sqrt(bc2)).add_(self.eps)
        self.tables[name].addcdiv_(m, denom, value=-lr / bc1)

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"{k}.exp_avg": v for k, v in self.exp_avg.items()}
        out.update({f"{k}.exp_avg_sq": v for k, v in self.exp_avg_sq.items()})
        out["step"] = torch.tensor([self.step_count], dtype=torch.int64)
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for k in self.tables:
            self.exp_avg[k].copy_(state[f"{k}.exp_avg"])
            self.exp_avg_sq[k].copy_(state[f"{k}.exp_avg_sq"])
        self.step_count = int(state["step"][0])


@OPTIMIZERS.register("adagrad")
class RowAdagrad(RowOptimizer):
    """Adagrad with lazy row-wise accumulators (zero gradients leave rows unchanged anyway)."""

    def __init__(
        self,
        tables: dict[str, Tensor],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-10,
    ) -> None:
        super().__init__(tables, lr=lr, betas=betas, eps=eps)
        self.sum = {k: torch.zeros_like(t) for k, t in tables.items()}

    @torch.no_grad()
    def _update(self, name: str, rows: Tensor, grad: Tensor, lr: float) -> None:
        acc = self.sum[name].index_select(0, rows).addcmul_(grad, grad)
        self.sum[name].index_copy_(0, rows, acc)
        table = self.tables[name]
        new = table.index_select(0, rows).addcdiv_(grad, acc.sqrt().add_(self.eps), value=-lr)
        table.index_copy_(0, rows, new)

    @torch.no_grad()
    def _update_all(self, name: str, grad: Tensor, lr: float) -> None:
        acc = self.sum[name].addcmul_(grad, grad)
        self.tables[name].addcdiv_(grad, acc.sqrt().add_(self.eps), value=-lr)

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"{k}.sum": v for k, v in self.sum.items()}
        out["step"] = torch.tensor([self.step_count], dtype=torch.int64)
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for k in self.tables:
            self.sum[k].copy_(state[f"{k}.sum"])
        self.step_count = int(state["step"][0])


def build_optimizer(
    name: str,
    tables: dict[str, Tensor],
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> RowOptimizer:
    """The row-wise optimiser registered as ``name`` (``training.optimizer``)."""
    return OPTIMIZERS.get(name)(tables, lr=lr, betas=betas, eps=eps)
