"""What holding the staged training triples costs a rank: `read_shards` before and after.

Every rank of a step-synchronised gang (the sharded strategy included) reads all training
triples. This stages ``--triples`` random triples as the run folder's shards once, then reads
them back in a fresh process per code tree and round (``--before PATH``: a checkout of the code
before, e.g. ``git worktree add /tmp/kgpipe-before REV``), rounds interleaved, and reports the
seconds, the peak resident memory (``VmHWM``) above the process's start and the bytes of the
tensor it returned.

    .venv/bin/python bench/triples_memory.py --triples 50000000 --before /tmp/kgpipe-before
Results: bench/results/triples_memory_<N>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    code_trees,
    commit,
    hardware,
    interleaved_rounds,
    stage_random_triples,
    write_result,
)

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
def status(key):  # VmHWM/VmRSS of this process (ru_maxrss survives exec: the parent's peak)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
from kgpipe.data.shards import read_manifest, read_shards
from kgpipe.storage import Store
start = status("VmRSS")
store = Store(sys.argv[2])
manifest = read_manifest(store)
t0 = time.perf_counter()
train = read_shards(store, manifest, list(range(manifest.num_shards)))
seconds = time.perf_counter() - t0
peak = status("VmHWM")
print(json.dumps({"seconds": seconds, "peak_above_start": peak - start,
                  "tensor_bytes": train.numel() * train.element_size(),
                  "dtype": str(train.dtype), "rows": int(train.shape[0])}))
"""


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--triples", type=int, default=50_000_000)
    p.add_argument("--entities", type=int, default=20_000_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--before", help="a checkout of the code before")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()

    trees = code_trees(args.before, ROOT)
    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "triples": args.triples,
    }
    with tempfile.TemporaryDirectory() as tmp:
        stage_random_triples(tmp, triples=args.triples, entities=args.entities, shards=args.shards)
        out["runs"] = interleaved_rounds(CHILD, trees, args.rounds, [tmp], cwd=tmp)
    out["median"] = {
        name: {
            k: statistics.median(row[k] for row in rows)
            for k in ("seconds", "peak_above_start", "tensor_bytes")
        }
        for name, rows in out["runs"].items()
    }
    print(json.dumps(out["median"], indent=1))
    write_result(out, Path(args.json or RESULTS / f"triples_memory_{args.triples}.json"))


if __name__ == "__main__":
    main()
