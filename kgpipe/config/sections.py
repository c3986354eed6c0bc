"""The sections of a run config that say what is trained on: the run, the data, the model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from kgpipe.config.base import Frozen, Registered, redact, redacted_options
from kgpipe.data.formats import FORMATS
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.training.regularizers import REGULARIZERS

__all__ = ["DataConfig", "DropoutConfig", "ModelConfig", "RegularizerConfig", "RunSection"]


class RunSection(Frozen):
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
        return redact(value)  # JSON (Prefect parameters, logs, dumps) never carries credentials

    @field_validator("storage_options", mode="before")
    @classmethod
    def _drop_redacted(cls, value: Any) -> Any:
        # a config read back from its JSON form gets its credentials from the environment
        return redacted_options(value)


class DataConfig(Frozen):
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
    format: Annotated[str, Registered(FORMATS, extra=("auto",))] = Field(
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
        return redact(value)

    @field_validator("storage_options", mode="before")
    @classmethod
    def _drop_redacted(cls, value: Any) -> Any:
        # a config read back from its JSON form gets its credentials from the environment
        return redacted_options(value)

    @model_validator(mode="after")
    def _sources(self) -> DataConfig:
        if self.dataset is None and self.train is None:
            raise ValueError("set either data.dataset or data.train")
        return self


class RegularizerConfig(Frozen):
    """Penalty on the embeddings used in a batch."""

    type: Annotated[str, Registered(REGULARIZERS)] = Field(
        default="none", description="none, lp (weight * |x|_p^p) or n3 (Lacroix et al. 2018)."
    )
    weight: float = Field(default=0.0, ge=0.0, description="Regularisation weight.")
    p: float = Field(default=2.0, gt=0.0, description="The p of `lp`.")


class DropoutConfig(Frozen):
    """Embedding dropout during training (Ruffinelli et al. 2020 found it central to good
    DistMult/ComplEx results): each use of a row in a step is zeroed element-wise with this
    probability and rescaled by 1/(1-p). Evaluation never drops."""

    entity: float = Field(default=0.0, ge=0.0, lt=1.0, description="Entity embedding dropout.")
    relation: float = Field(default=0.0, ge=0.0, lt=1.0, description="Relation embedding dropout.")

    @property
    def active(self) -> bool:
        return self.entity > 0.0 or self.relation > 0.0


class ModelConfig(Frozen):
    """The embedding model."""

    name: Annotated[str, Registered(INTERACTIONS)] = Field(
        default="complex", description="Interaction function (`kgpipe ls` lists them)."
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
        traits = INTERACTIONS.get(self.name)
        if traits.complex_rows and self.dim % 2:
            raise ValueError(f"model.dim must be even for {self.name} (got {self.dim})")
        if traits.phase_relations and self.dropout.relation:
            raise ValueError(
                f"model.dropout.relation must be 0 for {self.name}: its relations are rotation "
                "phases, and a dropped (zeroed, rescaled) phase is a different rotation, not a "
                "weaker one"
            )
        return self
