"""Per-query candidate files for the bundled UMLS graph (``data.candidates``), written as a user
would bring them: a row of entity labels per line of the split's file."""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Any

import kgpipe

UMLS = Path(kgpipe.__file__).parent / "datasets" / "umls"


def umls_lines(split: str) -> list[list[str]]:
    """The ``(head, relation, tail)`` labels of each line of a bundled UMLS split."""
    with gzip.open(UMLS / f"{split}.txt.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def umls_entities() -> list[str]:
    seen = {
        x for split in ("train", "valid", "test") for h, _, t in umls_lines(split) for x in (h, t)
    }
    return sorted(seen)


def write_candidate_files(
    folder: Path, k: int = 20, seed: int = 0, splits: tuple[str, ...] = ("valid", "test")
) -> dict[str, Any]:
    """Tab-separated candidate files of ``k`` labels a line, drawn with ``seed`` (answers and
    known triples may be among them); returns the ``data.candidates`` section naming them."""
    rng = random.Random(seed)
    entities = umls_entities()
    section: dict[str, Any] = {}
    for split in splits:
        n = len(umls_lines(split))
        section[split] = {}
        for side in ("head", "tail"):
            path = folder / f"{split}-{side}.tsv"
            rows = ["\t".join(rng.choice(entities) for _ in range(k)) for _ in range(n)]
            path.write_text("\n".join(rows) + "\n", encoding="utf-8")
            section[split][side] = str(path)
    return section
