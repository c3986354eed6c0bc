"""What every section of the config shares: frozen models that reject unknown keys, and names
that must be registered in one of kgpipe's registries."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from kgpipe.registry import Registry

__all__ = [
    "REDACTED",
    "Frozen",
    "Registered",
    "clean_storage_options",
    "redact",
    "redacted_options",
]

REDACTED = "***redacted***"
_SECRET_WORDS = ("secret", "password", "token", "credential", "key")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


@dataclass(frozen=True)
class Registered:
    """``Annotated[str, Registered(REGISTRY)]``: a name of a class in ``REGISTRY`` (or one of
    ``extra``, or a value ``accept`` takes; ``more`` says what those are in the error).

    Checked against the registry when a config is validated, so a class registered after
    :mod:`kgpipe.config` was imported (a plug-in) is a valid name too; the JSON schema -- what
    the Prefect UI renders as a form -- lists the names registered when it is generated."""

    registry: Registry[Any]
    extra: tuple[str, ...] = ()
    more: str = ""
    accept: Callable[[str], bool] | None = None

    def names(self) -> tuple[str, ...]:
        return (*self.extra, *self.registry.names())

    def check(self, value: str) -> str:
        names = self.names()
        if value in names or (self.accept is not None and self.accept(value)):
            return value
        close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise PydanticCustomError(
            "unknown_name",
            f"unknown {self.registry.family} (known: {', '.join(names)}{self.more}){hint}",
        )

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        out: dict[str, Any] = handler(schema)
        if self.accept is None:
            out["enum"] = list(self.names())
        return out


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


def hide_password(uri: str) -> str:
    """``uri`` with its password (``scheme://user:pw@host``) masked; as given without one."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


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


def byte_size(value: object, *, what: str = "size", example: str = "64MiB, 256MB") -> int:
    """``value`` in bytes, in Dask's notation (``3GiB``, ``1.5GB``, a number of bytes); a
    ``ValueError`` naming it when it is not one. dask.utils is loaded only when a size is read."""
    from dask.utils import parse_bytes

    try:
        return int(parse_bytes(str(value)))
    except (ValueError, TypeError):
        raise ValueError(f"{value!r} is not a {what} (e.g. {example})") from None
