"""The one typed, frozen configuration tree of a kgpipe run.

YAML in, :class:`RunConfig` out (:mod:`.io`). The sections live in :mod:`.sections` (run, data,
model), :mod:`.training` (training, evaluation), :mod:`.runtime` (distributed, checkpoint,
fault tolerance) and :mod:`.tracking` (experiment tracking); names of pluggable parts (models,
losses, optimisers, schedules, modes, formats, clusters, regularisers) are checked against their
registries (:mod:`kgpipe.registry`).
:mod:`.hash` says what a run's parameters depend on.
"""

from kgpipe.config.base import clean_storage_options
from kgpipe.config.hash import (
    RESUMABLE_CHANGES,
    config_hash,
    config_hashes,
    hashed_view,
    training_differences,
)
from kgpipe.config.io import (
    apply_overrides,
    config_to_yaml,
    load_config,
    parse_config,
    redact_secrets,
)
from kgpipe.config.run import RunConfig
from kgpipe.config.runtime import CheckpointConfig, DistributedConfig, FaultToleranceConfig
from kgpipe.config.sections import (
    CandidateFiles,
    DataConfig,
    DropoutConfig,
    ModelConfig,
    RegularizerConfig,
    RunSection,
)
from kgpipe.config.tracking import TrackingConfig
from kgpipe.config.training import EvaluationConfig, PlateauConfig, TrainingConfig

__all__ = [
    "RESUMABLE_CHANGES",
    "CandidateFiles",
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "DropoutConfig",
    "EvaluationConfig",
    "FaultToleranceConfig",
    "ModelConfig",
    "PlateauConfig",
    "RegularizerConfig",
    "RunConfig",
    "RunSection",
    "TrackingConfig",
    "TrainingConfig",
    "apply_overrides",
    "clean_storage_options",
    "config_hash",
    "config_hashes",
    "config_to_yaml",
    "hashed_view",
    "load_config",
    "parse_config",
    "redact_secrets",
    "training_differences",
]
