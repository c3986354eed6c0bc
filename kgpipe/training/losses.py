"""Losses over positive and negative scores, one registered class per ``training.loss``.

Negative sampling scores a positive ``pos`` ``(b,)`` against negatives ``neg`` ``(b, n)`` and
gives the per-positive loss ``(b,)``; the step weights and sums them. Losses that can also score
a query against every entity (1-vs-all, KvsAll) take all-entity scores ``(b, E)`` and targets:
class ids ``(b,)`` or a multi-hot matrix ``(b, E)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from kgpipe.registry import Registry

__all__ = [
    "LOSSES",
    "Loss",
    "linear_softmax_cross_entropy",
    "negative_sampling_loss",
    "one_vs_all_loss",
    "softmax_cross_entropy",
]


class Loss(ABC):
    """A training loss; the options of ``training`` it may use are given to every loss."""

    name: ClassVar[str]
    #: scores a query against every entity too (training.mode 1vsall and kvsall)
    all_entities: ClassVar[bool] = False
    #: softmax cross-entropy over the candidates: computed in float32 whatever the scores'
    #: dtype, and fusable with a bilinear score product (no ``(b, E)`` score matrix)
    softmax: ClassVar[bool] = False

    def __init__(
        self, *, margin: float = 1.0, temperature: float = 1.0, label_smoothing: float = 0.0
    ) -> None:
        self.margin = margin
        self.temperature = temperature
        self.label_smoothing = label_smoothing

    @abstractmethod
    def negative_sampling(self, pos: Tensor, neg: Tensor) -> Tensor:
        """Per-positive loss ``(b,)`` of scores ``pos`` ``(b,)`` against ``neg`` ``(b, n)``."""

    def against_all(self, scores: Tensor, targets: Tensor) -> Tensor:
        """Per-query loss ``(b,)`` of all-entity scores ``(b, E)`` (losses with ``all_entities``)."""
        known = ", ".join(n for n in LOSSES if LOSSES.get(n).all_entities)
        raise ValueError(f"1-vs-all training supports losses {known}, not {self.name!r}")


LOSSES: Registry[Loss] = Registry("loss", doc="training losses: training.loss")


@LOSSES.register("margin")
class MarginLoss(Loss):
    """Margin ranking: mean over negatives of ``max(0, margin - pos + neg)``."""

    def negative_sampling(self, pos: Tensor, neg: Tensor) -> Tensor:
        return F.relu(self.margin - pos.unsqueeze(-1) + neg).mean(-1)


@LOSSES.register("softplus")
class SoftplusLoss(Loss):
    """Logistic loss: ``softplus(-pos) + mean softplus(neg)``."""

    def negative_sampling(self, pos: Tensor, neg: Tensor) -> Tensor:
        return F.softplus(-pos) + F.softplus(neg).mean(-1)


@LOSSES.register("nssa")
class SelfAdversarialLoss(Loss):
    """Self-adversarial negative sampling (Sun et al. 2019).

    ``-log σ(pos) - Σ softmax(τ·neg)ᵢ log σ(-negᵢ)`` with the weights detached; scores already
    include the model's margin γ.
    """

    def negative_sampling(self, pos: Tensor, neg: Tensor) -> Tensor:
        weights = torch.softmax(neg.detach() * self.temperature, dim=-1)
        return -F.logsigmoid(pos) - (weights * F.logsigmoid(-neg)).sum(-1)


@LOSSES.register("cross_entropy")
class CrossEntropyLoss(Loss):
    """Softmax cross-entropy of the positive among its candidates.

    Against all entities with a multi-hot target matrix (KvsAll) the target is the uniform
    distribution over a query's answers (LibKGE's KvsAll with the ``kl`` loss), smoothed towards
    the uniform distribution over all entities by ``label_smoothing``.
    """

    all_entities = True
    softmax = True

    def negative_sampling(self, pos: Tensor, neg: Tensor) -> Tensor:
        logits = torch.cat((pos.unsqueeze(-1), neg), dim=-1)
        target = torch.zeros(pos.shape[0], dtype=torch.long, device=pos.device)
        return F.cross_entropy(
            logits, target, reduction="none", label_smoothing=self.label_smoothing
        )

    def against_all(self, scores: Tensor, targets: Tensor) -> Tensor:
        if targets.dim() == 2:
            probs = targets / targets.sum(-1, keepdim=True).clamp_min(1.0)
            return F.cross_entropy(
                scores.float(), probs, label_smoothing=self.label_smoothing, reduction="none"
            )
        return softmax_cross_entropy(scores, targets, self.label_smoothing)


@LOSSES.register("bce")
class BCELoss(Loss):
    """Binary cross-entropy with logits; positive label ``1 - ε``, negative ``ε``."""

    all_entities = True

    def negative_sampling(self, pos: Tensor, neg: Tensor) -> Tensor:
        eps = self.label_smoothing
        pos_l = F.binary_cross_entropy_with_logits(
            pos, torch.full_like(pos, 1.0 - eps), reduction="none"
        )
        neg_l = F.binary_cross_entropy_with_logits(neg, torch.full_like(neg, eps), reduction="none")
        return pos_l + neg_l.mean(-1)

    def against_all(self, scores: Tensor, targets: Tensor) -> Tensor:
        """Summed over entities, as in LibKGE's KvsAll (a mean would shrink gradients by 1/E);
        targets smoothed towards ``ε / E``."""
        if targets.dim() == 1:
            targets = F.one_hot(targets, scores.shape[-1]).to(scores.dtype)
        if self.label_smoothing:
            eps = self.label_smoothing
            targets = targets * (1.0 - eps) + eps / scores.shape[-1]
        return F.binary_cross_entropy_with_logits(scores, targets, reduction="none").sum(-1)


def negative_sampling_loss(
    name: str,
    pos: Tensor,
    neg: Tensor,
    *,
    margin: float = 1.0,
    temperature: float = 1.0,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-positive loss ``(b,)`` of the registered loss ``name`` (see its class)."""
    loss = LOSSES.get(name)(margin=margin, temperature=temperature, label_smoothing=label_smoothing)
    return loss.negative_sampling(pos, neg)


