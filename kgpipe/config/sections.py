"""The sections of a run config that say what is trained on: the run, the data, the model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from kgpipe.config.base import Frozen, Registered, byte_size, redact, redacted_options
from kgpipe.data.formats import FORMATS
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.training.regularizers import REGULARIZERS

__all__ = [
    "CandidateFiles",
    "DataConfig",
    "DropoutConfig",
    "ModelConfig",
    "RegularizerConfig",
    "RunSection",
    "SplitConfig",
]


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


class SplitConfig(Frozen):
    """Validation and test triples split off a single ``data.train`` file.

    After duplicates are removed, the train triples are shuffled with ``seed`` and taken in that
    order into valid (then test) as long as each taken triple's head, tail and relation keep at
    least one other triple in train: every valid/test entity and relation occurs in train (the
    standard protocol) and train loses none. Where too few triples qualify, fewer are taken
    (the staging log says how many). The same file, fractions and seed give the same split.
    Each fraction is below 0.5, so together they leave train at least some triples."""

    valid: float = Field(
        default=0.0, ge=0.0, lt=0.5, description="Fraction of the triples for validation."
    )
    test: float = Field(default=0.0, ge=0.0, lt=0.5, description="Fraction for test.")
    seed: int = Field(
        default=0,
        ge=0,
        description=(
            "Seed of the shuffle. Independent of run.seed, so that runs with different seeds "
            "are trained and evaluated on the same split."
        ),
    )

    @model_validator(mode="after")
    def _asks_for_triples(self) -> SplitConfig:
        if self.valid == 0.0 and self.test == 0.0:
            raise ValueError("data.split needs a valid or a test fraction above 0")
        return self


class SideFiles(Frozen):
    """A split's candidate files, one per side."""

    head: str = Field(description="URL of the candidates of the head queries `(?, r, t)`.")
    tail: str = Field(description="URL of the candidates of the tail queries `(h, r, ?)`.")


