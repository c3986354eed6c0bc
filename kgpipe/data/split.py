"""``data.split``: validation and test triples split off one file of triples.

The standard protocol: every entity and relation of valid/test occurs in train. The triples
are shuffled with the seed and taken in that order as long as each taken triple's head, tail
and relation keep at least one other occurrence among the triples left in train (a greedy pass
over per-entity and per-relation counts). So train keeps every entity and relation, and when
too few triples qualify (a sparse graph), fewer are taken than asked for, split between valid
and test in proportion to what was asked. Pure numpy on id arrays; deterministic for a given
input, fractions and seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TripleSplit", "keep_rows", "split_record", "split_triples"]

_CHUNK = 1 << 16


@dataclass(frozen=True, eq=False)
class TripleSplit:
    """Which rows of the split array stay in train (a mask: 1 byte a row, where indices took
    8), the row indices (sorted) of valid and test, and the counts asked for."""

    in_train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    wanted_valid: int
    wanted_test: int

    @property
    def train(self) -> np.ndarray:
        """The row indices (sorted) of train."""
        return np.flatnonzero(self.in_train)

    @property
    def train_count(self) -> int:
        return len(self.in_train) - len(self.valid) - len(self.test)


def _counts(columns: tuple[np.ndarray, ...], size: int) -> list[int]:
    """Occurrences of each id in ``columns``, counted a chunk at a time (``bincount`` widens
    its input to int64: a whole column of 100M ids is another 0.8 GB)."""
    out = np.zeros(size, dtype=np.int64)
    for col in columns:
        for lo in range(0, len(col), _CHUNK * 16):
            out += np.bincount(col[lo : lo + _CHUNK * 16], minlength=size)
    return out.tolist()


def keep_rows(rows: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The rows of ``rows`` where ``keep``, moved to its front in place, a chunk at a time
    (``rows[keep]`` copies them all); returns the view of that front part."""
    if not rows.flags.writeable:  # (a read-only map): a copy after all
        return rows[keep]
    written = 0
    for lo in range(0, len(rows), _CHUNK * 16):
        part = rows[lo : lo + _CHUNK * 16][keep[lo : lo + _CHUNK * 16]]
        rows[written : written + len(part)] = part
        written += len(part)
    return rows[:written]


def _wanted(fraction: float, n: int) -> int:
    return int(np.floor(fraction * n + 0.5))


def split_triples(rows: np.ndarray, *, valid: float, test: float, seed: int) -> TripleSplit:
    """Split the distinct triples ``rows`` (``[n, 3]`` ids ``(head, relation, tail)``) into
    train/valid/test parts of about ``1 - valid - test``, ``valid`` and ``test`` of them (the
    module's rule), shuffled with ``numpy.random.default_rng(seed)``."""
    if not (0.0 <= valid < 1.0 and 0.0 <= test < 1.0 and valid + test < 1.0):
        raise ValueError(f"fractions must be in [0, 1) and sum below 1: {valid}, {test}")
    rows = np.asarray(rows)  # int32 or int64 ids: not widened (a copy of every triple)
    n = len(rows)
    wanted_valid, wanted_test = _wanted(valid, n), _wanted(test, n)
    wanted = wanted_valid + wanted_test
    taken: list[int] = []
    if wanted and n:
        heads, relations, tails = rows[:, 0], rows[:, 1], rows[:, 2]
        num_entities = int(max(heads.max(), tails.max())) + 1
        entity_left = _counts((heads, tails), num_entities)
        relation_left = _counts((relations,), int(relations.max()) + 1)
        # permutation(n)'s order, in int32 where it fits (half of its int64)
        order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        np.random.default_rng(seed).shuffle(order)
        for start in range(0, n, _CHUNK):
            part = order[start : start + _CHUNK]
            ids = (heads[part], relations[part], tails[part])
            for i, h, r, t in zip(part.tolist(), *(x.tolist() for x in ids), strict=True):
                if relation_left[r] < 2:
                    continue
                if h == t:  # a self-loop: two occurrences of one entity
                    if entity_left[h] < 3:
                        continue
                    entity_left[h] -= 2
                else:
                    if entity_left[h] < 2 or entity_left[t] < 2:
                        continue
                    entity_left[h] -= 1
                    entity_left[t] -= 1
                relation_left[r] -= 1
                taken.append(i)
                if len(taken) == wanted:
                    break
            if len(taken) == wanted:
                break
    # short of the counts asked for: valid and test shrink in proportion
    n_valid = len(taken) if not wanted_test else round(len(taken) * wanted_valid / wanted)
    picked = np.asarray(taken, dtype=np.int64)
    in_train = np.ones(n, dtype=bool)
    in_train[picked] = False
    return TripleSplit(
        in_train=in_train,
        valid=np.sort(picked[:n_valid]),
        test=np.sort(picked[n_valid:]),
        wanted_valid=wanted_valid,
        wanted_test=wanted_test,
    )


def split_record(
    parts: TripleSplit, source: str, *, valid: float, test: float, seed: int
) -> dict[str, Any]:
    """What a split did, as JSON-ready data: ``source``, ``seed``, the ``fractions`` and the
    triples ``requested`` of valid/test (those asked for), and the ``triples`` of each part."""
    fractions = {k: v for k, v in (("valid", valid), ("test", test)) if v}
    wanted = {"valid": parts.wanted_valid, "test": parts.wanted_test}
    return {
        "source": source,
        "seed": seed,
        "fractions": fractions,
        "requested": {k: wanted[k] for k in fractions},
        "triples": {"train": parts.train_count, "valid": len(parts.valid), "test": len(parts.test)},
    }
