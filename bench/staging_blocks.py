"""Reading a graph (``load_dataset``) at several ``data.block_size`` values: seconds and peak
resident memory (``VmHWM``), one fresh process per run, sizes interleaved round by round.

    .venv/bin/python bench/staging_blocks.py --edges 100000000 --entities 20000000 \\
        --blocks 64MiB 8MiB --rounds 2
Results: bench/results/staging_blocks_<edges>.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, synth_graph, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from kgpipe.config import DataConfig
from kgpipe.data.dataset import load_dataset
g, block = sys.argv[2], sys.argv[3]
t = time.perf_counter()
d = load_dataset(DataConfig(train=g + "/train.tsv", valid=g + "/valid.tsv",
                            test=g + "/test.tsv", header=False, block_size=block))
peak = next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmHWM"))
print(json.dumps({"block": block, "seconds": time.perf_counter() - t, "peak": peak,
                  "fingerprint": d.fingerprint}))
"""


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--entities", type=int, default=2_000_000)
    p.add_argument("--blocks", nargs="+", default=["64MiB", "16MiB", "8MiB"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--graph", default=None, help="keep the graph here (reused when it exists)")
    args = p.parse_args()
    graph = Path(args.graph or f"/tmp/kgpipe-staging-{args.edges}")
    synth_graph(graph, entities=args.entities, relations=100, edges=args.edges)
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in args.blocks}
    for r in range(args.rounds):
        for block in args.blocks:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(ROOT), str(graph), block],
                capture_output=True, text=True, check=True, cwd="/tmp", env={"PATH": ""},
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            runs[block].append(row)
            print(r, json.dumps(row), flush=True)
    write_result(
        {"hardware": hardware(), "commit": commit(), "command": " ".join(sys.argv), "runs": runs},
        RESULTS / f"staging_blocks_{args.edges}.json",
    )


if __name__ == "__main__":
    main()
