"""Peak memory of reading an OGB-style ``.npy`` candidate file that lives on an object store.

    .venv/bin/python bench/candidates_npy_memory.py --rows 20000000

One side's file: ``--rows`` x 5 int64 candidates (entity numbers below 1000), put into fsspec's
in-memory file system (an object store's code path: ``memory://`` is not a local file), then
read by ``kgpipe.data.candidates._npy`` keeping every 1000th row, as staging keeps the rows of
the triples it kept. The peak is Python's traced allocations (numpy's included) during the
read, the file system's own copy of the file excluded; it runs in this process, so run it
once per checkout to compare.
"""

from __future__ import annotations

import argparse
import io
import sys
import tracemalloc
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import fsspec  # noqa: E402
import numpy as np  # noqa: E402

import kgpipe.data.candidates as candidates  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=20_000_000)
    args = p.parse_args()
    rows = np.random.default_rng(0).integers(0, 1000, (args.rows, 5))
    url = f"memory://kgpipe-bench-{uuid.uuid4().hex}/head.npy"
    buf = io.BytesIO()
    np.save(buf, rows)
    fsspec.filesystem("memory").pipe(url, buf.getvalue())
    size = buf.getbuffer().nbytes
    del buf, rows
    entities = candidates.entity_array([str(i) for i in range(1000)])
    kept = np.arange(0, args.rows, 1000)
    tracemalloc.start()
    ids, count, _ = candidates._npy(url, None, entities, kept)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == args.rows and ids.shape == (len(kept), 5)
    print(f"file {size / 2**20:.0f} MiB: peak {peak / 2**20:.1f} MiB while reading it")


if __name__ == "__main__":
    main()
