"""Training: negatives, losses, row-wise optimisers and the rank-ready loop."""

from kgpipe.training.losses import negative_sampling_loss, one_vs_all_loss
from kgpipe.training.optim import RowAdagrad, RowAdam, RowGrad, build_optimizer, lr_at
from kgpipe.training.trainer import (
    Callback,
    EpochStats,
    Exchange,
    StepResult,
    Trainer,
    derive_seed,
)

__all__ = [
    "Callback",
    "EpochStats",
    "Exchange",
    "RowAdagrad",
    "RowAdam",
    "RowGrad",
    "StepResult",
    "Trainer",
    "build_optimizer",
    "derive_seed",
    "lr_at",
    "negative_sampling_loss",
    "one_vs_all_loss",
]
