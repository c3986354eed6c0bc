"""Full filtered evaluation speed on FB15k-237 test: wall time and peak memory per model.

    .venv/bin/python bench/eval_speed.py --json bench/results/eval_speed.json

For each model (default: distmult, complex, transe with L2, transe with L1, rotate; all dim 200)
a fresh subprocess builds a randomly initialised model and ranks all 20,466 test triples on both
sides against all 14,541 entities, filtered with train+valid+test, ties at the mean rank -- the
same code path as ``kgpipe evaluate``. Speed does not depend on the parameter values. Each child
reports the evaluation's wall time and its peak RSS (``ru_maxrss``) before and after, so the
memory the evaluation itself adds is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def child(
    spec: str, data_root: str, batch_size: int, threads: int, device: str = "cpu"
) -> dict[str, Any]:
    import torch

    from kgpipe.config import DataConfig, ModelConfig
    from kgpipe.data.dataset import load_dataset
    from kgpipe.devices import resolve_device
    from kgpipe.evaluation import FilterIndex, evaluate
    from kgpipe.models.model import KGEModel

    torch.set_num_threads(threads)
    name, _, p = spec.partition("-l")
    ds = load_dataset(DataConfig(dataset="fb15k-237", root=data_root))
    index = FilterIndex.from_triples([ds.train, ds.valid, ds.test], ds.num_relations)
    model = KGEModel.build(
        ModelConfig(name=name, dim=200, p=int(p or 2), init="uniform", init_scale=0.1),
        num_entities=ds.num_entities,
        num_relations=ds.num_relations,
        seed=0,
    ).to(resolve_device(device))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    m = evaluate(model, ds.test, index, batch_size=batch_size)
    if model.entity.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {
        "model": spec,
        "device": str(model.entity.device),
        "dim": 200,
        "batch_size": batch_size,
        "threads": threads,
        "triples": m["triples"],
        "queries": 2 * m["triples"],
        "entities": ds.num_entities,
        "seconds": seconds,
        "peak_rss_mb_before": rss_before,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "mrr_random_model": m["mrr"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-root", default=str(REPO.parent / "shared" / "datasets"))
    p.add_argument("--models", default="distmult,complex,transe-l2,transe-l1,rotate")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (training.device)")
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        row = child(args.child, args.data_root, args.batch_size, args.threads, args.device)
        print(json.dumps(row))
        return
    rows = []
    for spec in args.models.split(","):
        out = subprocess.run(
            [sys.executable, __file__, "--child", spec, "--data-root", args.data_root,
             "--batch-size", str(args.batch_size), "--threads", str(args.threads),
             "--device", args.device],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{spec:10s} {row['seconds']:7.2f} s  peak RSS {row['peak_rss_mb']:.0f} MB "
            f"(before evaluation {row['peak_rss_mb_before']:.0f} MB)",
            file=sys.stderr,
        )
        rows.append(row)
    text = json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "results": rows}, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
