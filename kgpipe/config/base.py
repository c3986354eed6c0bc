"""What every section of the config shares: frozen models that reject unknown keys, and names
that must be registered in one of kgpipe's registries."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema
from pydantic_core import PydanticCustomError

from kgpipe.registry import Registry

__all__ = ["Frozen", "redacted_options", "registered"]

REDACTED = "***redacted***"
_SECRET_WORDS = ("secret", "password", "token", "credential", "key")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def _known_name(
    registry: Registry[Any], names: tuple[str, ...], more: str, accept: Callable[[str], bool] | None
) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value in names or (accept is not None and accept(value)):
            return value
        close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise PydanticCustomError(
            "unknown_name",
            f"unknown {registry.family} (known: {', '.join(names)}{more}){hint}",
        )

    return check


def registered(
    registry: Registry[Any],
    *,
    extra: tuple[str, ...] = (),
    more: str = "",
    accept: Callable[[str], bool] | None = None,
) -> Any:
    """A ``str`` field whose value must name a class of ``registry`` (or be one of ``extra``,
    or pass ``accept``; ``more`` describes those in the error). The JSON schema -- what the
    Prefect UI renders as a form -- lists the names."""
    names = (*extra, *registry.names())
    schema: dict[str, Any] = {"type": "string"}
    if accept is None:
        schema["enum"] = list(names)
    return Annotated[
        str,
        AfterValidator(_known_name(registry, names, more, accept)),
        WithJsonSchema(schema),
    ]


def redact(node: Any) -> Any:
    """Credential-like entries of storage options replaced by a marker."""
    if isinstance(node, dict):
        return {
            k: REDACTED
            if isinstance(v, str) and any(w in k.lower() for w in _SECRET_WORDS)
            else redact(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [redact(v) for v in node]
    return node


def clean_storage_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Storage options without redacted entries (so that s3fs falls back to the environment)."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if v == REDACTED:
            continue
        out[k] = clean_storage_options(v) if isinstance(v, Mapping) else v
    return out


def redacted_options(value: Any) -> Any:
    """Validator of storage options read back from a config's JSON form: drop the markers, so
    credentials come from the environment."""
    return clean_storage_options(value) if isinstance(value, Mapping) else value