def one_vs_all_loss(
    name: str, scores: Tensor, targets: Tensor, *, label_smoothing: float = 0.0
) -> Tensor:
    """Per-query loss ``(b,)`` of all-entity scores ``(b, E)`` under the registered loss
    ``name``; ``targets`` are class ids ``(b,)`` (1-vs-all) or multi-hot ``(b, E)`` (KvsAll)."""
    return LOSSES.get(name)(label_smoothing=label_smoothing).against_all(scores, targets)


class _SoftmaxCrossEntropy(torch.autograd.Function):
    """Softmax cross-entropy over all-entity scores in one forward and one backward pass.

    ``F.cross_entropy`` materialises the log-softmax ``(b, E)``, and its backward zero-fills a
    ``(b, E)`` gradient for the NLL step before the log-softmax backward reads it again. At
    ``E`` in the tens of thousands those passes cost about a quarter of a 1-vs-all step on CPU.
    Here the forward keeps only the log-sum-exp per row; the backward writes
    ``softmax - target distribution`` once, in the scores' own dtype (bfloat16 scores get a
    bfloat16 gradient, computed in float32).
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        scores: Tensor,
        target: Tensor,
        label_smoothing: float,
    ) -> Tensor:
        s = scores.to(torch.promote_types(scores.dtype, torch.float32))
        lse = torch.logsumexp(s, dim=-1)
        loss = lse - (1.0 - label_smoothing) * s.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        if label_smoothing:
            loss = loss - label_smoothing * s.mean(-1)
        ctx.save_for_backward(scores, target, lse)
        ctx.label_smoothing = label_smoothing  # type: ignore[attr-defined]
        return loss

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor
    ) -> tuple[Tensor, None, None]:
        scores, target, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        eps: float = ctx.label_smoothing  # type: ignore[attr-defined]
        grad = (scores.to(lse.dtype) - lse.unsqueeze(-1)).exp_()  # softmax (a new tensor)
        if eps:
            grad.sub_(eps / scores.shape[-1])
        rows = torch.arange(scores.shape[0], device=scores.device)
        grad[rows, target] -= 1.0 - eps
        grad.mul_(grad_out.unsqueeze(-1))
        return grad.to(scores.dtype), None, None


def softmax_cross_entropy(scores: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Per-row softmax cross-entropy ``(b,)`` of scores ``(b, E)`` against class ids ``(b,)``;
    the same values and gradients as ``F.cross_entropy(..., reduction="none")``, computed in
    at least float32 whatever the scores' dtype."""
    if scores.dim() != 2:
        raise ValueError("softmax_cross_entropy expects scores of shape (b, E)")
    out: Tensor = _SoftmaxCrossEntropy.apply(scores, target, float(label_smoothing))
    return out


