"""Removing duplicate triples (the first occurrence of each is kept, in file order), in memory or
within a memory budget (``data.memory_budget``).

In memory, a split's ids (``[lines, 3]``, ``int32`` where they fit) are deduplicated a part of
the heads at a time (:func:`first_occurrences`). Within a budget, a split whose ids and their
deduplication would not fit it has its ids written to a temporary file as they are mapped
(:class:`SpilledIds`) and deduplicated from there (:func:`spilled_first_occurrences`): the rows
of a group of heads at a time, as many groups as the budget needs, read back in blocks. What
stays in memory beyond the budget is a byte a line (the mask of the lines kept) and the distinct
triples, which are the result.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import numpy as np

from kgpipe.errors import StorageError, StorageFull
from kgpipe.retry import is_out_of_space

__all__ = [
    "SpilledIds",
    "close_all",
    "first_occurrences",
    "ids_dtype",
    "in_memory_bytes",
    "spilled_first_occurrences",
]

#: rows per part of the in-memory deduplication (its temporaries are a few times a part's keys)
_DEDUP_PART = 1 << 22
#: bytes a line the in-memory path holds: its ids (12), its part (2), the kept mask (1), the
#: kept rows' int32 copy (12, at most)
_IN_MEMORY_LINE = 27
#: bytes a row of one part's or group's deduplication: the rows (12), their key (8), the sort's
#: order and sorted keys (16), first-index outputs (16), a group's positions (8) and its
#: collected copies before they are joined (20)
_GROUP_ROW = 80
#: bytes a line of a block read back from the spill file: the ids (12), the head's group (4),
#: the mask (1) and the positions selected (8)
_BLOCK_LINE = 25
_MIN_ROWS = 1 << 16


def ids_dtype(entities: int, relations: int) -> np.dtype:
    """``int32`` where both label counts fit it, else ``int64``."""
    fits = max(entities, relations) <= np.iinfo(np.int32).max
    return np.dtype(np.int32 if fits else np.int64)


def in_memory_bytes(lines: int) -> int:
    """About the most memory the in-memory path needs for a split of ``lines`` lines."""
    return lines * _IN_MEMORY_LINE + min(lines, _DEDUP_PART) * _GROUP_ROW


def first_occurrences(rows: np.ndarray, num_entities: int, num_relations: int) -> np.ndarray:
    """Sorted indices of the first occurrence of every distinct row of an ``[n, 3]`` array.

    Duplicates share their head, so the rows are deduplicated a part at a time, parts being the
    heads modulo the number of parts: the sort's temporaries are those of one part (~4M rows),
    not of all rows. Each part keeps the first of equal keys (a stable sort), and a part's
    indices ascend, so what it keeps is the first occurrence in the whole array."""
    n = len(rows)
    if n == 0:
        return np.arange(0, dtype=np.int64)
    parts = max(1, -(-n // _DEDUP_PART))
    if parts == 1 or _wide(num_entities, num_relations):
        return _firsts(rows, num_entities, num_relations)
    part = np.empty(n, dtype=np.int16 if parts < 2**15 else np.int32)
    for at in range(0, n, _DEDUP_PART):  # no temporary of n wide integers
        np.remainder(
            rows[at : at + _DEDUP_PART, 0], parts, out=part[at : at + _DEDUP_PART], casting="unsafe"
        )
    keep = np.zeros(n, dtype=bool)
    for p in range(parts):
        index = np.flatnonzero(part == p)
        keep[index[_firsts(rows[index], num_entities, num_relations)]] = True
        del index
    del part
    return np.flatnonzero(keep)


def _wide(num_entities: int, num_relations: int) -> bool:
    """Whether a row's ids do not fit one ``int64`` key."""
    return num_entities * num_entities * max(num_relations, 1) >= 2**62


def _firsts(rows: np.ndarray, num_entities: int, num_relations: int) -> np.ndarray:
    """Sorted indices of the first occurrence of every distinct row of ``rows``."""
    if len(rows) == 0:
        return np.arange(0, dtype=np.int64)
    if _wide(num_entities, num_relations):
        _, first = np.unique(rows, axis=0, return_index=True)
        first.sort()
        return first
    keys = rows[:, 0].astype(np.int64)  # one array of n keys, in place from here
    keys *= num_relations
    keys += rows[:, 1]
    keys *= num_entities
    keys += rows[:, 2]
    _, first = np.unique(keys, return_index=True)
    del keys
    first.sort()
    return first


