"""The sections of a run config that say how the model is trained and evaluated."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kgpipe.config.base import Frozen, Registered
from kgpipe.training.losses import LOSSES
from kgpipe.training.optim import OPTIMIZERS
from kgpipe.training.schedules import SCHEDULES
from kgpipe.training.steps import STEPS

__all__ = ["EvaluationConfig", "PlateauConfig", "TrainingConfig"]

_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]  # 1 divides by zero in Adam's bias correction


class PlateauConfig(Frozen):
    """``training.schedule: plateau``: cut the learning rate when validation stops improving
    (torch's ReduceLROnPlateau on the valid MRR, one step per validation)."""

    factor: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="Multiply the learning rate by this on a plateau."
    )
    patience: int = Field(
        default=2,
        ge=0,
        description="Validations without improvement that are tolerated before each cut.",
    )
    threshold: float = Field(
        default=1e-4,
        ge=0.0,
        description="Relative gain over the best valid MRR so far that counts as improvement.",
    )
    min_lr: float = Field(default=0.0, ge=0.0, description="Never cut below this rate.")


class TrainingConfig(Frozen):
    """How the model is trained."""

    epochs: int = Field(default=100, ge=0, description="Passes over the training triples.")
    batch_size: int = Field(
        default=1024, ge=1, description="Global batch size (positives per step, all ranks)."
    )
    mode: Annotated[str, Registered(STEPS)] = Field(
        default="negative_sampling",
        description="Shared-negative sampling, 1-vs-all or KvsAll scoring against all entities.",
    )
    negatives: int = Field(
        default=256, ge=1, description="Negatives per positive (negative_sampling mode)."
    )
    chunk_size: int = Field(
        default=256,
        ge=1,
        description=(
            "Positives that share one set of negatives; each chunk's negatives are scored "
            "with one matrix product."
        ),
    )
    loss: Annotated[str, Registered(LOSSES)] = Field(
        default="softplus",
        description=(
            "margin ranking, softplus (logistic), bce, nssa (self-adversarial, RotatE), "
            "cross_entropy."
        ),
    )
    margin: float = Field(default=1.0, ge=0.0, description="Margin of the margin ranking loss.")
    adversarial_temperature: float = Field(
        default=1.0, gt=0.0, description="Softmax temperature of the nssa loss."
    )
    label_smoothing: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Label smoothing (bce, cross_entropy)."
    )
    optimizer: Annotated[str, Registered(OPTIMIZERS)] = Field(
        default="adam", description="Row-wise sparse optimiser (only touched rows change)."
    )
    lr: float = Field(default=1e-3, gt=0.0, description="Peak learning rate.")
    betas: tuple[_Beta, _Beta] = Field(
        default=(0.9, 0.999), description="Adam betas, each in [0, 1)."
    )
    eps: float = Field(default=1e-8, gt=0.0, description="Optimiser epsilon.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear learning-rate warm-up steps.")
    schedule: Annotated[str, Registered(SCHEDULES)] = Field(
        default="constant",
        description=(
            "Learning-rate decay after warm-up: constant, cosine or linear towards 0 (reached "
            "just after the last step, which runs at a small rate: base/(steps after warm-up) "
            "for linear), or plateau (cut by `plateau.factor` when the valid MRR stalls; needs "
            "evaluation.every)."
        ),
    )
    plateau: PlateauConfig = Field(default_factory=PlateauConfig)
    clip_grad_norm: float | None = Field(
        default=None, gt=0.0, description="Clip the global gradient norm to this value."
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description=(
            "torch intra-op threads. Default: the cores other processes leave free, checked "
            "every second (all of them alone; fewer next to a busy neighbour). Pin a count for "
            "bit-identical results across runs of kernels that depend on it. May change on "
            "resume."
        ),
    )
    max_steps_per_epoch: int | None = Field(
        default=None,
        ge=1,
        description="Stop each epoch after this many steps (smoke tests, quick experiments).",
    )
    allocator: Literal["retain", "system"] = Field(
        default="retain",
        description=(
            "retain: the process keeps freed CPU buffers for the next step instead of returning "
            "them to the OS after every step (glibc mallopt): faster steps with large score "
            "matrices (docs/benchmarks.md), but the process keeps its peak memory. system: the "
            "C library's defaults."
        ),
    )
    deterministic: bool = Field(
        default=True,
        description=(
            "torch deterministic kernels: with several CPU threads some kernels otherwise vary "
            "run to run; needed for bit-identical resume (its cost: docs/fault-tolerance.md)."
        ),
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description=(
            "Where tables, optimiser state and training steps live: auto uses a CUDA GPU when "
            "torch sees one (one per rank on a `cuda` cluster or a scheduler address; ranks of "
            "a plain `local` LocalCluster stay on the CPU), cpu, or cuda (an error without one)."
        ),
    )
    precision: Literal["fp32", "bf16", "auto"] = Field(
        default="fp32",
        description=(
            "Arithmetic of the training score products: bf16 runs the (query x entity) matrix "
            "products in bfloat16 with float32 accumulation, weights, loss and optimiser state "
            "(mixed precision; bilinear models only). auto: bf16 for the bilinear models where "
            "the device has native bf16 products (AVX512-BF16/AMX CPUs, recent GPUs), else fp32 "
            "(emulated bf16 is slower). Evaluation always ranks in float32."
        ),
    )

    @model_validator(mode="after")
    def _mode_loss(self) -> TrainingConfig:
        if STEPS.get(self.mode).all_entities and not LOSSES.get(self.loss).all_entities:
            fits = " or ".join(n for n in LOSSES if LOSSES.get(n).all_entities)
            raise ValueError(f"training.mode={self.mode} needs training.loss {fits}")
        return self


class EvaluationConfig(Frozen):
    """Filtered link-prediction evaluation."""

    every: int = Field(
        default=0, ge=0, description="Validate every this many epochs (0: never during training)."
    )
    batch_size: int = Field(
        default=256,
        ge=1,
        description="Queries ranked at once; peak memory ~ batch_size x entities x 4 bytes.",
    )
    sampled: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Rank against this many sampled entities instead of all (quick validation only; "
            "results are labelled as sampled)."
        ),
    )
    candidates: int | None = Field(
        default=None,
        ge=1,
        description=(
            "OGB-style protocol, for graphs where ranking against all entities costs too much: "
            "rank each validation and test answer against its own fixed set of this many "
            "entities (drawn uniformly, with replacement, from the entities other than the "
            "answer; the same set at every validation and in every run with the same "
            "candidates_seed; known true triples among them filtered); fewer than the graph's "
            "entities less one (checked where a run starts). Not comparable with full ranking; "
            "results.json names the protocol."
        ),
    )
    candidates_seed: int = Field(
        default=0, ge=0, description="Seed of the per-query candidate sets (`candidates`)."
    )
    test: bool = Field(default=True, description="Evaluate on test at the end of training.")
    patience: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Early stopping: stop after this many validations without a better valid MRR, and "
            "keep the best validated model (needs `every`)."
        ),
    )

    @model_validator(mode="after")
    def _patience(self) -> EvaluationConfig:
        if self.patience and not self.every:
            raise ValueError("evaluation.patience needs evaluation.every > 0")
        if self.sampled is not None and self.candidates is not None:
            raise ValueError(
                "evaluation.sampled (one shared sample, validation only) and "
                "evaluation.candidates (per-query candidate sets) exclude each other"
            )
        return self
