"""Squared Euclidean distances of many queries against many candidates, for TransE (p=2):
one matrix product, with the pairs it would get wrong computed directly."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["NEAR", "sqdist_mm"]

#: a pair whose squared distance is below this share of ``|q|² + |c|²`` is computed directly
NEAR = 1e-3


def sqdist_mm(q: Tensor, c: Tensor) -> Tensor:
    """Squared Euclidean distances ``(*g, b, n)`` through a matrix product, floored at 1e-12.

    ``|q|² + |c|² - 2 q·c`` cancels where ``q`` and ``c`` are close next to their norms (the
    answers a trained model puts first): in float32 a distance of 0.01 between rows of norm 10
    was 5 % off, and near answers ranked out of order. Where no gradient is taken (ranking,
    ``predict``), such pairs (below :data:`NEAR` of the norms, decided per pair) are computed
    again as ``|q - c|²``, as TransE's per-triple ``score`` does; a training step keeps the
    product (finding them costs a device sync, and a near negative's loss is barely moved).
    The floor keeps the gradient of a following ``sqrt`` finite at zero distance.
    """
    qq = (q * q).sum(-1, keepdim=True)
    cc = (c * c).sum(-1).unsqueeze(-2)
    if q.dim() == 3:
        d2 = torch.baddbmm(cc, q, c.transpose(-1, -2), alpha=-2.0)
    else:
        d2 = torch.addmm(cc, q, c.transpose(-1, -2), alpha=-2.0)
    # in place: neither baddbmm/addmm nor add need their output for the backward pass
    d2.add_(qq)
    if d2.numel() and not d2.requires_grad:  # a row's bound first (a boolean (b, n)), then
        # each pair's
        some = (d2 < (qq + cc.amax(-1, keepdim=True)) * NEAR).nonzero(as_tuple=True)
        if some[0].numel():
            qs, cs = (some[:-1], some[-1]) if q.dim() == 2 else (some[:-1], (some[0], some[-1]))
            qp, cp = q[qs], c[cs]
            near = d2[some] < ((qp * qp).sum(-1) + (cp * cp).sum(-1)) * NEAR
            pairs = tuple(i[near] for i in some)
            qp, cp = qp[near], cp[near]
            d2 = d2.index_put(pairs, ((qp - cp) ** 2).sum(-1))
    return d2.clamp_min(1e-12)