class SpilledIds:
    """A split's ids, ``[lines, 3]`` in file order, in a temporary file of ``folder`` (the
    system's temp folder by default) that has no name: it is gone when closed, or when the
    process ends however it ends."""

    def __init__(self, url: str, lines: int, dtype: np.dtype, folder: str | None) -> None:
        self.url, self.lines, self.dtype = url, lines, np.dtype(dtype)
        self.folder = folder or tempfile.gettempdir()
        try:
            self._file = tempfile.TemporaryFile(prefix="kgpipe-ids-", dir=self.folder)  # noqa: SIM115
        except OSError as err:
            kind = StorageFull if is_out_of_space(err) else StorageError
            raise kind(
                f"{self.folder}: cannot spill the ids of {url} there ({err.strerror or err}); "
                "set data.spill_dir to a writable local folder"
            ) from None
        self.written = 0

    def reset(self) -> None:
        """Start again from the first line (a read that is retried from the start)."""
        self._file.seek(0)
        self._file.truncate()
        self.written = 0

    def write(self, ids: np.ndarray) -> None:
        """Append ``[k, 3]`` ids."""
        block = np.ascontiguousarray(ids, dtype=self.dtype)
        try:
            self._file.write(block.data.cast("B"))
        except OSError as err:
            if is_out_of_space(err):
                raise StorageFull(
                    f"{self.folder}: no space left to spill the ids of {self.url} "
                    f"({self.lines * 3 * self.dtype.itemsize:,} bytes); point data.spill_dir at "
                    "a larger disk, or raise data.memory_budget"
                ) from None
            raise StorageError(  # not the input's fault, and not worth a retry of the read
                f"{self.folder}: cannot spill the ids of {self.url}: {err}"
            ) from None
        self.written += len(block)

    def blocks(self, rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(first line, ids)`` of ``rows`` lines at a time, from the start."""
        self._file.flush()
        fd = self._file.fileno()
        row_bytes = 3 * self.dtype.itemsize
        for start in range(0, self.written, rows):
            block = np.empty((min(rows, self.written - start), 3), dtype=self.dtype)
            view, offset = block.data.cast("B"), start * row_bytes
            while view.nbytes:
                got = os.preadv(fd, [view], offset)
                if got <= 0:
                    raise OSError(f"{self.folder}: the spilled ids of {self.url} are short")
                view, offset = view[got:], offset + got
            yield start, block

    def close(self) -> None:
        self._file.close()

    def __len__(self) -> int:
        return self.lines


def close_all(spilled: list[SpilledIds]) -> None:
    """Close every one of ``spilled`` (their space is the disk's again)."""
    for ids in spilled:
        ids.close()


def spilled_first_occurrences(
    ids: SpilledIds, num_entities: int, num_relations: int, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``ids`` as ``int64`` ``[k, 3]`` in file order (the first occurrence
    of each), and the mask of the lines kept, in about ``budget`` bytes beyond those two.

    The rows are deduplicated a group of heads at a time (heads modulo the number of groups; a
    head's rows are all in its group, and so are its duplicates), each group collected from the
    file in blocks: a pass over the file per group, and one more to gather the kept rows."""
    n = ids.written
    keep = np.zeros(n, dtype=bool)
    block = max(_MIN_ROWS, budget // 4 // _BLOCK_LINE)
    group = max(_MIN_ROWS, (budget - block * _BLOCK_LINE) // _GROUP_ROW)
    groups = max(1, -(-n // group))
    for g in range(groups):
        rows: list[np.ndarray] = []
        where: list[np.ndarray] = []
        for start, part in ids.blocks(block):
            if groups == 1:
                rows.append(part)
                where.append(np.arange(start, start + len(part)))
                continue
            index = np.flatnonzero(np.remainder(part[:, 0], groups) == g)
            rows.append(part[index])
            where.append(index + start)
            del part, index
        mine = np.concatenate(rows) if rows else np.empty((0, 3), ids.dtype)
        lines = np.concatenate(where) if where else np.empty(0, np.int64)
        del rows, where
        keep[lines[_firsts(mine, num_entities, num_relations)]] = True
        del mine, lines
    out = np.empty((int(np.count_nonzero(keep)), 3), dtype=np.int64)
    at = 0
    for start, part in ids.blocks(block):
        kept = part[keep[start : start + len(part)]]
        out[at : at + len(kept)] = kept
        at += len(kept)
    return out, keep
