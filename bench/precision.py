"""Mixed precision: training speed of ``training.precision`` fp32 against bf16, same run.

    .venv/bin/python bench/precision.py configs/fb15k237-complex.yaml --steps 20 --rounds 3 \\
        --json bench/results/precision_fb15k237_complex.json

The config's model and training settings are used as they are (only the precision changes).
Each round times ``--steps`` training steps of each precision on the same subset of the
training triples, alternating which goes first; both trainers are warmed up by one such pass.
Reported: training triples per second per precision (median over rounds) and the ratio
bf16/fp32. Whether bf16 trains as well is a separate question, answered by quality runs
(``bench/quality.py ... --set training.precision=bf16``), not here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from common import commit, hardware  # bench/common.py (this script's folder is on sys.path)

from kgpipe.config import load_config
from kgpipe.data import load_dataset
from kgpipe.models import KGEModel
from kgpipe.training import Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    cfg = load_config(a.config, a.set)
    ds = load_dataset(cfg.data)
    subset = ds.train[: cfg.training.batch_size * a.steps]
    trainers: dict[str, Trainer] = {}
    for precision in ("fp32", "bf16"):
        model = KGEModel.build(
            cfg.model, num_entities=ds.num_entities, num_relations=ds.num_relations, seed=0
        )
        training = cfg.training.model_copy(update={"precision": precision})
        trainers[precision] = Trainer(
            model, subset, training=training, regularizer=cfg.model.regularizer, seed=0
        )
        trainers[precision].train_epoch()  # warm-up
    speed: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for k in range(a.rounds):
        order = ("fp32", "bf16") if k % 2 == 0 else ("bf16", "fp32")
        for precision in order:
            stats = trainers[precision].train_epoch()
            speed[precision].append(stats.triples_per_s)
            print(f"round {k + 1} {precision}: {stats.triples_per_s:,.0f} triples/s", flush=True)
    med = {k: statistics.median(v) for k, v in speed.items()}
    result: dict[str, Any] = {
        "config": a.config,
        "overrides": a.set,
        "model": cfg.model.name,
        "dim": cfg.model.dim,
        "mode": cfg.training.mode,
        "batch_size": cfg.training.batch_size,
        "steps": a.steps,
        "rounds": a.rounds,
        "triples_per_s": speed,
        "median_triples_per_s": med,
        "bf16_over_fp32": med["bf16"] / med["fp32"],
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(["bench/precision.py", *sys.argv[1:]]),
    }
    print(f"bf16/fp32 = {result['bf16_over_fp32']:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
