"""Losses over positive and negative scores.

Negative-sampling losses take ``pos`` ``(b,)`` and ``neg`` ``(b, n)`` and return the per-positive
loss ``(b,)``; the trainer weights and sums them. 1-vs-all losses take all-entity scores ``(b, E)``
and targets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["NEGATIVE_SAMPLING_LOSSES", "negative_sampling_loss", "one_vs_all_loss"]

NEGATIVE_SAMPLING_LOSSES = ("margin", "softplus", "bce", "nssa", "cross_entropy")


def negative_sampling_loss(
    name: str,
    pos: Tensor,
    neg: Tensor,
    *,
    margin: float = 1.0,
    temperature: float = 1.0,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-positive loss ``(b,)`` of positive scores ``(b,)`` against negatives ``(b, n)``.

    * ``margin``: mean over negatives of ``max(0, margin - pos + neg)``.
    * ``softplus``: ``softplus(-pos) + mean softplus(neg)`` (logistic loss).
    * ``bce``: binary cross-entropy with logits, positive label ``1 - ε``, negative ``ε``.
    * ``nssa``: self-adversarial negative sampling (Sun et al. 2019),
      ``-log σ(pos) - Σ softmax(τ·neg)ᵢ log σ(-negᵢ)`` with the weights detached; scores already
      include the model's margin γ.
    * ``cross_entropy``: softmax cross-entropy of the positive among itself and its negatives.
    """
    if name == "margin":
        return F.relu(margin - pos.unsqueeze(-1) + neg).mean(-1)
    if name == "softplus":
        return F.softplus(-pos) + F.softplus(neg).mean(-1)
    if name == "bce":
        eps = label_smoothing
        pos_l = F.binary_cross_entropy_with_logits(
            pos, torch.full_like(pos, 1.0 - eps), reduction="none"
        )
        neg_l = F.binary_cross_entropy_with_logits(neg, torch.full_like(neg, eps), reduction="none")
        return pos_l + neg_l.mean(-1)
    if name == "nssa":
        weights = torch.softmax(neg.detach() * temperature, dim=-1)
        return -F.logsigmoid(pos) - (weights * F.logsigmoid(-neg)).sum(-1)
    if name == "cross_entropy":
        logits = torch.cat((pos.unsqueeze(-1), neg), dim=-1)
        target = torch.zeros(pos.shape[0], dtype=torch.long, device=pos.device)
        return F.cross_entropy(logits, target, reduction="none", label_smoothing=label_smoothing)
    raise ValueError(f"unknown loss {name!r}; known: {', '.join(NEGATIVE_SAMPLING_LOSSES)}")


def one_vs_all_loss(
    name: str, scores: Tensor, targets: Tensor, *, label_smoothing: float = 0.0
) -> Tensor:
    """Per-query loss ``(b,)`` of all-entity scores ``(b, E)``.

    ``targets`` is either class ids ``(b,)`` (1-vs-all) or a multi-hot float matrix ``(b, E)``
    (KvsAll). ``cross_entropy`` needs class ids; ``bce`` takes either.
    """
    if name == "cross_entropy":
        return F.cross_entropy(scores, targets, reduction="none", label_smoothing=label_smoothing)
    if name == "bce":
        if targets.dim() == 1:
            targets = F.one_hot(targets, scores.shape[-1]).to(scores.dtype)
        if label_smoothing:
            targets = targets * (1.0 - label_smoothing) + label_smoothing / scores.shape[-1]
        # summed over entities, as in LibKGE's KvsAll: a mean would shrink gradients by 1/E
        return F.binary_cross_entropy_with_logits(scores, targets, reduction="none").sum(-1)
    raise ValueError(f"1-vs-all training supports losses cross_entropy and bce, not {name!r}")
