"""Nearest entities in embedding space, one query row against the table in blocks of rows.

Two measures:

* ``cosine`` -- cosine similarity of the stored rows (for ComplEx and RotatE the ``[real |
  imaginary]`` rows, which is the cosine of the complex vectors' real inner product). Higher is
  nearer. Usually the better choice: it ignores the rows' norms.
* ``model`` -- the geometry of the model's own score, read from the interaction's traits:
  translational models measure a distance, lower is nearer (TransE: ``‖a - b‖_p`` with the run's
  ``model.p``; RotatE, rows of complex numbers: ``Σ_k |a_k - b_k|``, the modulus sum its score
  uses); bilinear models a dot product, higher is nearer (DistMult: ``a · b``; ComplEx:
  ``Re⟨a, conj(b)⟩``, which is the dot product of the stored rows). A dot product favours
  entities of large norm.

Peak memory is about ``block_rows x dim`` floats besides the table, whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kgpipe.models.model import KGEModel

__all__ = ["MEASURES", "Neighbours", "model_measure", "nearest_entities"]

MEASURES = ("cosine", "model")
BLOCK_ROWS = 1 << 16


@dataclass(frozen=True)
class Neighbours:
    """The nearest entities, nearest first, and their values of ``measure``."""

    ids: list[int]
    values: list[float]
    measure: str  # "cosine", "dot", "L1 distance", "L2 distance" or "modulus distance"
    higher_is_nearer: bool


def model_measure(model: KGEModel) -> tuple[str, bool]:
    """The name of the model's own measure between two entity rows, and whether higher values
    are nearer (see the module docstring)."""
    interaction = model.interaction
    if interaction.bilinear:
        return "dot", True
    if interaction.complex_rows:
        return "modulus distance", False
    return f"L{model.spec.p} distance", False


def _values(measure: str, q: Tensor, rows: Tensor) -> Tensor:
    """The measure between the query row ``q`` ``(d,)`` and each of ``rows`` ``(m, d)``."""
    if measure == "cosine":
        return torch.nn.functional.cosine_similarity(rows, q.unsqueeze(0), dim=1, eps=1e-12)
    if measure == "dot":
        return rows @ q
    diff = rows - q
    if measure == "modulus distance":
        re, im = diff.chunk(2, dim=1)
        return torch.sqrt(re * re + im * im).sum(1)
    p = float(measure[1:].split()[0])
    return torch.linalg.vector_norm(diff, ord=p, dim=1)


@torch.no_grad()
def nearest_entities(
    model: KGEModel,
    entity: int,
    k: int,
    *,
    measure: str = "cosine",
    block_rows: int = BLOCK_ROWS,
) -> Neighbours:
    """The ``k`` entities nearest to ``entity`` (itself left out) under ``measure`` (one of
    :data:`MEASURES`), computed ``block_rows`` rows at a time with a running top-k."""
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; known: {', '.join(MEASURES)}")
    if k < 1 or block_rows < 1:
        raise ValueError("k and block_rows must be positive")
    name, higher = ("cosine", True) if measure == "cosine" else model_measure(model)
    table = model.entity
    q = table[entity].float()
    n = int(table.shape[0])
    k = min(k, n - 1)
    best_keys = torch.empty(0)
    best_ids = torch.empty(0, dtype=torch.long)
    for start in range(0, n, block_rows):
        rows = table[start : start + block_rows].float()
        keys = _values(name, q, rows)
        if not higher:
            keys = -keys  # top-k of the negated distance: the nearest
        if start <= entity < start + rows.shape[0]:
            keys[entity - start] = float("-inf")
        ids = torch.arange(start, start + rows.shape[0])
        keys, ids = torch.cat((best_keys, keys.cpu())), torch.cat((best_ids, ids))
        top = torch.topk(keys, min(k, int(keys.numel())))
        best_keys, best_ids = top.values, ids[top.indices]
    values = best_keys if higher else -best_keys
    return Neighbours(best_ids.tolist(), values.tolist(), name, higher)
