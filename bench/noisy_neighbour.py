"""Training speed when the machine is shared: alone, next to one busy process, next to a second
kgpipe run -- the product's defaults against pinned thread counts, and against another checkout.

    .venv/bin/python bench/noisy_neighbour.py --json bench/results/noisy_neighbour.json
    .venv/bin/python bench/noisy_neighbour.py --before /tmp/wt-base   # also time that checkout

Every measurement is one ``kgpipe train --no-prefect`` process (the CLI with the product's
process defaults, or ``training.threads`` pinned) on FB15k-237 TransE
(``bench/configs/fb15k237-transe-speed.yaml``: shared negatives, d=200, batch 1024), epochs of
``--steps`` steps, no checkpoint but the last, no evaluation. The figure is the median
triples/s of its epochs after the first two (warm-up). Scenarios:

* ``alone``: nothing else runs (check ``uptime`` first);
* ``busy``: next to one busy single-threaded process (a Python loop);
* ``pair``: two identical kgpipe runs at once (both figures reported).

Variants: ``default`` (the process settings kgpipe chooses), ``threads-1`` and ``threads-N``
(``training.threads`` pinned to 1 and to all cores). ``--before PATH`` adds ``before``: the
default settings of the checkout at PATH (its ``kgpipe`` package first on ``PYTHONPATH``).
Rounds interleave every variant and scenario; the report gives medians over rounds and the
goal ratios: busy / single-thread alone, busy / best alone, pair / alone.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from common import commit, hardware, report  # noqa: E402

CONFIG = REPO / "bench" / "configs" / "fb15k237-transe-speed.yaml"
BUSY = [sys.executable, "-c", "while True: pass"]


def _command(root: Path, name: str, args: argparse.Namespace, threads: int | None) -> list[str]:
    sets = [
        f"run.root={root}", f"run.name={name}", f"data.root={args.data_root}",
        f"training.epochs={args.epochs}", f"training.max_steps_per_epoch={args.steps}",
        "evaluation.every=0", "evaluation.test=false", f"checkpoint.every={args.epochs}",
    ]  # fmt: skip
    if threads is not None:
        sets.append(f"training.threads={threads}")
    cmd = [sys.executable, "-m", "kgpipe.cli", "train", "-q", "--no-prefect", "-c", str(CONFIG)]
    return cmd + [x for s in sets for x in ("--set", s)]


def _rate(run: Path) -> dict[str, Any]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    timed = rows[2:] or rows
    out: dict[str, Any] = {"triples_per_s": statistics.median(r["triples_per_s"] for r in timed)}
    if "threads" in rows[-1]:
        out["threads"] = [r["threads"] for r in rows]
    return out


def measure(variant: str, scenario: str, args: argparse.Namespace, tmp: Path) -> list[dict]:
    """One measurement: the triples/s of the kgpipe run(s) of ``variant`` in ``scenario``."""
    env = dict(os.environ)
    threads: int | None = None
    cwd = REPO
    if variant == "before":
        # `python -m` puts the working directory first on sys.path: run from that checkout
        env["PYTHONPATH"] = os.pathsep.join([args.before, env.get("PYTHONPATH", "")])
        cwd = Path(args.before)
    elif variant.startswith("threads-"):
        threads = int(variant.split("-")[1])
    runs = 2 if scenario == "pair" else 1
    names = [f"{variant}-{scenario}-{i}-{time.monotonic_ns()}" for i in range(runs)]
    busy = subprocess.Popen(BUSY) if scenario == "busy" else None
    try:
        procs = [
            subprocess.Popen(
                _command(tmp, n, args, threads), cwd=cwd, env=env, stdout=subprocess.DEVNULL
            )
            for n in names
        ]
        for proc in procs:
            if proc.wait() != 0:
                raise SystemExit(f"{variant}/{scenario}: kgpipe train failed")
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    rates = [_rate(tmp / n) for n in names]
    if variant == "before" and any("threads" in r for r in rates):  # only this checkout records it
        raise SystemExit(f"{variant}: this checkout's code ran, not the one at {args.before}")
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-root", default=str((REPO.parent / "shared" / "datasets").resolve()))
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--steps", type=int, default=40, help="steps of 1024 triples per epoch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", help="another checkout to time with its own defaults")
    p.add_argument("--json")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    variants = ["default", "threads-1", f"threads-{cores}"] + (["before"] if args.before else [])
    scenarios = ["alone", "busy", "pair"]
    raw: dict[str, dict[str, list[float]]] = {v: {s: [] for s in scenarios} for v in variants}
    threads_seen: dict[str, dict[str, list[Any]]] = {v: {} for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for variant in variants:
                for scenario in scenarios:
                    got = measure(variant, scenario, args, Path(tmp))
                    raw[variant][scenario] += [g["triples_per_s"] for g in got]
                    if "threads" in got[0]:
                        threads_seen[variant].setdefault(scenario, []).append(got[0]["threads"])
                    print(
                        f"round {r + 1} {variant:>10} {scenario:>5}: "
                        + ", ".join(f"{g['triples_per_s']:,.0f}" for g in got),
                        file=sys.stderr,
                    )
    med = {v: {s: statistics.median(x) for s, x in per.items()} for v, per in raw.items()}
    single = med["threads-1"]["alone"]
    best_alone = max(med[u]["alone"] for u in variants if u != "before")  # this checkout's
    ratios = {}
    for v in variants:
        ratios[v] = {
            "busy_over_single_thread_alone": med[v]["busy"] / single,
            "busy_over_best_alone": med[v]["busy"] / best_alone,
            "pair_over_alone": med[v]["pair"] / med[v]["alone"],
        }
    goals = {
        "busy_over_single_thread_alone": 0.90,
        "busy_over_best_alone": 0.45,
        "pair_over_alone": 0.40,
    }
    result = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "workload": f"FB15k-237 TransE d=200, batch 1024, {args.steps} steps/epoch, "
        f"{args.epochs} epochs, median epoch after 2 warm-up epochs",
        "rounds": args.rounds,
        "triples_per_s": raw,
        "median": med,
        "ratios": ratios,
        "goals": goals,
        "met": {v: {k: ratios[v][k] >= g for k, g in goals.items()} for v in variants},
        "threads_seen": threads_seen,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    report(result, args.json)


if __name__ == "__main__":
    main()
