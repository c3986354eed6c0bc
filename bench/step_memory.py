"""The memory one 1vsAll/KvsAll training step adds, measured, against the pre-flight's estimate.

    .venv/bin/python bench/step_memory.py

Per case (mode, loss, model, reciprocal, batch) a fresh process builds a model of
``--entities`` random rows (d=16), trains one epoch of one step on ``batch`` random triples
(Adam, one thread) and reports the growth of its peak resident set (``VmHWM``) over the step,
next to the step part of :func:`kgpipe.launch.memory.rank_memory` (plus the Adam state, which
the estimate counts apart). Results: ``bench/results/step_memory_<entities>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, write_result

RESULTS = Path(__file__).resolve().parent / "results"

CASES = [
    ("1vsall", "cross_entropy", "distmult", False, 256),
    ("1vsall", "bce", "distmult", False, 256),
    ("kvsall", "bce", "distmult", False, 512),
    ("kvsall", "cross_entropy", "distmult", False, 512),
    ("1vsall", "cross_entropy", "distmult", True, 256),
    ("1vsall", "cross_entropy", "transe", False, 256),
    ("kvsall", "bce", "transe", False, 512),
    ("1vsall", "bce", "complex", True, 256),
]


def child(case: list[str], entities: int) -> dict[str, Any]:
    import torch

    from kgpipe.config import ModelConfig, RegularizerConfig, TrainingConfig, parse_config
    from kgpipe.launch.memory import rank_memory
    from kgpipe.models.model import KGEModel
    from kgpipe.training.loop import Trainer

    def hwm() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
        return 0

    torch.set_num_threads(1)
    mode, loss, name, reciprocal, b = case[0], case[1], case[2], case[3] == "True", int(case[4])
    g = torch.Generator().manual_seed(0)
    triples = torch.stack(
        [torch.randint(0, n, (b,), generator=g) for n in (entities, 10, entities)], 1
    )
    model_cfg = ModelConfig(name=name, dim=16, reciprocal=reciprocal)
    model = KGEModel.build(model_cfg, num_entities=entities, num_relations=10, seed=0)
    training = TrainingConfig(mode=mode, loss=loss, batch_size=b, epochs=1, optimizer="adam")
    trainer = Trainer(model, triples, training=training, regularizer=RegularizerConfig(), seed=0)
    before = hwm()
    trainer.fit()
    config = parse_config({"data": {"dataset": "umls"}, "model": model_cfg.model_dump(),
                           "training": training.model_dump()})  # fmt: skip
    est = rank_memory(config, num_entities=entities, num_relations=10, num_train=b, world=1)
    adam = 2 * 4 * entities * 16  # the entity table's Adam state, allocated in the step
    return {"case": case, "measured_mib": (hwm() - before) / 2**20,
            "estimate_mib": (est.step + adam) / 2**20}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entities", type=int, default=100_000)
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.entities)))
        return
    rows = []
    for case in CASES:
        out = subprocess.run(
            [sys.executable, __file__, "--entities", str(args.entities), "--child",
             *map(str, case)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["ratio"] = row["estimate_mib"] / row["measured_mib"]
        print(f"{' '.join(row['case']):42s} measured {row['measured_mib']:7.0f} MiB  "
              f"estimate {row['estimate_mib']:7.0f} MiB  ({row['ratio']:.2f}x)")  # fmt: skip
        rows.append(row)
    result = {"hardware": hardware(), "commit": commit(), "command": " ".join(sys.argv),
              "entities": args.entities, "runs": rows}  # fmt: skip
    write_result(result, RESULTS / f"step_memory_{args.entities}.json")


if __name__ == "__main__":
    main()
