"""How close a trained TransE (p=2) puts candidates to its queries, and what the training steps'
matrix-product distances lose there.

A training step scores a query ``q = h + r`` against many candidates as ``|q|² + |c|² - 2 q·c``
(:func:`kgpipe.models.distances.sqdist_mm` with a gradient: no direct recomputation of near
pairs), which cancels in float32 where ``c`` is close to ``q`` next to their norms. This trains
TransE on a small graph, then compares, for every training query against every entity, the
product's distance (float32, the training path) with the exact one (float64): how many pairs
fall under the near bound (:data:`~kgpipe.models.distances.NEAR`), the nearest distance, the
largest relative error of a distance and of the gradient factor ``1 / (2 d)`` of the ``sqrt``.

    .venv/bin/python bench/transe_near_pairs.py --dataset umls --epochs 100

Results: bench/results/transe_near_pairs_<dataset>.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import commit, hardware, write_result

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="umls")
    parser.add_argument("--data-root", default="../shared/datasets")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--queries", type=int, default=20_000, help="training queries compared")
    args = parser.parse_args()

    from kgpipe.config import parse_config
    from kgpipe.data.dataset import load_dataset
    from kgpipe.models.distances import NEAR, sqdist_mm
    from kgpipe.pipeline import train
    from kgpipe.runs.read import load_run

    with tempfile.TemporaryDirectory(prefix="kgpipe-near-") as root:
        data = {
            "run": {"root": root, "name": "transe", "seed": 0},
            "data": {"dataset": args.dataset, "root": args.data_root},
            "model": {"name": "transe", "dim": args.dim, "p": 2},
            "training": {"epochs": args.epochs, "mode": "negative_sampling",
                         "loss": "cross_entropy", "negatives": 64, "lr": 0.01,
                         "optimizer": "adam", "batch_size": 256},
        }  # fmt: skip
        config = parse_config(data)
        train(config)
        model = load_run(f"{root}/transe").model
        entity = model.entity.detach().float()
        relation = model.relation.detach().float()
    h, r, t = load_dataset(config.data).train[: args.queries].T
    q = entity[h] + relation[r]
    with torch.enable_grad():  # the training path: a gradient is taken, no recomputation
        product = sqdist_mm(q.clone().requires_grad_(True), entity).detach().double()
    exact2 = torch.cdist(q.double(), entity.double()) ** 2
    exact, approx = exact2.sqrt(), product.sqrt()
    relative = (approx - exact).abs() / exact.clamp_min(1e-12)
    bound = NEAR * ((q.double() ** 2).sum(1, keepdim=True) + (entity.double() ** 2).sum(1)[None])
    result = {
        "hardware": hardware(),
        "commit": commit(),
        "command": "bench/transe_near_pairs.py " + " ".join(sys.argv[1:]),
        "dataset": args.dataset,
        "epochs": args.epochs,
        "queries": int(q.shape[0]),
        "pairs": int(exact.numel()),
        "mean_query_norm": float(q.norm(dim=1).mean()),
        "mean_entity_norm": float(entity.norm(dim=1).mean()),
        "median_positive_distance": float((entity[t] - q).norm(dim=1).median()),
        "pairs_under_near_bound": int((exact2 < bound).sum()),
        "nearest_distance": float(exact.min()),
        "max_relative_distance_error": float(relative.max()),
        "max_gradient_factor_ratio": float((exact / approx.clamp_min(1e-12)).max()),
    }
    write_result(result, RESULTS / f"transe_near_pairs_{args.dataset}.json")


if __name__ == "__main__":
    main()
