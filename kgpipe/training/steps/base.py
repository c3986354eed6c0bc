"""The step-strategy interface, the ``STEPS`` registry, and what strategies compute with.

A step is three explicit phases (see :mod:`kgpipe.training.loop`); a strategy is the first:
this rank's part of the global batch gives a loss and, per table, the gradient of the rows it
touched (:class:`~kgpipe.training.optim.RowGrad`). The loss is normalised by the *global* batch,
so summing the ranks' gradients gives exactly the single-process gradient.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from kgpipe.models.interactions import Interaction
from kgpipe.models.spec import ModelSpec
from kgpipe.registry import Registry
from kgpipe.training.dropout import Dropout
from kgpipe.training.losses import Loss
from kgpipe.training.optim import RowGrad
from kgpipe.training.records import StepResult
from kgpipe.training.regularizers import Regularizer

__all__ = ["STEPS", "StepKit", "StepStrategy", "row_grad"]


@dataclass
class StepKit:
    """What a strategy computes with: the trainer's tables and parts."""

    interaction: Interaction
    spec: ModelSpec
    tables: dict[str, Tensor]  # entity, relation (live: updated in place by the optimiser)
    device: torch.device
    loss: Loss
    regularizer: Regularizer
    dropout: Dropout | None
    bf16: bool  # bfloat16 score products
    part: tuple[int, int]  # (index, count): this rank's share of each global batch

    def scoring(self) -> contextlib.AbstractContextManager[Any]:
        """Where scores are computed: bf16 autocast of the matrix products in mixed precision.

        Only the products run in bfloat16 (with float32 accumulation); the tables, the loss and
        the gradients handed to the optimiser stay float32.
        """
        if self.bf16:
            device = self.tables["entity"].device.type
            return torch.autocast(device_type=device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def gather(self, name: str, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Unique touched rows, a leaf copy of them requiring grad, and the inverse index."""
        rows, inv = torch.unique(ids, return_inverse=True)
        leaf = self.tables[name].index_select(0, rows).requires_grad_(True)
        return rows, leaf, inv

    def all_entities(self) -> tuple[Tensor, Tensor]:
        """Every entity row id and a leaf sharing the table's storage: the table changes only
        in the optimiser step, after backward, so no copy of it is needed."""
        table = self.tables["entity"]
        rows = torch.arange(table.shape[0], device=table.device)
        return rows, table.detach().requires_grad_(True)

    def empty_grad(self, table: str) -> RowGrad:
        width = self.tables[table].shape[1]
        return RowGrad(
            torch.zeros(0, dtype=torch.long, device=self.device),
            torch.zeros(0, width, device=self.device),
        )


def row_grad(rows: Tensor, leaf: Tensor) -> RowGrad:
    """The gradient of a gathered leaf (zeros if the loss did not depend on it)."""
    return RowGrad(rows, leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))


class StepStrategy(ABC):
    """How one training mode samples and scores a step.

    Every strategy takes the options of ``training`` it might use (``chunk_size``,
    ``negatives``). ``train`` holds the rank's training triples ``(n, 3)``, ``int32`` or
    ``int64``.
    """

    name: ClassVar[str]
    #: scores every query against every entity: needs a loss with ``all_entities``
    all_entities: ClassVar[bool] = False

    def __init__(
        self, kit: StepKit, train: Tensor, *, chunk_size: int = 256, negatives: int = 256
    ) -> None:
        self.kit = kit
        self.train = train

    def examples(self) -> int:
        """Examples per epoch (the unit of the epoch permutation and of the batch size)."""
        return int(self.train.shape[0])

    def batch(self, ids: Tensor) -> Tensor:
        """The batch of the permuted example ``ids`` (``int64``: the staged triples may be held
        as ``int32``)."""
        return self.train[ids].long()

    def triples_covered(self, examples: int) -> int:
        """Training triples behind ``examples`` examples of an epoch (for triples/s)."""
        return examples

    def global_queries(self, batch_size: int) -> int:
        """Queries a global batch of ``batch_size`` examples scores (the loss normaliser)."""
        return batch_size

    def draw(self, batch_size: int, gen: torch.Generator) -> Tensor | None:
        """Random draws of a global batch besides the permutation (shared negatives)."""
        return None

    def touched(self, batch: Tensor, draws: Tensor | None) -> Tensor:
        """Entity ids this part of the step may read (a sharded table fetches these rows).

        Strategies that split by chunks narrow it to their part; this covers the whole batch."""
        ids = [batch[..., 0].reshape(-1), batch[..., 2].reshape(-1)]
        if draws is not None:
            ids.append(draws.reshape(-1))
        return torch.cat(ids)

    def my_part(self, batch: Tensor) -> Tensor:
        """This rank's rows of a global batch (strategies that split by rows)."""
        index, count = self.kit.part
        return batch.tensor_split(count)[index] if count > 1 else batch

    @abstractmethod
    def gradients(
        self,
        batch: Tensor,
        draws: Tensor | None,
        *,
        global_step: int,
        global_queries: int,
        global_batch: int,
    ) -> StepResult:
        """Loss and row gradients of this rank's part of the global ``batch``."""


STEPS: Registry[StepStrategy] = Registry("mode", doc="training step strategies: training.mode")
