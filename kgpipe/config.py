"""The one typed, frozen configuration tree of a kgpipe run.

YAML in, :class:`RunConfig` out. Unknown keys are rejected with their dotted path, values are
type-checked, and cross-field rules live in ``model_validator`` hooks. ``--set a.b=c`` overrides
are parsed as YAML scalars and validated like the file itself.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from kgpipe.errors import ConfigError

__all__ = [
    "DataConfig",
    "DistributedConfig",
    "DropoutConfig",
    "EvaluationConfig",
    "ModelConfig",
    "RegularizerConfig",
    "RunConfig",
    "RunSection",
    "TrainingConfig",
    "apply_overrides",
    "clean_storage_options",
    "config_to_yaml",
    "load_config",
    "parse_config",
    "redact_secrets",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class RunSection(_Frozen):
    """Where a run lives and how it is seeded."""

    name: str | None = Field(
        default=None,
        description="Run folder name under `root`. Default: `{model}-{dataset}-{UTC timestamp}`.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    )
    root: str = Field(default="./runs", description="Any fsspec URL holding run folders.")
    seed: int = Field(default=0, ge=0, description="Seed of every random draw (with epoch, rank).")
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec storage options for `root` (e.g. `client_kwargs.endpoint_url` for S3).",
    )

    @field_serializer("storage_options", when_used="json")
    def _hide_secrets(self, value: dict[str, Any]) -> Any:
        return _redact(value)  # JSON (Prefect parameters, logs, dumps) never carries credentials

    @field_validator("storage_options", mode="before")
    @classmethod
    def _drop_redacted(cls, value: Any) -> Any:
        # a config read back from its JSON form gets its credentials from the environment
        return clean_storage_options(value) if isinstance(value, Mapping) else value


class DataConfig(_Frozen):
    """Which triples to read and how to parse them."""

    dataset: str | None = Field(
        default=None,
        description=(
            "A standard benchmark by name (umls, kinship, nations, fb15k-237, wn18rr). `umls` is "
            "bundled with kgpipe; the others are read from `root` and checksum-verified."
        ),
    )
    root: str | None = Field(
        default=None,
        description="Folder or URL holding `{dataset}/{train,valid,test}.txt` for named benchmarks.",
    )
    train: str | None = Field(default=None, description="URL of the training triples.")
    valid: str | None = Field(default=None, description="URL of the validation triples.")
    test: str | None = Field(default=None, description="URL of the test triples.")
    format: Literal["auto", "tsv", "csv", "parquet", "ntriples"] = Field(
        default="auto", description="File format; `auto` decides by extension (default TSV)."
    )
    delimiter: str | None = Field(
        default=None, description="Field delimiter for tsv/csv (default tab / comma)."
    )
    header: bool = Field(default=False, description="CSV/TSV files start with a header row.")
    columns: tuple[str | int, str | int, str | int] | None = Field(
        default=None,
        description=(
            "Head, relation and tail columns: names (with a header, or Parquet) or 0-based indices."
        ),
    )
    literals: Literal["drop", "keep"] = Field(
        default="drop", description="N-Triples literals: drop those triples or keep as entities."
    )
    unseen: Literal["keep", "drop", "error"] = Field(
        default="keep",
        description=(
            "Valid/test triples whose entity or relation is not in train: keep (standard protocol), "
            "drop, or error."
        ),
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec storage options for the data URLs."
    )

    @field_serializer("storage_options", when_used="json")
    def _hide_secrets(self, value: dict[str, Any]) -> Any:
        return _redact(value)

    @field_validator("storage_options", mode="before")
    @classmethod
    def _drop_redacted(cls, value: Any) -> Any:
        # a config read back from its JSON form gets its credentials from the environment
        return clean_storage_options(value) if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _sources(self) -> DataConfig:
        if self.dataset is None and self.train is None:
            raise ValueError("set either data.dataset or data.train")
        return self


class RegularizerConfig(_Frozen):
    """Penalty on the embeddings used in a batch."""

    type: Literal["none", "lp", "n3"] = Field(
        default="none", description="none, lp (weight * |x|_p^p) or n3 (Lacroix et al. 2018)."
    )
    weight: float = Field(default=0.0, ge=0.0, description="Regularisation weight.")
    p: float = Field(default=2.0, gt=0.0, description="The p of `lp`.")


class DropoutConfig(_Frozen):
    """Embedding dropout during training (Ruffinelli et al. 2020 found it central to good
    DistMult/ComplEx results): each use of a row in a step is zeroed element-wise with this
    probability and rescaled by 1/(1-p). Evaluation never drops."""

    entity: float = Field(default=0.0, ge=0.0, lt=1.0, description="Entity embedding dropout.")
    relation: float = Field(default=0.0, ge=0.0, lt=1.0, description="Relation embedding dropout.")

    @property
    def active(self) -> bool:
        return self.entity > 0.0 or self.relation > 0.0


class ModelConfig(_Frozen):
    """The embedding model."""

    name: Literal["transe", "distmult", "complex", "rotate"] = Field(
        default="complex", description="Interaction function."
    )
    dim: int = Field(
        default=200,
        ge=2,
        description=(
            "Real numbers per embedding row. ComplEx/RotatE use dim/2 complex components "
            "(layout: [real parts | imaginary parts]); RotatE relations hold dim/2 phases."
        ),
    )
    p: int = Field(default=2, ge=1, le=2, description="TransE distance norm (1 or 2).")
    margin: float = Field(
        default=9.0,
        description="RotatE/TransE score offset gamma (score = gamma - distance).",
    )
    reciprocal: bool = Field(
        default=False,
        description="Learn an inverse relation per relation and predict heads as inverse tails.",
    )
    init: Literal["normal", "uniform", "xavier"] = Field(
        default="normal", description="Initialisation of embedding tables."
    )
    init_scale: float = Field(
        default=1e-3, gt=0.0, description="Std (normal) or half-width (uniform) of the init."
    )
    regularizer: RegularizerConfig = Field(default_factory=RegularizerConfig)
    dropout: DropoutConfig = Field(default_factory=DropoutConfig)

    @model_validator(mode="after")
    def _interaction_constraints(self) -> ModelConfig:
        if self.name in ("complex", "rotate") and self.dim % 2:
            raise ValueError(f"model.dim must be even for {self.name} (got {self.dim})")
        if self.name == "rotate" and self.dropout.relation:
            raise ValueError(
                "model.dropout.relation must be 0 for rotate: its relations are rotation phases, "
                "and a dropped (zeroed, rescaled) phase is a different rotation, not a weaker one"
            )
        return self


class PlateauConfig(_Frozen):
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


class TrainingConfig(_Frozen):
    """How the model is trained."""

    epochs: int = Field(default=100, ge=0, description="Passes over the training triples.")
    batch_size: int = Field(
        default=1024, ge=1, description="Global batch size (positives per step, all ranks)."
    )
    mode: Literal["negative_sampling", "1vsall", "kvsall"] = Field(
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
    loss: Literal["margin", "softplus", "bce", "nssa", "cross_entropy"] = Field(
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
    optimizer: Literal["adam", "adagrad"] = Field(
        default="adam", description="Row-wise sparse optimiser (only touched rows change)."
    )
    lr: float = Field(default=1e-3, gt=0.0, description="Peak learning rate.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="Adam betas.")
    eps: float = Field(default=1e-8, gt=0.0, description="Optimiser epsilon.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear learning-rate warm-up steps.")
    schedule: Literal["constant", "cosine", "linear", "plateau"] = Field(
        default="constant",
        description=(
            "Learning-rate decay after warm-up: constant, cosine or linear to 0 at the last "
            "step, or plateau (cut by `plateau.factor` when the valid MRR stalls; needs "
            "evaluation.every)."
        ),
    )
    plateau: PlateauConfig = Field(default_factory=PlateauConfig)
    clip_grad_norm: float | None = Field(
        default=None, gt=0.0, description="Clip the global gradient norm to this value."
    )
    threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads (default: all cores)."
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
            "them to the OS after every step (glibc mallopt; 1.5-1.8x faster 1-vs-all steps and "
            "1.1-1.6x faster evaluation on a 2-core CPU, bench/allocator.py; the process keeps "
            "its peak memory). system: the C library's defaults."
        ),
    )
    deterministic: bool = Field(
        default=True,
        description=(
            "torch deterministic kernels: with several CPU threads some kernels otherwise vary "
            "run to run; needed for bit-identical resume (no measurable cost on CPU here)."
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
            "(mixed precision; DistMult and ComplEx only). auto: bf16 for DistMult and ComplEx "
            "where the device has native bf16 products (AVX512-BF16/AMX CPUs, recent GPUs), "
            "else fp32 (emulated bf16 is slower). Evaluation always ranks in float32."
        ),
    )

    @model_validator(mode="after")
    def _mode_loss(self) -> TrainingConfig:
        if self.mode == "1vsall" and self.loss not in ("cross_entropy", "bce"):
            raise ValueError("training.mode=1vsall needs training.loss cross_entropy or bce")
        if self.mode == "kvsall" and self.loss not in ("cross_entropy", "bce"):
            raise ValueError("training.mode=kvsall needs training.loss cross_entropy or bce")
        return self


class EvaluationConfig(_Frozen):
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
        return self


class DistributedConfig(_Frozen):
    """Training on a Dask cluster: a gang of torch.distributed ranks, one per worker."""

    workers: int = Field(
        default=1,
        ge=1,
        description="Training ranks (one per Dask worker). 1 with cluster `local` trains in-process.",
    )
    cluster: str = Field(
        default="local",
        description="`local` (LocalCluster), `cuda` (LocalCUDACluster) or a scheduler address.",
    )
    sync: Literal["step", "epoch"] = Field(
        default="step",
        description="Sum gradients every step (data parallel), or average models per epoch.",
    )
    compression: Literal["none", "topk", "int8"] = Field(
        default="none", description="Compression of what is exchanged (top-k with error feedback)."
    )
    topk_ratio: float = Field(
        default=0.1, gt=0.0, le=1.0, description="Share of touched rows sent by `topk`."
    )
    exchange: Literal["auto", "dense", "sparse"] = Field(
        default="auto",
        description=(
            "Entity-gradient exchange in step mode: dense all-reduce, sparse gather of touched "
            "rows, or whichever moves fewer bytes. Relation tables always use the dense path."
        ),
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto",
        description="torch.distributed backend (auto: nccl for ranks on a GPU, else gloo).",
    )
    shards: int = Field(
        default=16, ge=1, description="Training shards written to the run folder (any world size)."
    )
    timeout_s: float = Field(
        default=300.0, gt=0.0, description="Collective/rendezvous timeout of the gang in seconds."
    )
    threads_per_worker: int | None = Field(
        default=None, ge=1, description="torch threads per worker (default: cores // workers)."
    )

    launch: Literal["auto", "in_process", "dask"] = Field(
        default="auto",
        description=(
            "auto: in this process when workers == 1 and cluster is `local`, else on Dask; "
            "`dask` forces a gang even of one worker (to measure or debug the Dask path)."
        ),
    )

    @property
    def uses_dask(self) -> bool:
        """Whether training runs as a gang on Dask (else in this process)."""
        if self.launch != "auto":
            return self.launch == "dask"
        return self.workers > 1 or self.cluster != "local"

    @model_validator(mode="after")
    def _launch(self) -> DistributedConfig:
        if self.launch == "in_process" and (self.workers > 1 or self.cluster != "local"):
            raise ValueError("distributed.launch=in_process needs workers: 1 and cluster: local")
        if self.compression == "topk" and self.sync == "epoch":
            # rows left out would keep rank-local values and the ranks would drift apart
            raise ValueError("distributed.compression=topk works with sync=step only")
        return self


class CheckpointConfig(_Frozen):
    """Checkpoints under ``{run}/checkpoints/``: complete resumable state, committed by a manifest."""

    every: int = Field(default=1, ge=1, description="Commit a checkpoint every this many epochs.")
    keep_last: int = Field(default=3, ge=1, description="Committed checkpoints kept (newest).")
    keep_best: bool = Field(
        default=True, description="Also keep the checkpoint with the best validation MRR."
    )
    background: bool = Field(
        default=True,
        description=(
            "Upload in a background thread while the next epoch trains (the state is copied "
            "first); training waits only if the previous upload is still running."
        ),
    )


class FaultToleranceConfig(_Frozen):
    """Recovery: relaunch failed epochs from the last committed checkpoint; retry storage."""

    max_restarts: int = Field(
        default=3, ge=0, description="Gang relaunches (from the last checkpoint) per run."
    )
    restart_backoff_s: float = Field(
        default=2.0, ge=0.0, description="Wait before the first relaunch; doubles each time."
    )
    wait_for_workers_s: float = Field(
        default=30.0,
        ge=0.0,
        description=(
            "After a failure, wait this long for the cluster to regain `distributed.workers` "
            "workers (a LocalCluster restarts dead ones), then go on with the workers alive."
        ),
    )
    worker_ttl_s: float = Field(
        default=60.0,
        gt=0.0,
        description="Heartbeat timeout: a LocalCluster worker silent this long is declared dead.",
    )
    storage_retries: int = Field(
        default=6, ge=0, description="Retries of a failed object-store operation."
    )
    storage_backoff_s: float = Field(
        default=0.5,
        ge=0.0,
        description="First retry delay of storage operations; doubles, max 10 s.",
    )


class RunConfig(_Frozen):
    """A whole kgpipe run."""

    run: RunSection = Field(default_factory=RunSection)
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    fault_tolerance: FaultToleranceConfig = Field(default_factory=FaultToleranceConfig)

    @model_validator(mode="after")
    def _plateau(self) -> RunConfig:
        if self.training.schedule != "plateau":
            return self
        if not self.evaluation.every:
            raise ValueError(
                "training.schedule=plateau needs evaluation.every > 0: the learning rate is cut "
                "when the valid MRR stops improving"
            )
        cut_after = self.training.plateau.patience + 1  # stalled validations before a cut
        if self.evaluation.patience and self.evaluation.patience <= cut_after:
            raise ValueError(
                f"evaluation.patience ({self.evaluation.patience}) must exceed "
                f"training.plateau.patience + 1 ({cut_after}) under training.schedule=plateau: "
                "early stopping would end the run before a cut learning rate is ever used"
            )
        return self

    @model_validator(mode="after")
    def _precision(self) -> RunConfig:
        if self.training.precision == "bf16" and self.model.name not in ("distmult", "complex"):
            raise ValueError(
                f"training.precision=bf16 works with the bilinear models distmult and complex, "
                f"not {self.model.name}: {self.model.name} scores are distances, which lose too "
                "much in bfloat16 (and rotate has no matrix product to speed up)"
            )
        return self

    def with_run_name(self) -> RunConfig:
        """Return a copy whose ``run.name`` is set (a timestamped default if it was not)."""
        if self.run.name is not None:
            return self
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
        dataset = self.data.dataset or "custom"
        name = f"{self.model.name}-{dataset}-{stamp}"
        return self.model_copy(update={"run": self.run.model_copy(update={"name": name})})


# Sections that may differ between a run and its resumption (how it runs, not what it computes;
# under training.schedule=plateau, evaluation.every and .sampled drive the learning rate and
# may not change).
RESUMABLE_CHANGES = ("distributed", "checkpoint", "fault_tolerance", "evaluation")


def config_hash(config: RunConfig) -> str:
    """SHA-256 of what determines the trained parameters: everything but the run's placement
    (``run.root``, ``run.name``, storage options) and :data:`RESUMABLE_CHANGES` (less
    ``evaluation.every`` and ``.sampled`` under ``training.schedule: plateau``)."""
    import hashlib
    import json

    data = config.model_dump(mode="json")
    for section in RESUMABLE_CHANGES:
        data.pop(section, None)
    data["run"] = {"seed": config.run.seed}
    data["data"].pop("storage_options", None)
    # how the products are computed, not what is trained: a run may resume on another device,
    # where precision auto can resolve differently (and older runs have no precision at all)
    data["training"].pop("precision", None)
    data["training"].pop("device", None)
    data["training"].pop("allocator", None)  # where freed memory goes, not what is trained
    if config.training.schedule == "plateau":
        # the validations drive the learning rate: when and on what they run is training
        data["evaluation"] = {
            "every": config.evaluation.every,
            "sampled": config.evaluation.sampled,
        }
    else:  # runs from before the plateau schedule keep their hash
        data["training"].pop("plateau", None)
    if not config.model.dropout.active:  # runs from before dropout existed keep their hash
        data["model"].pop("dropout", None)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {path}: unknown key")
        elif e["type"] == "missing":
            lines.append(f"  {path}: required")
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"  {path}: {e['msg']}{shown}")
    return "invalid configuration:\n" + "\n".join(lines)


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> RunConfig:
    """Validate a mapping into a :class:`RunConfig`; errors name the dotted key path."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(dict(data))
    except ValidationError as err:
        raise ConfigError(f"{source}: {_format_validation_error(err)}") from None


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    if not all(keys):
        raise ConfigError(f"--set {path}: empty key in path")
    node = tree
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {path}: {k} is not a section")
        node = child
    node[keys[-1]] = value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a config mapping."""
    import copy

    tree: dict[str, Any] = copy.deepcopy(dict(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        path, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {item!r}: value is not valid YAML ({err})") from None
        _set_path(tree, path.strip(), value)
    return tree


def load_config(url: str, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a YAML config from any fsspec URL, apply overrides and validate."""
    import fsspec

    try:
        with fsspec.open(url, "rt", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{url}: config file not found") from None
    except OSError as err:
        raise ConfigError(f"{url}: cannot read config ({err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{url}: not valid YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{url}: the top level must be a mapping")
    return parse_config(apply_overrides(data, overrides), source=url)


REDACTED = "***redacted***"
_SECRET_WORDS = ("secret", "password", "token", "credential", "key")


def _redact(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: REDACTED
            if isinstance(v, str) and any(w in k.lower() for w in _SECRET_WORDS)
            else _redact(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_redact(v) for v in node]
    return node


def redact_secrets(config: RunConfig) -> dict[str, Any]:
    """The config as plain data with credential-like storage options replaced by a marker."""
    data = config.model_dump(mode="json")
    for section in ("run", "data"):
        data[section]["storage_options"] = _redact(data[section]["storage_options"])
    return data


def clean_storage_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Storage options without redacted entries (so that s3fs falls back to the environment)."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if v == REDACTED:
            continue
        out[k] = clean_storage_options(v) if isinstance(v, Mapping) else v
    return out


def config_to_yaml(config: RunConfig) -> str:
    """The resolved config as YAML, credentials redacted (see :func:`redact_secrets`)."""
    return yaml.safe_dump(redact_secrets(config), sort_keys=False)
