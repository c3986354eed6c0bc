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

__all__ = ["TripleSplit", "split_record", "split_triples"]

_CHUNK = 1 << 16


@dataclass(frozen=True, eq=False)
class TripleSplit:
    """Row indices (sorted, into the split array) of each part, and the counts asked for."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    wanted_valid: int
    wanted_test: int


def _wanted(fraction: float, n: int) -> int:
    return int(np.floor(fraction * n + 0.5))


def split_triples(rows: np.ndarray, *, valid: float, test: float, seed: int) -> TripleSplit:
    """Split the distinct triples ``rows`` (``[n, 3]`` ids ``(head, relation, tail)``) into
    train/valid/test parts of about ``1 - valid - test``, ``valid`` and ``test`` of them (the
    module's rule), shuffled with ``numpy.random.default_rng(seed)``."""
    if not (0.0 <= valid < 1.0 and 0.0 <= test < 1.0 and valid + test < 1.0):
        raise ValueError(f"fractions must be in [0, 1) and sum below 1: {valid}, {test}")
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    wanted_valid, wanted_test = _wanted(valid, n), _wanted(test, n)
    wanted = wanted_valid + wanted_test
    taken: list[int] = []
    if wanted and n:
        heads, relations, tails = rows[:, 0], rows[:, 1], rows[:, 2]
        num_entities = int(max(heads.max(), tails.max())) + 1
        entity_left = (
            np.bincount(heads, minlength=num_entities) + np.bincount(tails, minlength=num_entities)
        ).tolist()
        relation_left = np.bincount(relations).tolist()
        order = np.random.default_rng(seed).permutation(n)
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
        train=np.flatnonzero(in_train),
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
        "triples": {"train": len(parts.train), "valid": len(parts.valid), "test": len(parts.test)},
    }
