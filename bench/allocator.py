"""Training and evaluation speed with ``training.allocator`` retain against the C library's default.

    .venv/bin/python bench/allocator.py configs/wn18rr-distmult.yaml configs/fb15k237-complex.yaml \\
        configs/wn18rr-rotate.yaml configs/fb15k237-transe.yaml --set data.root=../shared/datasets \\
        --steps 10 --rounds 2 --json bench/results/allocator.json

Every measurement is a fresh process (the allocator setting is process-wide): it loads the data
set, builds the model and trainer on the first ``--steps`` batches of the training triples, sets
the allocator (``retain``: :func:`kgpipe.process.retain_freed_memory`; ``system``: nothing),
runs one warm-up pass, then times one more pass and a filtered evaluation of ``--eval`` valid
triples. Rounds alternate the order of the two variants. Reported per config: median training
triples/s and evaluation triples/s per variant, the retain/system ratios, and the peak resident
memory of each process (``ru_maxrss``), the cost of keeping freed pages.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("system", "retain")


def measure(args: argparse.Namespace) -> None:
    """One timed pass in this process."""
    sys.path[:0] = [str(REPO), str(REPO / "bench")]
    from common import timed_training

    from kgpipe.config import load_config
    from kgpipe.evaluation import FilterIndex, evaluate
    from kgpipe.process import retain_freed_memory

    if args.variant == "retain" and not retain_freed_memory():
        raise SystemExit("retain_freed_memory() is not available on this platform")
    cfg = load_config(args.configs[0], args.set)
    ds, model, stats = timed_training(cfg, args.steps)
    index = FilterIndex.from_triples([ds.train, ds.valid, ds.test], ds.num_relations)
    valid = ds.valid[: args.eval]
    evaluate(model, valid[:64], index, batch_size=cfg.evaluation.batch_size)  # warm-up
    t0 = time.perf_counter()
    evaluate(model, valid, index, batch_size=cfg.evaluation.batch_size)
    eval_s = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"train_triples_per_s": stats.triples_per_s,
                      "eval_triples_per_s": valid.shape[0] / eval_s, "max_rss_mib": rss_mib}))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("configs", nargs="+")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eval", type=int, default=1000, help="valid triples to rank (both sides)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="system", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.measure:
        measure(a)
        return
    sys.path.insert(0, str(REPO / "bench"))
    from common import commit, hardware

    results: dict[str, Any] = {}
    for config in a.configs:
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for k in range(a.rounds):
            for variant in VARIANTS if k % 2 == 0 else VARIANTS[::-1]:
                cmd = [sys.executable, __file__, config, "--measure", "--variant", variant,
                       "--steps", str(a.steps), "--eval", str(a.eval)]  # fmt: skip
                for s in a.set:
                    cmd += ["--set", s]
                proc = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[variant].append(row)
                print(f"{config} round {k + 1} {variant}: train {row['train_triples_per_s']:,.0f}"
                      f" triples/s, eval {row['eval_triples_per_s']:,.0f} triples/s,"
                      f" max RSS {row['max_rss_mib']:,.0f} MiB", flush=True)  # fmt: skip
        med = {
            v: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            for v, rows in runs.items()
        }
        results[config] = {
            "runs": runs,
            "median": med,
            "ratios": {
                "train retain/system": med["retain"]["train_triples_per_s"]
                / med["system"]["train_triples_per_s"],
                "eval retain/system": med["retain"]["eval_triples_per_s"]
                / med["system"]["eval_triples_per_s"],
                "max_rss retain/system": med["retain"]["max_rss_mib"]
                / med["system"]["max_rss_mib"],
            },
        }
        print(json.dumps({config: results[config]["ratios"]}), flush=True)
    out = {
        "steps": a.steps,
        "eval": a.eval,
        "rounds": a.rounds,
        "overrides": a.set,
        "results": results,
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(["bench/allocator.py", *sys.argv[1:]]),
    }
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
