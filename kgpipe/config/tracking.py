"""The ``tracking`` section: where a run's params, metrics and report are mirrored (MLflow).

It says where a run is *reported*, not what is trained: it stays out of the config hash
(:func:`kgpipe.config.hash.hashed_view`) and may change when a run is resumed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from kgpipe.config.base import Frozen

__all__ = ["TrackingConfig"]


class TrackingConfig(Frozen):
    """Experiment tracking: one MLflow run per kgpipe run (continued when the run resumes)."""

    backend: Literal["none", "mlflow"] = Field(
        default="none",
        description=(
            "`mlflow`: log params, per-epoch metrics, test metrics and the report to an MLflow "
            "tracking server (needs pip install 'kgpipe[mlflow]'); `none`: no tracking."
        ),
    )
    uri: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "MLflow tracking URI, e.g. http://127.0.0.1:5000 or sqlite:///path/mlflow.db (required "
            "with backend mlflow; credentials in MLFLOW_TRACKING_USERNAME/PASSWORD, not here)."
        ),
    )
    experiment: str | None = Field(
        default=None,
        min_length=1,
        description="MLflow experiment (created if missing). Default: data.dataset, else kgpipe.",
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Tags set on every MLflow run of this config, besides kgpipe's own.",
    )

    @field_validator("tags", mode="before")
    @classmethod
    def _tag_values_as_text(cls, value: Any) -> Any:
        # `--set tracking.tags.sprint=42` parses 42 as a number; a tag is text
        if isinstance(value, dict):
            return {
                k: str(v).lower() if isinstance(v, bool) else str(v) if v is not None else ""
                for k, v in value.items()
            }
        return value

    @field_validator("uri")
    @classmethod
    def _uri(cls, uri: str | None, info: ValidationInfo) -> str | None:
        if uri is None and info.data.get("backend") == "mlflow":
            raise ValueError(
                "required with tracking.backend=mlflow: the MLflow tracking URI, such as "
                "http://127.0.0.1:5000 or sqlite:///path/mlflow.db"
            )
        if uri is not None and "://" not in uri and not uri.startswith("databricks"):
            raise ValueError(
                "not a tracking URI: give its scheme, such as http://host:5000, https://host "
                "or sqlite:///absolute/path/mlflow.db"
            )
        return uri
