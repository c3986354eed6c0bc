"""Seeds: every random draw of training comes from a generator seeded by integers.

Each epoch draws its permutation and its negatives from one ``torch.Generator`` seeded by
``(seed, epoch, stream)`` (``stream`` is the rank when ranks train different data, 0 when they
share the global batch); dropout masks from one seeded by ``(seed, stream, global step, key)``.
Nothing else is random, so the same config gives the same draws on any device, in any split of
a step over ranks, and after a resume at an epoch boundary.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["derive_seed", "epoch_generator"]


def derive_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers (e.g. seed, epoch, rank) by NumPy's SeedSequence."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def epoch_generator(seed: int, epoch: int, stream: int) -> torch.Generator:
    """The generator of all random draws of (1-based) ``epoch`` of one random stream."""
    return torch.Generator().manual_seed(derive_seed(seed, epoch, stream))
