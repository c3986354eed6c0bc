"""Training step speed of a config: fp32 and bf16 score products, against an older checkout.

    git worktree add /tmp/kgpipe-base 123c66c   # the code before the fused loss and bf16
    .venv/bin/python bench/precision.py configs/fb15k237-complex.yaml --steps 20 --rounds 3 \\
        --baseline /tmp/kgpipe-base --json bench/results/precision_fb15k237_complex.json

The config's model and training settings are used as they are; only ``training.precision``
changes. Every measurement is a fresh process that loads the data set, builds the model and
trainer on the first ``--steps`` batches of the training triples, runs them once to warm up and
then times one more pass. Rounds rotate the order of the variants:

* ``fp32`` and ``bf16``: this checkout;
* ``baseline`` (with ``--baseline DIR``): the same loop with the ``kgpipe`` package of another
  checkout (``DIR`` first on ``sys.path``), in fp32 -- the "before" of a change.

``--variants fp32`` times this checkout in fp32 only (models without bf16 scoring, e.g. RotatE,
against ``--baseline``).

Reported: training triples per second per variant (median over rounds) and the ratios. Whether
bf16 trains as well is a separate question, answered by quality runs (``bench/quality.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def measure(args: argparse.Namespace) -> None:
    """One timed pass in this process (the package of ``--src`` first on the path)."""
    sys.path.insert(0, args.src)
    sys.path.insert(1, str(REPO / "bench"))
    from common import timed_training

    from kgpipe.config import load_config

    overrides = list(args.set)
    config = args.config
    if args.precision != "default":
        overrides.append(f"training.precision={args.precision}")
    else:  # an older checkout may not know training.precision: leave it out (fp32)
        import tempfile

        import yaml

        data = yaml.safe_load(Path(args.config).read_text())
        data.get("training", {}).pop("precision", None)
        fd, config = tempfile.mkstemp(suffix=".yaml")
        os.close(fd)
        Path(config).write_text(yaml.safe_dump(data))
    try:
        cfg = load_config(config, overrides)
    finally:
        if config != args.config:
            os.unlink(config)
    _, _, stats = timed_training(cfg, args.steps)
    print(json.dumps({"triples_per_s": stats.triples_per_s, "seconds": stats.seconds}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", help="another checkout's root: its kgpipe, in fp32")
    p.add_argument(
        "--variants", default="fp32,bf16", help="this checkout's precisions to time (fp32,bf16)"
    )
    p.add_argument("--json")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--src", default=str(REPO), help=argparse.SUPPRESS)
    p.add_argument("--precision", default="default", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.measure:
        measure(a)
        return
    sys.path.insert(0, str(REPO / "bench"))
    from common import commit, hardware

    variants = {v: (str(REPO), v) for v in a.variants.split(",")}
    if a.baseline:
        variants["baseline"] = (str(Path(a.baseline).resolve()), "default")
    speed: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for k in range(a.rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            src, precision = variants[name]
            cmd = [sys.executable, __file__, a.config, "--measure", "--src", src,
                   "--precision", precision, "--steps", str(a.steps)]  # fmt: skip
            for s in a.set:
                cmd += ["--set", s]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
            tps = json.loads(out.stdout.strip().splitlines()[-1])["triples_per_s"]
            speed[name].append(tps)
            print(f"round {k + 1} {name}: {tps:,.0f} triples/s", flush=True)
    med = {k: statistics.median(v) for k, v in speed.items()}
    ratios = {"bf16/fp32": med["bf16"] / med["fp32"]} if {"bf16", "fp32"} <= set(med) else {}
    for name in ("fp32", "bf16"):
        if name in med and "baseline" in med:
            ratios[f"{name}/baseline"] = med[name] / med["baseline"]
    result: dict[str, Any] = {
        "config": a.config,
        "overrides": a.set,
        "steps": a.steps,
        "rounds": a.rounds,
        "baseline": a.baseline,
        "triples_per_s": speed,
        "median_triples_per_s": med,
        "ratios": ratios,
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(["bench/precision.py", *sys.argv[1:]]),
    }
    print(json.dumps(ratios))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
