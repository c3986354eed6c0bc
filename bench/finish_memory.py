"""The driver's memory when a sharded run finishes (issue 22): model file, test, export.

Generates a synthetic graph (``kgpipe synth``), trains it for one epoch with 2 sharded workers
on a LocalCluster, then finishes the run again in a fresh process per round, with this
checkout's code ("after") and with another checkout's ("before", ``--before PATH``, e.g. a
``git worktree`` of an older commit), interleaved. Each finish writes ``model.safetensors``,
ranks the test split against every entity and exports the embeddings, as ``kgpipe train``
does at its end. Reports per finish its seconds, its peak resident memory (``VmHWM``) and its
peak anonymous memory (``RssAnon``, sampled every 20 ms: what the process allocated, without
the pages of mapped files, which the kernel can drop under pressure), and the test MRR (which
must be the same).

    git worktree add /tmp/kgpipe-before 6fbbdb6
    .venv/bin/python bench/finish_memory.py --entities 4600000 --edges 6000000 --exponent 0.2 \
        --before /tmp/kgpipe-before --rounds 2
Results: bench/results/finish_memory_<entities>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, train_sharded

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

#: run in a fresh process with the code under test first on its path: one finish, measured
CHILD = r"""
import json, sys, threading, time
peak = [0]
def sample():
    while True:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    peak[0] = max(peak[0], int(line.split()[1]) * 1024)
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
from kgpipe.runs.finish import finish_run
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.read import open_run
url = sys.argv[1]
_, cfg = open_run(url)
cfg = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"test": True})})
history = [json.loads(x) for x in open(url + "/metrics.jsonl")]
t0 = time.perf_counter()
results = finish_run(RunFolder.read(cfg), history=history)
seconds = time.perf_counter() - t0
with open("/proc/self/status") as f:
    hwm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
print(json.dumps({"seconds": round(seconds, 1), "peak_rss_bytes": hwm,
                  "peak_anon_bytes": peak[0], "test_mrr": results["mrr"],
                  "test_triples": results["triples"]}))
"""


def _finish(code: Path, run: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(run)],
        env=env, cwd=str(code), check=True, capture_output=True, text=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entities", type=int, default=4_600_000)
    p.add_argument("--edges", type=int, default=6_000_000)
    p.add_argument("--relations", type=int, default=50)
    p.add_argument("--exponent", type=float, default=0.2)
    p.add_argument("--test", type=float, default=0.0002, help="test (and valid) fraction")
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--before", type=Path, default=None, help="a checkout of the older code")
    p.add_argument("--keep", type=Path, default=None, help="keep the graph and run here")
    args = p.parse_args()
    codes = {"after": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "codes": {k: str(v) for k, v in codes.items()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        graph = where / "graph"
        if not (graph / "train.tsv").exists():
            subprocess.run(
                [sys.executable, "-m", "kgpipe.cli", "synth", str(graph), "--entities",
                 str(args.entities), "--relations", str(args.relations), "--edges",
                 str(args.edges), "--valid", str(args.test), "--test", str(args.test),
                 "--exponent", str(args.exponent), "-q"],
                check=True,
            )  # fmt: skip
        run = where / "runs" / "sharded"
        if not (run / "model.safetensors").exists():
            t0 = time.perf_counter()
            train_sharded(graph, where / "runs", args.dim, args.workers)
            out["train_seconds"] = round(time.perf_counter() - t0, 1)
        info = json.loads((run / "data.json").read_text())
        rows: dict[str, list[dict[str, Any]]] = {k: [] for k in codes}
        for i in range(args.rounds):
            for name, code in codes.items() if i % 2 == 0 else reversed(codes.items()):
                got = _finish(code, run)
                rows[name].append(got)
                print(name, json.dumps(got), flush=True)
    n = int(info["num_entities"])
    out["entities"] = n
    out["entity_table_bytes"] = 4 * n * args.dim
    out["rounds"] = rows
    out["medians"] = {
        name: {
            key: statistics.median(r[key] for r in got)
            for key in ("seconds", "peak_rss_bytes", "peak_anon_bytes")
        }
        for name, got in rows.items()
    }
    mrrs = {r["test_mrr"] for got in rows.values() for r in got}
    out["same_test_mrr"] = len(mrrs) == 1
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"finish_memory_{n}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["medians"], indent=1), "same test MRR:", out["same_test_mrr"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
