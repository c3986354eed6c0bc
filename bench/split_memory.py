"""What ``data.split`` allocates beyond the distinct triples it splits, per triple.

Runs kgpipe.data.dataset._split on synthetic triples as staging hands them to it (int64 ids)
under tracemalloc (numpy's allocations are traced) and prints the peak beyond the rows
themselves. Run it with another
tree first on PYTHONPATH to compare code before and after::

    PYTHONPATH=/tmp/wt-before python bench/split_memory.py
    python bench/split_memory.py
"""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np
import torch

from kgpipe.config import DataConfig
from kgpipe.data import dataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--triples", type=int, default=2_000_000)
    ap.add_argument("--entities", type=int, default=200_000)
    args = ap.parse_args()
    n = args.triples
    g = np.random.default_rng(0)
    rows = np.stack(
        [g.integers(0, args.entities, n), g.integers(0, 200, n), g.integers(0, args.entities, n)],
        axis=1,
    ).astype(np.int64)  # as kgpipe.data.dataset._load gives them
    cfg = DataConfig(train="x.tsv", split={"valid": 0.05, "test": 0.05, "seed": 1})
    report = dataset.SplitReport(
        source="x", lines=n, triples=n, duplicates=0, unseen=0, unseen_action="n/a"
    )
    tensors = {"train": torch.from_numpy(rows)}
    tracemalloc.start()
    dataset._split(cfg, tensors, {"train": report})
    peak = tracemalloc.get_traced_memory()[1]
    print(
        f"{n:,} triples ({rows.nbytes / 1e6:.0f} MB of int64 ids): data.split's peak beyond "
        f"them {peak / 1e6:.1f} MB = {peak / n:.1f} B/triple; train {len(tensors['train']):,}"
    )


if __name__ == "__main__":
    main()
