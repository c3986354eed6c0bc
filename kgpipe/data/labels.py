"""Labels held in one Arrow string array instead of a Python string each.

A Python ``str`` costs about 50 bytes plus its text, and a tuple of them 8 more bytes a label: the
11.6M labels of a 100M-edge graph took ~0.8 GB as a tuple, on top of the same labels in the Arrow
array the columnar reader sorted them in (~0.4 GB). :class:`Labels` is that array, read as a
sequence of ``str``: the vocabulary of a large graph keeps its labels at the size of their text
plus an 8-byte offset each, and a label becomes a Python string only when it is read.

pyarrow is not imported here: only the columnar reader makes these, and it has imported it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Labels"]

_CHUNK = 1 << 16  # labels turned into Python strings at a time when iterating


class Labels(Sequence[str]):
    """An immutable sequence of labels over a pyarrow string array without nulls."""

    __slots__ = ("_array",)

    def __init__(self, array: pa.Array) -> None:
        if array.null_count:
            raise ValueError("labels cannot be null")
        self._array = array

    @property
    def array(self) -> pa.Array:
        """The Arrow array (shared, not copied)."""
        return self._array

    def __len__(self) -> int:
        return len(self._array)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Labels: ...

    def __getitem__(self, index: int | slice) -> str | Labels:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self._array))
            if step == 1:
                return Labels(self._array.slice(start, max(stop - start, 0)))
            return Labels(self._array.take(list(range(start, stop, step))))
        n = len(self._array)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"label index {index} out of range ({n} labels)")
        value: str = self._array[i].as_py()
        return value

    def __iter__(self) -> Iterator[str]:
        for at in range(0, len(self._array), _CHUNK):
            yield from self._array.slice(at, _CHUNK).to_pylist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Labels) and self._array.type == other._array.type:
            return len(self) == len(other) and bool(self._array.equals(other._array))
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        shown = ", ".join(repr(x) for x in self._array.slice(0, 3).to_pylist())
        more = ", ..." if len(self) > 3 else ""
        return f"Labels([{shown}{more}], {len(self):,} labels)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Labels, (self._array,))
