"""Registries: one per pluggable family (models, losses, optimisers, schedules, ...).

A family's base class declares ``name: ClassVar[str]``; each implementation registers itself
with ``@FAMILY.register("name")``. The config validates names against the registry (its errors
list the known names and suggest a close one), code looks classes up with :meth:`Registry.get`,
and ``kgpipe ls`` prints every registry. Adding a model, a loss or a file format means adding
one class: no if/elif chain and no list of names elsewhere to keep in step.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from kgpipe.errors import ConfigError

__all__ = ["Registry", "UnknownNameError"]

T = TypeVar("T")


class UnknownNameError(ConfigError, KeyError):
    """A name that no class of the family is registered under."""

    def __init__(self, family: str, name: str, known: tuple[str, ...]) -> None:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        self.family, self.name, self.known = family, name, known
        super().__init__(f"unknown {family} {name!r} (known: {', '.join(known)}){hint}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Classes of one family by name, in registration order."""

    def __init__(self, family: str, *, doc: str) -> None:
        self.family = family  # e.g. "model", used in messages
        self.doc = doc  # one line for `kgpipe ls`
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: register the class under ``name`` (also set as ``cls.name``)."""

        def add(cls: type[T]) -> type[T]:
            if name in self._classes:
                raise ValueError(f"{self.family} {name!r} is registered twice")
            setattr(cls, "name", name)  # noqa: B010 -- the family's ClassVar
            self._classes[name] = cls
            return cls

        return add

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``; :class:`UnknownNameError` lists the known names."""
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownNameError(self.family, name, self.names()) from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._classes)

    def classes(self) -> tuple[type[T], ...]:
        return tuple(self._classes.values())

    def describe(self, name: str) -> str:
        """The first paragraph of the registered class's docstring, on one line."""
        doc = (inspect.getdoc(self.get(name)) or "").strip().replace("``", "")
        return " ".join(doc.split("\n\n")[0].split())

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}: {', '.join(self._classes)})"
