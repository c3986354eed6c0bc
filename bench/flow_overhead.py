"""The overhead of the Prefect flow + tasks + LocalCluster against the plain in-process loop,
for the same epochs (the bundled UMLS demo config).

    .venv/bin/python bench/flow_overhead.py --json bench/results/flow_overhead_umls.json

Each variant is one ``kgpipe train`` process (wall time measured by this script, start-up
included), ``--rounds`` interleaved rounds, medians:

* ``plain``: ``--no-prefect``, in-process training loop
* ``plain_dask1``: ``--no-prefect`` with ``distributed.launch=dask`` (a 1-worker LocalCluster)
* ``flow``: the Prefect flow, in-process training
* ``flow_dask1``: the Prefect flow with a 1-worker LocalCluster
* ``flow_dask2``: the Prefect flow with 2 workers (step sync)

The flow variants talk to a temporary local Prefect API unless ``--server`` starts one
``prefect server`` first and points every run at it (no per-process server start-up).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from common import commit, hardware, report  # noqa: E402

VARIANTS = {
    "plain": ["--no-prefect"],
    "plain_dask1": ["--no-prefect", "--set", "distributed.launch=dask"],
    "flow": [],
    "flow_dask1": ["--set", "distributed.launch=dask"],
    "flow_dask2": ["--set", "distributed.workers=2"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--server", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    env = dict(os.environ)
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        if a.server:
            from prefect_support import start_prefect_server

            proc, server = start_prefect_server(Path(tmp) / "prefect")
            env = server.client_env()
        try:
            times: dict[str, list[float]] = {k: [] for k in VARIANTS}
            train_s: dict[str, list[float]] = {k: [] for k in VARIANTS}
            for r in range(a.rounds):
                for name, extra in VARIANTS.items():
                    run = f"{name}-{r}"
                    cmd = [sys.executable, "-m", "kgpipe.cli", "train", "-q", "-c",
                           str(REPO / "configs" / "umls-complex.yaml"),
                           "--set", f"run.root={tmp}/runs", "--set", f"run.name={run}",
                           "--set", f"training.epochs={a.epochs}", *extra]  # fmt: skip
                    t0 = time.perf_counter()
                    subprocess.run(cmd, check=True, env=env, cwd=REPO, capture_output=True)
                    times[name].append(time.perf_counter() - t0)
                    rows = [json.loads(x) for x in
                            (Path(tmp) / "runs" / run / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
                    train_s[name].append(sum(x["seconds"] for x in rows))
                    print(name, r, f"{times[name][-1]:.1f} s", flush=True)
        finally:
            if proc is not None:
                from prefect_support import stop_prefect_server

                stop_prefect_server(proc)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "benchmark": "flow-overhead",
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "epochs": a.epochs,
        "prefect_api": "prefect server (running)" if a.server else "temporary (ephemeral)",
        "wall_seconds": times,
        "train_seconds": train_s,
        "median_wall_seconds": med,
        "ratio_vs_plain": {k: v / med["plain"] for k, v in med.items()},
    }
    report(res, a.json)


if __name__ == "__main__":
    main()
