"""The whole run config: its sections and the rules that span them."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from pydantic import Field, model_validator

from kgpipe.config.base import Frozen
from kgpipe.config.runtime import CheckpointConfig, DistributedConfig, FaultToleranceConfig
from kgpipe.config.sections import DataConfig, ModelConfig, RunSection
from kgpipe.config.tracking import TrackingConfig
from kgpipe.config.training import EvaluationConfig, TrainingConfig
from kgpipe.errors import ConfigError
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.training.schedules import SCHEDULES

__all__ = ["RunConfig"]


class RunConfig(Frozen):
    """A whole kgpipe run."""

    run: RunSection = Field(default_factory=RunSection)
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    fault_tolerance: FaultToleranceConfig = Field(default_factory=FaultToleranceConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _plateau(self) -> RunConfig:
        schedule = self.training.schedule
        if not SCHEDULES.get(schedule).follows_validation:
            return self
        if not self.evaluation.every:
            raise ValueError(
                f"training.schedule={schedule} needs evaluation.every > 0: the learning rate "
                "follows the valid MRR"
            )
        # the plateau options (the one schedule that follows validation): stalls before a cut
        cut_after = self.training.plateau.patience + 1
        if self.evaluation.patience and self.evaluation.patience <= cut_after:
            raise ValueError(
                f"evaluation.patience ({self.evaluation.patience}) must exceed "
                f"training.plateau.patience + 1 ({cut_after}) under training.schedule={schedule}: "
                "early stopping would end the run before a cut learning rate is ever used"
            )
        return self

    @model_validator(mode="after")
    def _sharded(self) -> RunConfig:
        if self.distributed.strategy == "sharded" and self.training.mode != "negative_sampling":
            raise ValueError(
                f"distributed.strategy=sharded trains with training.mode=negative_sampling, not "
                f"{self.training.mode}: a {self.training.mode} step scores every entity, so "
                "every rank would need the whole table"
            )
        return self

    @model_validator(mode="after")
    def _candidate_files(self) -> RunConfig:
        files, ev = self.data.candidates, self.evaluation
        if files is None:
            return self
        if ev.candidates is not None:
            raise ValueError(
                "data.candidates (candidate sets read from files) and evaluation.candidates "
                "(candidate sets drawn from a seed) exclude each other"
            )
        if files.valid is not None and ev.sampled is not None:
            raise ValueError(
                "evaluation.sampled (one shared sample) and data.candidates.valid (each valid "
                "query's own candidates) exclude each other"
            )
        return self

    @model_validator(mode="after")
    def _precision(self) -> RunConfig:
        if self.training.precision == "bf16" and not INTERACTIONS.get(self.model.name).bilinear:
            bilinear = " and ".join(n for n in INTERACTIONS if INTERACTIONS.get(n).bilinear)
            raise ValueError(
                f"training.precision=bf16 works with the bilinear models {bilinear}, not "
                f"{self.model.name}: its scores are not matrix products (distances lose too much "
                "in bfloat16, and there is no product to speed up)"
            )
        return self

    def check_resumable(self) -> None:
        """Raise :class:`~kgpipe.errors.ConfigError` unless ``run.name`` names the run folder a
        resume continues (without one, a run gets a new timestamped folder)."""
        if self.run.name is None:
            raise ConfigError(
                "a resume continues a run folder, and this config names none (run.name is not "
                "set): set run.name to the folder's name under run.root, e.g. "
                "--set run.name=NAME"
            )

    def with_run_name(self) -> RunConfig:
        """Return a copy whose ``run.name`` is set (a timestamped default if it was not)."""
        if self.run.name is not None:
            return self
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
        dataset = self.data.dataset or "custom"
        name = f"{self.model.name}-{dataset}-{stamp}"
        return self.model_copy(update={"run": self.run.model_copy(update={"name": name})})

    def given_storage_options(self) -> dict[str, dict[str, Any]]:
        """``run`` and ``data`` storage options as given (credentials included: the JSON form
        redacts them), for :meth:`with_storage_options` where the config travels as JSON."""
        return {"run": dict(self.run.storage_options), "data": dict(self.data.storage_options)}

    def with_storage_options(self, options: dict[str, dict[str, Any]]) -> RunConfig:
        """A copy with the ``run`` and ``data`` storage options of :meth:`given_storage_options`."""
        return self.model_copy(
            update={
                "run": self.run.model_copy(update={"storage_options": options["run"]}),
                "data": self.data.model_copy(update={"storage_options": options["data"]}),
            }
        )
