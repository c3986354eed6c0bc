"""The machine's memory for the training triples of K ranks: a copy each, or one shared copy.

Every rank of a step-synchronised gang holds all training triples. This stages ``--triples``
random triples as a run folder's shards once, then starts ``--ranks`` processes at once, each
getting the triples the way a rank does (``own``: ``read_shards``, what ``distributed.
share_triples: false`` does; ``shared``: ``open_shared``, the default), reading every row (an
epoch's batches touch them all), and reporting while all of them still hold the triples:

- ``Pss`` (``/proc/self/smaps_rollup``): each page counted once over the processes that map it,
  so the sum over the ranks is what the machine holds for them;
- ``Rss`` and ``VmHWM`` (what Dask's ``memory_limit`` sees: shared file pages count in each
  process) and ``RssAnon`` (memory only that process holds);
- the seconds to get the triples (the first ``shared`` rank writes the file; the others map it).

Modes alternate round by round; medians.

    .venv/bin/python bench/shared_triples.py --triples 50000000 --ranks 2 --rounds 3
Results: bench/results/shared_triples_<N>_<K>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, stage_random_triples, write_result

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
def fields(path, keys):
    out = {}
    for line in open(path):
        k = line.split(":")[0]
        if k in keys:
            out[k] = int(line.split()[1]) * 1024
    return out
import torch
from kgpipe.data.shards import read_manifest, read_shards
from kgpipe.data.shared_triples import open_shared
from kgpipe.storage import Store
store, mode, go = Store(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
manifest = read_manifest(store)
start = fields("/proc/self/status", ("VmRSS",))["VmRSS"]
t0 = time.perf_counter()
if mode == "shared":
    shared = open_shared(store, manifest, wide=False, folder=Path(sys.argv[5]))
    train = shared.tensor
else:
    train = read_shards(store, manifest, list(range(manifest.num_shards)))
seconds = time.perf_counter() - t0
check = 0
for at in range(0, len(train), 1 << 20):  # every row read, a batch-sized block at a time
    check += int(train[at : at + (1 << 20)].sum())
row = {"seconds": seconds, "check": check, "start_rss": start}
row.update(fields("/proc/self/smaps_rollup", ("Rss", "Pss", "Anonymous")))
row.update(fields("/proc/self/status", ("VmHWM", "RssAnon", "RssFile")))
print(json.dumps(row), flush=True)
while not go.exists():
    time.sleep(0.05)
if mode == "shared":
    shared.close()
"""


def _round(run: str, folder: str, mode: str, ranks: int) -> dict[str, Any]:
    go = Path(tempfile.mkdtemp()) / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(ROOT), run, mode, str(go), folder],
            stdout=subprocess.PIPE,
            text=True,
            cwd=run,
        )
        for _ in range(ranks)
    ]
    rows = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
    time.sleep(0.5)
    go.touch()
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"a {mode} rank failed")
    assert len({r["check"] for r in rows}) == 1
    return {
        "mode": mode,
        "ranks": rows,
        "pss_sum": sum(r["Pss"] for r in rows),
        "rss_sum": sum(r["Rss"] for r in rows),
        "anon_sum": sum(r["RssAnon"] for r in rows),
        "max_vmhwm_above_start": max(r["VmHWM"] - r["start_rss"] for r in rows),
        "seconds_max": max(r["seconds"] for r in rows),
        "seconds_min": min(r["seconds"] for r in rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--triples", type=int, default=50_000_000)
    p.add_argument("--entities", type=int, default=20_000_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()

    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "triples": args.triples,
        "ranks": args.ranks,
        "rounds": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        run = str(Path(tmp) / "run")
        stage_random_triples(run, triples=args.triples, entities=args.entities, shards=args.shards)
        folder = str(Path(tmp) / "shared")
        for _ in range(args.rounds):
            for mode in ("own", "shared"):
                out["rounds"].append(_round(run, folder, mode, args.ranks))
                r = out["rounds"][-1]
                print(
                    f"{mode:6s} Pss sum {r['pss_sum'] >> 20:6d} MiB  Rss sum "
                    f"{r['rss_sum'] >> 20:6d} MiB  anon sum {r['anon_sum'] >> 20:6d} MiB  "
                    f"seconds {r['seconds_min']:.2f}-{r['seconds_max']:.2f}",
                    flush=True,
                )
        left = sorted(p.name for p in Path(folder).iterdir()) if Path(folder).exists() else []
        out["left_in_shared_folder"] = left
    keys = ("pss_sum", "rss_sum", "anon_sum", "max_vmhwm_above_start", "seconds_max")
    out["median"] = {
        mode: {k: statistics.median(r[k] for r in out["rounds"] if r["mode"] == mode) for k in keys}
        for mode in ("own", "shared")
    }
    print(json.dumps(out["median"], indent=1))
    write_result(
        out, Path(args.json or RESULTS / f"shared_triples_{args.triples}_{args.ranks}.json")
    )


if __name__ == "__main__":
    main()