class CandidateFiles(Frozen):
    """Per-query candidate sets read from the graph's own files (OGB's ``head_neg`` and
    ``tail_neg`` arrays): each answer is ranked against the candidates on its triple's row
    instead of against all entities.

    A file has one row per data line of its split's file, in the same order (header, comment
    and blank lines of the triples file do not count), each with the same number ``k`` of
    entity labels: a tab-separated text file (optionally compressed), or a ``.npy`` array of
    integers ``(lines, k)`` whose values are labels written as decimal numbers (OGB's own arrays,
    for a graph whose labels are OGB's entity numbers). Staging maps them to ids and keeps the
    rows of the triples it keeps (first occurrences, and not the unseen ones it drops)."""

    valid: SideFiles | None = Field(default=None, description="Candidates of the valid split.")
    test: SideFiles | None = Field(default=None, description="Candidates of the test split.")
    filtered: bool = Field(
        default=False,
        description=(
            "Leave out candidates that form a known true triple (train, valid or test). OGB's "
            "protocol does not (false), so that the numbers are its leaderboard's."
        ),
    )

    @model_validator(mode="after")
    def _some(self) -> CandidateFiles:
        if self.valid is None and self.test is None:
            raise ValueError("data.candidates needs files for valid, test or both")
        return self


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
    header: bool | Literal["auto"] = Field(
        default="auto",
        description=(
            "CSV/TSV files start with a header row: true, false, or auto (decided per file). "
            "Column names in `columns` imply true. `auto` skips the first data line when its "
            "head, relation and tail fields are distinct, none is a number and each looks like "
            "a column name (a letter, then letters, digits, `_`, `-`, `.` or spaces), and "
            "either all three are common column names (head/relation/tail, subject/predicate/"
            "object, s/p/o, h/r/t, source/target, src/dst, from/to, rel, relation_type, ...; "
            "case, `_`/`-`/spaces and an `id`/`label`/`name` suffix ignored), or none of the "
            "three occurs anywhere else (as an entity, resp. a relation) in the file's other "
            "rows (at least two) and, for valid/test, in train, while the other relations "
            "each occur twice or more on average. The staging log and data.json say what was "
            "decided."
        ),
    )
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
    split: SplitConfig | None = Field(
        default=None,
        description=(
            "Split valid/test triples off `train` (e.g. {valid: 0.05, test: 0.05}); needs "
            "`train` without `valid`, `test` or `dataset`. Default: no split."
        ),
    )
    candidates: CandidateFiles | None = Field(
        default=None,
        description=(
            "Per-query candidate files for valid and/or test (OGB's protocol): "
            "{valid: {head: URL, tail: URL}, test: {...}}. A split without files is ranked as "
            "`evaluation` says. Excludes evaluation.candidates and data.split."
        ),
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec storage options for the data URLs."
    )
    block_size: str = Field(
        default="8MiB",
        description=(
            "Text read and parsed at a time by the columnar reader of tab-separated and CSV "
            "files (Dask's "
            "notation: `8MiB`, `64MB`); pyarrow reads several blocks ahead. Staging holds the "
            "blocks in flight, the distinct labels and the ids of the triples, never a Python "
            "string per field. Parquet files are read in batches of 1/64 of it in rows."
        ),
    )

    memory_budget: str | None = Field(
        default=None,
        description=(
            "Memory staging may use for a split's ids before deduplication and for "
            "deduplicating them, and for the text mapped at a time (Dask's notation: `2GiB`); "
            "the blocks read are then at most 1/256 of it (not below 1MiB nor above `block_size`). "
            "A split that would need more has its ids written to `spill_dir` as they are read "
            "and deduplicated from there, a group of heads at a time (a split under it stays in "
            "memory). Beyond it staging holds the labels, the distinct triples (24 bytes each), "
            "one byte a line and label-sized temporaries. The columnar reader (tab-separated "
            "files, CSV files whose quoted fields keep to a line, N-Triples files; uncompressed "
            "Parquet files with string or integer columns) only; other files are read whole, "
            "with a warning. Default: none (all in memory)."
        ),
    )
    spill_dir: str | None = Field(
        default=None,
        description=(
            "Local folder for the ids spilled under `memory_budget` (default: the system's "
            "temp folder). The files have no name: they are closed, and gone, as staging ends or "
            "fails, and with the process however it ends."
        ),
    )

    @field_validator("memory_budget", mode="before")  # YAML reads 3000000000 as a number
    @classmethod
    def _budget(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if byte_size(value, example="2GiB, 512MB") < 1 << 24:
            raise ValueError(f"data.memory_budget must be at least 16MiB, not {value!r}")
        return str(value)

    @property
    def memory_budget_bytes(self) -> int | None:
        """``memory_budget`` in bytes (None: no budget)."""
        return None if self.memory_budget is None else byte_size(self.memory_budget)

    @field_validator("block_size", mode="before")  # YAML reads 3000000000 as a number
    @classmethod
    def _block(cls, value: str) -> str:
        if not 1 << 16 <= byte_size(value) < 1 << 31:
            raise ValueError(f"data.block_size must be from 64KiB to below 2GiB, not {value!r}")
        return str(value)

    @property
    def block_size_bytes(self) -> int:
        """``block_size`` in bytes."""
        return byte_size(self.block_size)

    @property
    def read_block_bytes(self) -> int:
        """The block the columnar reader reads: ``block_size``, and under ``memory_budget``
        1/256 of the budget where that is smaller, though not below 1 MiB (nor ever above
        ``block_size``). pyarrow's reader holds dozens of blocks in flight: at 10M lines
        reading alone held ~0.3 GB with 8-MiB blocks, ~0.1 GB with 2 MiB (at 100M, ~3 GB with
        64 MiB; docs/benchmarks.md)."""
        budget = self.memory_budget_bytes
        if budget is None:
            return self.block_size_bytes
        return min(self.block_size_bytes, max(1 << 20, budget // 256))

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
        if self.split is not None:
            if self.train is None:
                raise ValueError("data.split needs data.train (the one file to split)")
            given = [k for k in ("dataset", "valid", "test") if getattr(self, k) is not None]
            if given:
                raise ValueError(
                    f"data.split makes the valid/test splits out of data.train: unset "
                    f"{' and '.join('data.' + k for k in given)}, or remove data.split"
                )
            if self.candidates is not None:
                raise ValueError(
                    "data.candidates gives rows for the lines of the valid/test files, and "
                    "data.split makes those splits out of data.train: remove one of them"
                )
        return self


class RegularizerConfig(Frozen):
    """Penalty on the embeddings used in a batch: ``weight`` times the mean, over the triples
    the batch's queries score, of the penalty of their head, relation and tail rows (a
    reciprocal model's head query ``(?, r, t)`` is the triple ``(t, r⁻¹, h)``)."""

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
