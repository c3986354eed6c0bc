"""The config's keys as a reader sees them: every dotted path with its type, default and
description (for ``kgpipe config --defaults``), and the closest known key to a mistyped one."""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from kgpipe.config.base import Registered
from kgpipe.config.run import RunConfig

__all__ = ["Key", "config_keys", "suggest_key"]


@dataclass(frozen=True)
class Key:
    """One leaf of the config tree."""

    path: str
    type: str
    default: Any
    description: str


def _section(annotation: Any) -> type[BaseModel] | None:
    """The config section (a pydantic model) an annotation holds, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section(arg)
        if found is not None:
            return found
    return None


def _type_name(annotation: Any) -> str:
    """``int``, ``str | None``, ``drop | keep`` (a choice), ``list[float]``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "None"
    if origin in (tuple, list):
        inner = {_type_name(a) for a in args if a is not Ellipsis}
        return f"list[{' | '.join(sorted(inner))}]"
    if origin is dict:
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> Any:
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        return field.default_factory()
    return None


def _walk(model: type[BaseModel], prefix: str) -> list[Key]:
    keys: list[Key] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        section = _section(field.annotation)
        if section is not None and field.annotation is not None:
            default = _default(field)
            if default is not None or field.is_required():
                keys += _walk(section, f"{path}.")
                continue
            # an optional section (None by default): its keys, under a None default
            keys.append(Key(path, "section or None", None, field.description or ""))
            keys += _walk(section, f"{path}.")
            continue
        default = _default(field)
        kind = _type_name(field.annotation)
        for meta in field.metadata:
            if isinstance(meta, Registered):  # a registry's names (plug-ins included)
                kind = " | ".join(meta.names()) + (
                    f" ({meta.more.lstrip(',; ')})" if meta.more else ""
                )
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        elif isinstance(default, tuple):
            default = list(default)
        keys.append(Key(path, kind, default, field.description or ""))
    return keys


def config_keys() -> list[Key]:
    """Every key of :class:`RunConfig` (``section.key`` and deeper), in declaration order."""
    return _walk(RunConfig, "")


def _fields_under(parent: tuple[str, ...]) -> list[str]:
    model: type[BaseModel] = RunConfig
    for name in parent:
        field = model.model_fields.get(name)
        section = _section(field.annotation) if field is not None else None
        if section is None:
            return []
        model = section
    return list(model.model_fields)


def suggest_key(path: str) -> str | None:
    """The known dotted key a mistyped ``path`` most likely meant: the closest name in the same
    section, else a key of that name in another section (``training.dim`` -> ``model.dim``)."""
    parts = tuple(path.split("."))
    siblings = _fields_under(parts[:-1])
    close = difflib.get_close_matches(parts[-1], siblings, n=1, cutoff=0.6)
    if close:
        return ".".join((*parts[:-1], close[0]))
    everywhere = [k.path for k in config_keys()]
    same_name = [p for p in everywhere if p.rsplit(".", 1)[-1] == parts[-1]]
    if len(same_name) == 1:
        return same_name[0]
    close = difflib.get_close_matches(path, everywhere, n=1, cutoff=0.75)
    return close[0] if close else None
