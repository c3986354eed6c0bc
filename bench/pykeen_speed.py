"""PyKEEN side of the kgpipe speed benchmark (run it inside ``.venv-bench``).

What is measured
----------------
* **Training throughput** of PyKEEN's sLCWA training loop (``SLCWATrainingLoop``, basic negative
  sampler, Adam lr 1e-3) on FB15k-237, reported as *positive* training triples per second. Every
  positive triple is scored together with ``--negatives`` corrupted triples, so this is the number
  that kgpipe's own training throughput is compared against at equal settings.

  A full FB15k-237 epoch takes minutes at these settings (~800 positives/s on 2 cores for TransE,
  d=200, batch 1024, 256 negatives), so the run is bounded: a first, short run on a 5-batch
  subset estimates the rate (and warms everything up), then one epoch is trained on a random
  subset of the training triples sized to take about ``--seconds`` seconds (whole batches only).

  Timing is taken by a training callback at the start of every batch (``pre_batch``). One
  interval between two consecutive ``pre_batch`` calls is a full training step: forward, backward,
  optimizer step, PyKEEN's post-update constraints (e.g. TransE's entity normalisation) and the
  loading plus negative sampling of the next batch. The first batch of the epoch is excluded
  (one-off allocations), and so are set-up costs outside the batch loop (model reset, optimizer
  creation, data-loader construction). ``train_call_seconds`` reports the whole ``train()`` call
  for comparison.

* With ``--eval``: the wall time of PyKEEN's ``RankBasedEvaluator`` (filtered with
  train+valid+test, head and tail prediction) on the full test set with the briefly trained model,
  the MRR it reports (only a sanity check, the model is barely trained), and the process's peak RSS
  (``ru_maxrss``, a lifetime maximum: ``peak_rss_mb_before_eval`` tells what training alone used).
  PyKEEN drops valid/test triples whose entities never occur in train (28 of FB15k-237's 20466
  test triples), so it ranks slightly fewer triples than the file holds; ``eval_note`` says how many.

For ComplEx and RotatE PyKEEN's ``embedding_dim`` counts *complex* components, so ``dim // 2`` is
passed to compare at equal real parameter count; ``pykeen_embedding_dim`` records the value used.
Models keep PyKEEN's default regularisers and constrainers (recorded in ``model_defaults``).

Progress goes to stderr; the final JSON object goes to stdout (and to ``--json`` if given).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pykeen
import torch
from pykeen.evaluation import RankBasedEvaluator
from pykeen.losses import BCEWithLogitsLoss, Loss, MarginRankingLoss, NSSALoss, SoftplusLoss
from pykeen.models import ComplEx, DistMult, ERModel, RotatE, TransE
from pykeen.training import SLCWATrainingLoop
from pykeen.training.callbacks import TrainingCallback
from pykeen.triples import TriplesFactory

MODELS: dict[str, type[ERModel]] = {
    "transe": TransE,
    "distmult": DistMult,
    "complex": ComplEx,
    "rotate": RotatE,
}
COMPLEX_MODELS = frozenset({"complex", "rotate"})
LOSSES = ("margin", "softplus", "bce", "nssa")
ESTIMATE_BATCHES = 5
MIN_BATCHES = 3  # first batch is warm-up, the last pre_batch closes the window


def log(message: str) -> None:
    """Progress line on stderr."""
    print(f"[pykeen_speed {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BatchTimer(TrainingCallback):
    """Record a timestamp and the positive batch size at the start of every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[float] = []
        self.sizes: list[int] = []

    def pre_batch(self, **kwargs: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_batch(self, epoch: int, batch: Any, batch_loss: float, **kwargs: Any) -> None:
        # called once per (sub-)batch; without sub-batching exactly once per batch
        if len(self.sizes) < len(self.starts):
            self.sizes.append(int(batch["positives"].shape[0]))

    def measured(self) -> tuple[int, float]:
        """Positives and seconds of the full steps between the second and the last ``pre_batch``.

        The window holds batches 2..N-1 (forward, backward, step, constraints, next batch's
        loading and negative sampling); batch 1 is warm-up, batch N has no closing timestamp.
        """
        if len(self.starts) < MIN_BATCHES:
            raise RuntimeError(
                f"need at least {MIN_BATCHES} batches to time, got {len(self.starts)}"
            )
        return sum(self.sizes[1:-1]), self.starts[-1] - self.starts[1]

    def step_seconds(self) -> dict[str, float]:
        """Min/median/max of the timed step intervals (spread shows interference)."""
        steps = np.diff(np.asarray(self.starts[1:]))
        return {
            "min": round(float(steps.min()), 4),
            "median": round(float(np.median(steps)), 4),
            "max": round(float(steps.max()), 4),
        }


def read_labeled(path: Path) -> np.ndarray:
    """Tab-separated ``head<TAB>relation<TAB>tail`` lines (LF or CRLF) as an (n, 3) str array."""
    rows: list[list[str]] = []
    with path.open(encoding="utf-8", newline="") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise ValueError(
                    f"{path}:{number}: expected 3 tab-separated fields, got {len(parts)}"
                )
            rows.append(parts)
    return np.asarray(rows, dtype=str)


def load_dataset(
    folder: Path,
) -> tuple[TriplesFactory, TriplesFactory, TriplesFactory, dict[str, int]]:
    """Train/valid/test factories; valid and test reuse the train factory's ids."""
    labeled = {split: read_labeled(folder / f"{split}.txt") for split in ("train", "valid", "test")}
    train = TriplesFactory.from_labeled_triples(labeled["train"])
    kwargs: dict[str, Any] = dict(
        entity_to_id=train.entity_to_id, relation_to_id=train.relation_to_id, compact_id=False
    )
    valid = TriplesFactory.from_labeled_triples(labeled["valid"], **kwargs)
    test = TriplesFactory.from_labeled_triples(labeled["test"], **kwargs)
    counts = {f"{split}_lines": int(array.shape[0]) for split, array in labeled.items()}
    counts.update(
        train_triples=train.num_triples,
        valid_triples=valid.num_triples,
        test_triples=test.num_triples,
    )
    return train, valid, test, counts


def make_loss(name: str) -> Loss:
    """Loss by benchmark name."""
    if name == "margin":
        return MarginRankingLoss(margin=1.0)
    if name == "softplus":
        return SoftplusLoss()
    if name == "bce":
        return BCEWithLogitsLoss()
    if name == "nssa":
        return NSSALoss()
    raise ValueError(f"unknown loss {name!r}")


def make_model(
    name: str, dim: int, p: int, train: TriplesFactory, loss: Loss, seed: int
) -> tuple[ERModel, int]:
    """Model and the ``embedding_dim`` handed to PyKEEN."""
    kwargs: dict[str, Any] = dict(triples_factory=train, loss=loss, random_seed=seed)
    if name in COMPLEX_MODELS:
        if dim % 2:
            raise ValueError(f"--dim must be even for {name} (real parameter count), got {dim}")
        embedding_dim = dim // 2
    else:
        embedding_dim = dim
    kwargs["embedding_dim"] = embedding_dim
    if name == "transe":
        kwargs["scoring_fct_norm"] = p
    return MODELS[name](**kwargs), embedding_dim


def describe_model(model: ERModel) -> dict[str, Any]:
    """PyKEEN defaults that affect cost: regularisers, constrainers, parameter count."""

    def rep(representation: Any) -> dict[str, Any]:
        regularizer = getattr(representation, "regularizer", None)
        constrainer = getattr(representation, "constrainer", None)
        return {
            "shape": list(representation.shape),
            "complex": bool(getattr(representation, "is_complex", False)),
            "regularizer": None if regularizer is None else type(regularizer).__name__,
            "constrainer": None
            if constrainer is None
            else getattr(constrainer, "__name__", str(constrainer)),
        }

    return {
        "entity": rep(model.entity_representations[0]),
        "relation": rep(model.relation_representations[0]),
        "num_parameters": int(model.num_parameters),
        "num_real_parameters": int(
            sum(t.numel() * (2 if t.is_complex() else 1) for t in model.parameters())
        ),
    }


def run_epoch(
    model: ERModel,
    train: TriplesFactory,
    triples: torch.Tensor,
    batch_size: int,
    negatives: int,
) -> tuple[BatchTimer, float]:
    """Train one epoch on ``triples``; the timer and the wall time of the whole ``train()`` call."""
    factory = train.clone_and_exchange_triples(mapped_triples=triples)
    optimizer = torch.optim.Adam(params=model.get_grad_params(), lr=1e-3)
    loop = SLCWATrainingLoop(
        model=model,
        triples_factory=factory,
        optimizer=optimizer,
        negative_sampler="basic",
        negative_sampler_kwargs={"num_negs_per_pos": negatives},
        automatic_memory_optimization=False,
    )
    timer = BatchTimer()
    start = time.perf_counter()
    loop.train(
        triples_factory=factory,
        num_epochs=1,
        batch_size=batch_size,
        use_tqdm=False,
        callbacks=[timer],
    )
    return timer, time.perf_counter() - start


def hardware() -> dict[str, Any]:
    """CPU model, core counts, memory, platform."""
    model_name = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_total_mb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total_mb = round(int(line.split()[1]) / 1024)
                break
    except OSError:
        pass
    return {
        "cpu_model": model_name,
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "mem_total_mb": mem_total_mb,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def peak_rss_mb() -> float:
    """Lifetime peak RSS of this process (Linux reports ``ru_maxrss`` in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with train/valid/test.txt")
    parser.add_argument("--model", choices=sorted(MODELS), default="transe")
    parser.add_argument("--dim", type=int, default=200, help="real parameters per embedding")
    parser.add_argument("--batch-size", type=int, default=1024, help="positive triples per batch")
    parser.add_argument("--negatives", type=int, default=256, help="negatives per positive")
    parser.add_argument("--loss", choices=LOSSES, default="margin")
    parser.add_argument("--p", type=int, default=2, help="TransE norm")
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="target length of the timed epoch"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval", action="store_true", help="also time filtered test evaluation")
    parser.add_argument(
        "--eval-batch-size",
        type=int,
        default=128,
        help="evaluation batch size. PyKEEN's own CPU choice (32) was 2x slower here; 128 and 256 "
        "ran equally fast, but TransE materialises batch x entities x dim floats (peak RSS "
        "~2.1 GB at 128, ~4.0 GB at 256)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    load_at_start = os.getloadavg()

    t0 = time.perf_counter()
    train, valid, test, counts = load_dataset(args.data)
    load_seconds = time.perf_counter() - t0
    log(
        f"loaded {counts} in {load_seconds:.1f}s: {train.num_entities} entities, {train.num_relations} relations"
    )

    loss = make_loss(args.loss)
    model, embedding_dim = make_model(args.model, args.dim, args.p, train, loss, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(train.num_triples, generator=generator)
    all_triples = train.mapped_triples

    # 1) estimate the rate on a few batches (also warms up allocator, threads, kernels)
    n_est = min(ESTIMATE_BATCHES * args.batch_size, train.num_triples)
    timer, est_call = run_epoch(
        model, train, all_triples[order[:n_est]], args.batch_size, args.negatives
    )
    est_triples, est_seconds = timer.measured()
    rate_est = est_triples / est_seconds
    log(
        f"estimate: {est_triples} positives in {est_seconds:.2f}s -> {rate_est:.0f}/s (call {est_call:.1f}s)"
    )

    # 2) one epoch on a random subset sized to last about --seconds (whole batches)
    max_batches = train.num_triples // args.batch_size
    n_batches = max(MIN_BATCHES, min(max_batches, round(rate_est * args.seconds / args.batch_size)))
    n_subset = min(n_batches * args.batch_size, train.num_triples)
    log(f"timed epoch: {n_batches} batches = {n_subset} positives (~{n_subset / rate_est:.0f}s)")
    timer, train_call_seconds = run_epoch(
        model, train, all_triples[order[:n_subset]], args.batch_size, args.negatives
    )
    measured_triples, measured_seconds = timer.measured()
    rate = measured_triples / measured_seconds
    log(f"measured: {measured_triples} positives in {measured_seconds:.2f}s -> {rate:.1f}/s")

    result: dict[str, Any] = {
        "library": "pykeen",
        "pykeen_version": pykeen.get_version(),
        "torch_version": torch.__version__,
        "model": args.model,
        "dim": args.dim,
        "pykeen_embedding_dim": embedding_dim,
        "pykeen_embedding_dim_note": (
            "dim // 2 complex components (equal real parameter count)"
            if args.model in COMPLEX_MODELS
            else "real components"
        ),
        "batch_size": args.batch_size,
        "negatives": args.negatives,
        "loss": args.loss,
        "p": args.p if args.model == "transe" else None,
        "threads": args.threads,
        "seed": args.seed,
        "optimizer": "Adam(lr=1e-3)",
        "negative_sampler": "basic",
        "train_triples_measured": measured_triples,
        "train_seconds": round(measured_seconds, 3),
        "triples_per_s": round(rate, 1),
        "train_subset_triples": n_subset,
        "train_subset_batches": n_batches,
        "train_call_seconds": round(train_call_seconds, 3),
        "step_seconds": timer.step_seconds(),
        "estimate_triples_per_s": round(rate_est, 1),
        "timing_note": (
            "pre_batch-to-pre_batch intervals of batches 2..N-1 of one epoch on a random subset; "
            "excludes batch 1 and set-up outside the batch loop"
        ),
        "dataset": {
            "path": str(args.data),
            **counts,
            "num_entities": train.num_entities,
            "num_relations": train.num_relations,
        },
        "model_defaults": describe_model(model),
        "peak_rss_mb_before_eval": peak_rss_mb(),
        "eval_seconds": None,
        "eval_peak_rss_mb": None,
        "eval_mrr": None,
        "eval_hits_at_10": None,
        "eval_batch_size": None,
        "eval_note": (
            f"PyKEEN drops valid/test triples with entities unseen in train: test "
            f"{counts['test_lines']} lines -> {counts['test_triples']} ranked triples, valid "
            f"{counts['valid_lines']} -> {counts['valid_triples']} used as filter"
        ),
        "loadavg_at_start": [round(x, 2) for x in load_at_start],
        "hardware": hardware(),
    }

    if args.eval:
        evaluator = RankBasedEvaluator(filtered=True)
        log(
            f"evaluating on {test.num_triples} test triples (filtered, both sides, batch {args.eval_batch_size})"
        )
        start = time.perf_counter()
        metrics = evaluator.evaluate(
            model=model,
            mapped_triples=test.mapped_triples,
            batch_size=args.eval_batch_size,
            additional_filter_triples=[train.mapped_triples, valid.mapped_triples],
            use_tqdm=False,
        )
        eval_seconds = time.perf_counter() - start
        result.update(
            eval_seconds=round(eval_seconds, 2),
            eval_peak_rss_mb=peak_rss_mb(),
            eval_mrr=round(
                float(metrics.get_metric("both.realistic.inverse_harmonic_mean_rank")), 5
            ),
            eval_hits_at_10=round(float(metrics.get_metric("both.realistic.hits_at_10")), 5),
            eval_batch_size=args.eval_batch_size,
        )
        log(
            f"eval: {eval_seconds:.1f}s, peak RSS {result['eval_peak_rss_mb']} MB, MRR {result['eval_mrr']}"
        )

    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(result, indent=2)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