class _LinearSoftmaxCrossEntropy(torch.autograd.Function):
    """Summed softmax cross-entropy of the scores ``queries @ candidates.T``, row block by row
    block, with the gradients computed in the forward pass (as in fused linear cross-entropy
    kernels): no ``(b, E)`` matrix is ever materialised, only ``(block, E)`` ones, which the
    allocator reuses block after block instead of page-faulting fresh memory for each. The
    three matrix products are those of the unfused computation.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        queries: Tensor,
        candidates: Tensor,
        target: Tensor,
        label_smoothing: float,
        dtype: torch.dtype,
        block: int,
    ) -> Tensor:
        eps = label_smoothing
        n = candidates.shape[0]
        q = queries.detach().to(dtype)
        cand = candidates.detach().to(dtype)
        acc = torch.promote_types(queries.dtype, torch.float32)
        grad_q = torch.empty(queries.shape, dtype=acc, device=queries.device)
        grad_c = torch.zeros(candidates.shape, dtype=acc, device=candidates.device)
        total = torch.zeros((), dtype=acc, device=queries.device)
        for s in range(0, q.shape[0], block):
            qb, tb = q[s : s + block], target[s : s + block]
            scores = (qb @ cand.T).to(acc)
            lse = torch.logsumexp(scores, dim=-1)
            picked = scores.gather(-1, tb.unsqueeze(-1)).squeeze(-1)
            loss = lse - (1.0 - eps) * picked
            if eps:
                loss = loss - eps * scores.mean(-1)
            total += loss.sum()
            # d loss / d scores = softmax - target distribution, written over the scores
            g = scores.sub_(lse.unsqueeze(-1)).exp_()
            if eps:
                g.sub_(eps / n)
            g[torch.arange(qb.shape[0], device=g.device), tb] -= 1.0 - eps
            gd = g.to(dtype)
            grad_q[s : s + block] = gd @ cand
            if dtype == acc:
                grad_c.addmm_(gd.T, qb)
            else:
                grad_c += gd.T @ qb
        ctx.save_for_backward(grad_q, grad_c)
        return total

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor
    ) -> tuple[Tensor, Tensor, None, None, None, None]:
        grad_q, grad_c = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad_q * grad_out, grad_c * grad_out, None, None, None, None


def linear_softmax_cross_entropy(
    queries: Tensor,
    candidates: Tensor,
    target: Tensor,
    *,
    label_smoothing: float = 0.0,
    dtype: torch.dtype | None = None,
    block: int = 256,
) -> Tensor:
    """``softmax_cross_entropy(queries @ candidates.T, target).sum()`` without the score matrix.

    ``queries`` ``(b, d)``, ``candidates`` ``(E, d)``, ``target`` ``(b,)``: a scalar whose
    gradients flow to both inputs. ``dtype`` is that of the matrix products (``torch.bfloat16``
    for mixed precision; the soft-max, the loss and the gradients stay float32), ``block`` the
    rows scored at once.
    """
    if queries.dim() != 2 or candidates.dim() != 2:
        raise ValueError(
            "linear_softmax_cross_entropy expects (b, d) queries and (E, d) candidates"
        )
    out: Tensor = _LinearSoftmaxCrossEntropy.apply(
        queries, candidates, target, float(label_smoothing), dtype or queries.dtype, block
    )
    return out
