"""Reading per-query candidate files (``data.candidates``, OGB's ``head_neg``/``tail_neg``):
seconds and peak resident memory (``VmHWM``) of mapping one side's file to ids, one fresh
process per run, the readers interleaved round by round:

- ``text``: a tab-separated file through :func:`kgpipe.data.candidates.read_candidates`;
- ``npy``: OGB's integer array saved with ``np.save``, through the same function;
- ``python``: the baseline a user would write: a line at a time, ``str.split`` and a dict of the
  labels (the ids of every row; no checks beyond the lookup).

    .venv/bin/python bench/candidate_files.py --entities 2500604 --rows 100000 --k 500
Results: bench/results/candidate_files_<rows>x<k>.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

CHILD = """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
folder, how, n_entities, rows = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
import pyarrow as pa
from kgpipe.data.candidates import read_candidates
labels = pa.array([str(i) for i in range(n_entities)], pa.large_string())
kept = np.arange(rows)
def peak():
    return next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmHWM"))
before = peak()
t = time.perf_counter()
if how == "python":
    index = {labels[i].as_py(): i for i in range(len(labels))}
    with open(folder + "/head.tsv") as f:
        ids = np.array([[index[x] for x in line.rstrip("\\n").split("\\t")] for line in f],
                       dtype=np.int32)
    digest = int(ids.sum())
else:
    path = folder + ("/head.npy" if how == "npy" else "/head.tsv")
    got = read_candidates({"head": path, "tail": path}, None, entities=labels, lines=rows,
                          kept=kept, triples_source="bench")
    ids = got.head
    digest = int(ids.astype(np.int64).sum())
print(json.dumps({"how": how, "seconds": time.perf_counter() - t, "peak": peak(),
                  "before": before, "checksum": digest}))
"""


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entities", type=int, default=2_500_604)  # ogbl-wikikg2's
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--k", type=int, default=500)  # ogbl-wikikg2's
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--how", nargs="+", default=["text", "npy", "python"])
    args = p.parse_args()
    folder = Path(f"/tmp/kgpipe-candidates-{args.rows}x{args.k}")
    folder.mkdir(exist_ok=True)
    if not (folder / "head.npy").exists():
        rng = np.random.default_rng(0)
        array = rng.integers(0, args.entities, (args.rows, args.k), dtype=np.int64)
        np.save(folder / "head.npy", array)
        with open(folder / "head.tsv", "w") as f:
            for at in range(0, args.rows, 10_000):
                block = array[at : at + 10_000]
                f.write("".join("\t".join(map(str, row)) + "\n" for row in block.tolist()))
    runs: dict[str, list[dict[str, Any]]] = {h: [] for h in args.how}
    for _ in range(args.rounds):
        for how in args.how:  # every reader reads each side the same way: one side measured
            cmd = [sys.executable, "-c", CHILD, str(ROOT), str(folder), how]
            cmd += [str(args.entities), str(args.rows)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/tmp")
            runs[how].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(how, runs[how][-1], flush=True)
    sums = {r["checksum"] for rows in runs.values() for r in rows}
    assert len(sums) == 1, f"the readers disagree: {sums}"
    labels = args.rows * args.k
    summary = {
        how: {
            "seconds_median": float(np.median([r["seconds"] for r in rows])),
            "labels_per_s": labels / float(np.median([r["seconds"] for r in rows])),
            "peak_bytes_median": float(np.median([r["peak"] for r in rows])),
            "start_bytes": float(np.median([r["before"] for r in rows])),
        }
        for how, rows in runs.items()
    }
    text_file = (folder / "head.tsv").stat().st_size
    result = {
        "command": " ".join(sys.argv),
        "hardware": hardware(),
        "commit": commit(),
        "entities": args.entities,
        "rows": args.rows,
        "k": args.k,
        "text_bytes": text_file,
        "ids_bytes": labels * 4,
        "runs": runs,
        "summary": summary,
    }
    write_result(result, RESULTS / f"candidate_files_{args.rows}x{args.k}.json")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
