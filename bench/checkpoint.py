"""Checkpoint cost: commit throughput to a real S3 server and the per-epoch overhead.

    .venv/bin/python bench/checkpoint.py store --json bench/results/checkpoint_store.json
    .venv/bin/python bench/checkpoint.py overhead --json bench/results/checkpoint_overhead.json

``store``: a FB15k-237-sized state (TransE d=200 with Adam: entity, relation and two moments,
~35 MB) committed with :meth:`CheckpointStore.save` (serialise, SHA-256, PUT, manifest PUT)
against a raw ``s3fs`` PUT of the same bytes, to SeaweedFS on 127.0.0.1; ``--rounds``
interleaved rounds, medians.

``overhead``: FB15k-237 TransE epochs (``configs/fb15k237-transe.yaml``) with a checkpoint
every epoch (background upload, and foreground) against one checkpoint at the end only, to a
local folder and to SeaweedFS; training wall time from the first epoch to the last commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402
from common import commit, hardware  # noqa: E402
from safetensors.torch import save as st_save  # noqa: E402

from kgpipe.checkpoint import CheckpointStore, TrainState  # noqa: E402
from kgpipe.config import load_config  # noqa: E402
from kgpipe.run import train  # noqa: E402
from kgpipe.storage import Store  # noqa: E402
from kgpipe.training import Callback  # noqa: E402

DATASETS = REPO.parent / "shared" / "datasets"


def _weed(tmp: Path) -> Any:
    from conftest import WeedProcess

    weed = WeedProcess(tmp)
    weed.start()
    return weed


def bench_store(rounds: int) -> dict[str, Any]:
    import s3fs

    with tempfile.TemporaryDirectory() as tmp:
        weed = _weed(Path(tmp))
        try:
            opts = weed.server.storage_options()
            g = torch.Generator().manual_seed(0)
            ent, rel = torch.randn(14541, 200, generator=g), torch.randn(237, 200, generator=g)
            state = TrainState(
                1, 266, {"entity": ent, "relation": rel},
                {"entity.exp_avg": ent.clone(), "entity.exp_avg_sq": ent.abs(),
                 "relation.exp_avg": rel.clone(), "relation.exp_avg_sq": rel.abs(),
                 "step": torch.tensor([266])},
                [], torch.get_rng_state(),
            )  # fmt: skip
            fs = s3fs.S3FileSystem(**opts, skip_instance_cache=True)
            raw_s, ckpt_s = [], []
            size = 0
            for r in range(rounds):
                blob = st_save({f"t{i}": t for i, t in enumerate(
                    [*state.tables.values(), *state.optimizer.values()])})  # fmt: skip
                size = len(blob)
                t0 = time.perf_counter()
                fs.pipe_file(f"kgpipe/raw/round-{r}.bin", blob)
                raw_s.append(time.perf_counter() - t0)
                store = CheckpointStore(Store(f"s3://kgpipe/ckpt-{r}", opts))
                t0 = time.perf_counter()
                store.save(state, {"config_hash": "bench"})
                ckpt_s.append(time.perf_counter() - t0)
            raw, ck = statistics.median(raw_s), statistics.median(ckpt_s)
            return {
                "bytes": size,
                "rounds": rounds,
                "raw_put_seconds": raw_s,
                "checkpoint_seconds": ckpt_s,
                "raw_mb_per_s": size / raw / 1e6,
                "checkpoint_mb_per_s": size / ck / 1e6,
                "ratio_checkpoint_vs_raw": raw / ck,
            }
        finally:
            weed.stop()


class _Clock(Callback):
    """Wall time from the start of training to the end (after the last commit)."""

    def on_train_start(self, trainer: Any) -> None:
        self.t0 = time.perf_counter()

    def on_train_end(self, trainer: Any) -> None:
        self.seconds = time.perf_counter() - self.t0


def bench_overhead(rounds: int, epochs: int) -> dict[str, Any]:
    variants = {
        "end_only": ["checkpoint.every=1000"],
        "every_epoch_background": ["checkpoint.every=1", "checkpoint.background=true"],
        "every_epoch_foreground": ["checkpoint.every=1", "checkpoint.background=false"],
    }
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        weed = _weed(Path(tmp) / "weed")
        try:
            roots = {
                "local": [f"run.root={tmp}/runs"],
                "s3": ["run.root=s3://kgpipe/bench",
                       f"run.storage_options={json.dumps(weed.server.storage_options())}"],
            }  # fmt: skip
            for where, root in roots.items():
                times: dict[str, list[float]] = {k: [] for k in variants}
                for r in range(rounds):
                    for name, extra in variants.items():
                        cfg = load_config(
                            str(REPO / "configs" / "fb15k237-transe.yaml"),
                            [*root, f"run.name={where}-{name}-{r}", f"data.root={DATASETS}",
                             f"training.epochs={epochs}", "evaluation.every=0",
                             "evaluation.test=false", *extra],
                        )  # fmt: skip
                        clock = _Clock()
                        train(cfg, callbacks=[clock])
                        times[name].append(clock.seconds)
                        print(where, name, r, f"{clock.seconds:.2f} s", flush=True)
                med = {k: statistics.median(v) for k, v in times.items()}
                base = med["end_only"]
                out[where] = {
                    "seconds": times,
                    "median_seconds": med,
                    "overhead_background": med["every_epoch_background"] / base - 1,
                    "overhead_foreground": med["every_epoch_foreground"] / base - 1,
                }
        finally:
            weed.stop()
    return {"epochs": epochs, "rounds": rounds, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("what", choices=["store", "overhead"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--json")
    a = p.parse_args()
    t0 = time.perf_counter()
    res = bench_store(a.rounds) if a.what == "store" else bench_overhead(a.rounds, a.epochs)
    res = {"benchmark": f"checkpoint-{a.what}", "hardware": hardware(), "commit": commit(),
           "command": " ".join(sys.argv), "wall_seconds": time.perf_counter() - t0, **res}  # fmt: skip
    text = json.dumps(res, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
