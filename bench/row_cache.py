"""The bounded-staleness row cache's bookkeeping per step (``RowCache`` lookup and update), on
steps the size of FB15k-237's (14,541 entities, ~1,800 distinct ids a rank touches per step,
half of them its own, rows of 200 floats), one thread, with no training around it.

Each code tree (``--before PATH``: a checkout of the code before) runs in a fresh process per
round, rounds interleaved; reports the median milliseconds per step of the lookup (with the
row assembly a step does) and of the update, for each ``k``.

    .venv/bin/python bench/row_cache.py --before /tmp/wt-before
Results: bench/results/row_cache.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import code_trees, commit, hardware, interleaved_rounds

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from kgpipe.distributed.sharded import LocalIndex, RowCache
E, d, steps = 14541, 200, int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
own = torch.arange(0, E, 2)
index = LocalIndex(own)
table = torch.randn(own.numel(), d, generator=gen)
fetched_rows = torch.randn(E, d, generator=gen)  # what "fetching" returns
out = {}
for k in (1, 4):
    cache = RowCache(k)
    read = update = 0.0
    for step in range(steps):
        touched = torch.unique(torch.randint(0, E, (1800,), generator=gen))
        a = time.perf_counter()
        mine, pos = index.locate(touched)
        fresh, cached = cache.lookup(touched, step)
        need = ~(mine | fresh)
        fetched = fetched_rows[touched[need]]
        rows = table.new_empty((touched.numel(), d))
        rows[mine] = table[pos[mine]]
        if cached is not None:
            rows[fresh] = cached
        rows[need] = fetched
        b = time.perf_counter()
        cache.update(touched[need], fetched, step)
        update += time.perf_counter() - b
        read += b - a
    out[str(k)] = {"read_ms": read / steps * 1e3, "update_ms": update / steps * 1e3,
                   "cached_rows": cache.size}
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--before", help="a checkout of the code before")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--json", default=str(RESULTS / "row_cache.json"))
    args = p.parse_args()
    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
    }
    trees = code_trees(args.before, ROOT)
    out["runs"] = interleaved_rounds(CHILD, trees, args.rounds, [str(args.steps)], cwd="/")
    out["median"] = {
        name: {
            k: {
                m: round(statistics.median(row[k][m] for row in rows), 3)
                for m in ("read_ms", "update_ms")
            }
            for k in ("1", "4")
        }
        for name, rows in out["runs"].items()
    }
    print(json.dumps(out["median"], indent=1))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
