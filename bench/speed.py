"""Training speed of kgpipe against PyKEEN, side by side in one run, plus achieved GFLOP/s.

    .venv/bin/python bench/speed.py --data ../shared/datasets/fb15k-237 --json bench/results/speed.json

What is measured, in this order, on the same machine and the same threads:

1. The float32 matrix-product peak of the device training runs on (``--device``): a 2048x2048 @
   2048x2048 product repeated for 3 s (the best of three such runs).
2. kgpipe: positive training triples per second of the negative-sampling loop (shared negatives,
   ``--chunk-size`` positives per negative set, row-wise Adam) on FB15k-237, ``--steps`` steps of
   ``--batch-size`` after one warm-up pass over the same steps. Achieved GFLOP/s counts the
   matrix products that score positives against their negatives (forward ``2·B·N·d`` plus two
   products of the same size in the backward pass); everything else the step does is overhead.
3. PyKEEN (``bench/pykeen_speed.py`` in ``.venv-bench``, made by ``bench/setup_pykeen_venv.sh``):
   its sLCWA loop with the same model, dimension, batch, negatives per positive, loss and Adam.

The ratio kgpipe/PyKEEN is printed and written with both raw measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import hardware  # bench/common.py (this script's folder is on sys.path)

from kgpipe.config import DataConfig, ModelConfig, RegularizerConfig, TrainingConfig
from kgpipe.data.dataset import load_dataset
from kgpipe.devices import resolve_device
from kgpipe.models.model import KGEModel
from kgpipe.process import configure
from kgpipe.training.loop import Trainer

REPO = Path(__file__).resolve().parents[1]


def matmul_peak(device: torch.device, seconds: float = 3.0, n: int = 2048) -> float:
    """Best-of-three float32 GEMM throughput in GFLOP/s on ``device`` (the one training runs on:
    a GPU's achieved rate is compared with the GPU's peak, not the CPU's)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b
    sync()
    best = 0.0
    for _ in range(3):
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 3:
            for _ in range(8 if device.type == "cuda" else 1):
                a @ b
                k += 1
            sync()
        best = max(best, 2 * n**3 * k / (time.perf_counter() - t0) / 1e9)
    return best


def kgpipe_speed(args: argparse.Namespace) -> dict[str, Any]:
    ds = load_dataset(DataConfig(dataset="fb15k-237", root=str(Path(args.data).parent)))
    margin = 0.0 if args.model in ("transe", "distmult", "complex") else 9.0
    model = KGEModel.build(
        ModelConfig(name=args.model, dim=args.dim, p=args.p, margin=margin),
        num_entities=ds.num_entities,
        num_relations=ds.num_relations,
        seed=0,
    ).to(resolve_device(args.device))
    cfg = TrainingConfig(
        batch_size=args.batch_size,
        negatives=args.negatives,
        chunk_size=args.chunk_size,
        loss=args.loss,
        optimizer="adam",
        lr=1e-3,
        epochs=1,
    )
    subset = ds.train[: args.batch_size * args.steps]
    trainer = Trainer(model, subset, training=cfg, regularizer=RegularizerConfig(), seed=0)
    trainer.train_epoch()  # warm-up
    best = None
    for _ in range(args.repeats):
        stats = trainer.train_epoch()
        if best is None or stats.seconds < best.seconds:
            best = stats
    assert best is not None
    b, n, d = args.batch_size, args.negatives, args.dim
    # forward scores of B x N pairs, and two products of the same size in the backward pass
    flops_per_step = 3 * b * n * d * model.interaction.flops_per_pair_dim
    gflops = flops_per_step * best.steps / best.seconds / 1e9
    return {
        "library": "kgpipe",
        "device": str(model.entity.device),
        "model": args.model,
        "dim": d,
        "p": args.p,
        "batch_size": b,
        "negatives": n,
        "chunk_size": args.chunk_size,
        "loss": args.loss,
        "optimizer": "adam (row-wise)",
        "steps": best.steps,
        "seconds": best.seconds,
        "triples_per_s": best.triples_per_s,
        "ms_per_step": 1000 * best.seconds / best.steps,
        "matmul_gflop_per_step": flops_per_step / 1e9,
        "achieved_gflops": gflops,
    }


def pykeen_speed(args: argparse.Namespace) -> dict[str, Any] | None:
    python = REPO / ".venv-bench" / "bin" / "python"
    if not python.exists():
        print("PyKEEN venv missing: run bench/setup_pykeen_venv.sh", file=sys.stderr)
        return None
    out = REPO / "bench" / "results" / f".pykeen-{args.model}.json"
    cmd = [
        str(python), str(REPO / "bench" / "pykeen_speed.py"),
        "--data", args.data, "--model", args.model, "--dim", str(args.dim),
        "--batch-size", str(args.batch_size), "--negatives", str(args.negatives),
        "--loss", args.loss, "--p", str(args.p), "--seconds", str(args.pykeen_seconds),
        "--threads", str(torch.get_num_threads()), "--json", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    out.unlink()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=str(REPO.parent / "shared" / "datasets" / "fb15k-237"))
    p.add_argument("--model", default="transe")
    p.add_argument("--dim", type=int, default=200)
    p.add_argument("--p", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--negatives", type=int, default=256)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--loss", default="margin")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--pykeen-seconds", type=float, default=60.0)
    p.add_argument("--no-pykeen", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (training.device)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    # a run's kernels (deterministic), these threads, the C library's allocator
    configure(threads=args.threads, allocator="system", deterministic=True)

    device = resolve_device(args.device)
    peak = matmul_peak(device)
    print(f"float32 matmul peak on {device}: {peak:.1f} GFLOP/s", file=sys.stderr)
    ours = kgpipe_speed(args)
    ours["fraction_of_peak"] = ours["achieved_gflops"] / peak
    print(
        f"kgpipe {args.model}: {ours['triples_per_s']:,.0f} triples/s, "
        f"{ours['achieved_gflops']:.1f} GFLOP/s ({100 * ours['fraction_of_peak']:.0f}% of peak)",
        file=sys.stderr,
    )
    theirs = None if args.no_pykeen else pykeen_speed(args)
    result: dict[str, Any] = {
        "hardware": hardware(),
        "matmul_peak_gflops": peak,
        "matmul_peak_device": str(device),
        "kgpipe": ours,
        "pykeen": theirs,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if theirs:
        result["speedup"] = ours["triples_per_s"] / theirs["triples_per_s"]
        print(
            f"pykeen {args.model}: {theirs['triples_per_s']:,.0f} triples/s -> "
            f"kgpipe is {result['speedup']:.0f}x",
            file=sys.stderr,
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
