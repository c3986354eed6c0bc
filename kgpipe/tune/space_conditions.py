"""The conditions (``when``) of a search space's entries, checked as a new study is set up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kgpipe.errors import ConfigError

__all__ = ["check_conditions"]


class Entry(Protocol):
    """What the check reads of an entry (:class:`kgpipe.tune.space.Param`)."""

    @property
    def key(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def choices(self) -> tuple[Any, ...]: ...
    @property
    def when(self) -> tuple[tuple[str, tuple[Any, ...]], ...]: ...


def check_conditions(params: Sequence[Entry], source: str) -> None:
    """Refuse a ``when`` naming a key set below it (it read the base's value in every trial),
    and an entry no trial can sample (a value its key's choices never give: a typo), unless
    another alternative of its key can be (a narrowed space leaves some alternatives out)."""
    dead: dict[str, dict[str, str]] = {}  # key -> its entries no trial samples -> why
    for i, param in enumerate(params):
        for wkey, allowed in param.when:
            if any(p.key == wkey for p in params[i:]):
                raise ConfigError(
                    f"{source}: {param.key}: its `when` reads {wkey}, which the space sets "
                    f"below it: put {param.key} after {wkey}"
                )
            above = [p for p in params[:i] if p.key == wkey]
            given = above[0].choices if len(above) == 1 and not above[0].when else ()
            if given and not any(a == c for a in allowed for c in given):
                dead.setdefault(param.key, {}).setdefault(
                    param.name,
                    f"`when` asks for {wkey} in {list(allowed)}, which the space never gives "
                    f"it (its values: {list(given)})",
                )
    for key, why in dead.items():
        if len(why) == sum(p.key == key for p in params):  # none of its entries is sampled
            raise ConfigError(f"{source}: {key}: {next(iter(why.values()))}")
