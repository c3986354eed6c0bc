"""Checkpoint cost: commit throughput to a real S3 server and the per-epoch overhead.

    .venv/bin/python bench/checkpoint.py store --json bench/results/checkpoint_store.json
    .venv/bin/python bench/checkpoint.py overhead --rounds 5 --epochs 5 \
        --json bench/results/checkpoint_overhead_fb15k237_5ep.json
    .venv/bin/python bench/checkpoint.py overhead --rounds 4 --epochs 10 --where s3 \
        --variants every_epoch_background --json bench/results/checkpoint_overhead_fb15k237_s3_10ep.json

``store``: a FB15k-237-sized state (TransE d=200 with Adam: entity, relation and two moments,
~35 MB) committed with :meth:`CheckpointStore.save` (serialise, SHA-256, PUT, manifest PUT)
against a raw ``s3fs`` PUT of the same bytes, to SeaweedFS on 127.0.0.1; ``--rounds``
interleaved rounds, medians.

``overhead``: FB15k-237 TransE epochs (``bench/configs/fb15k237-transe-speed.yaml``) with a checkpoint
every epoch (background upload, and foreground) against one checkpoint at the end only, to a
local folder and to SeaweedFS; training wall time from the first epoch to the last commit, and
the seconds the training thread is blocked in commits (precise where wall time is noisy).
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
from common import commit, hardware, report  # noqa: E402
from safetensors.torch import save as st_save  # noqa: E402

from kgpipe.checkpoint import CheckpointStore, TrainState  # noqa: E402
from kgpipe.config import load_config  # noqa: E402
from kgpipe.pipeline import train  # noqa: E402
from kgpipe.runs.stage import prepare_run  # noqa: E402
from kgpipe.storage import Store  # noqa: E402
from kgpipe.training.hooks import Callback  # noqa: E402

DATASETS = REPO.parent / "shared" / "datasets"


def _weed(tmp: Path) -> Any:
    from conftest import WeedProcess

    tmp.mkdir(parents=True, exist_ok=True)
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


class _Blocked:
    """Seconds the training thread spends inside checkpoint commits (snapshot, waiting for the
    previous upload, or the whole commit in the foreground), measured around
    :meth:`CheckpointWriter.submit` and :meth:`CheckpointWriter.wait`."""

    def __init__(self) -> None:
        from kgpipe.runs.callbacks import CheckpointWriter

        self.seconds = 0.0
        self.cls = CheckpointWriter
        self.orig = (CheckpointWriter.submit, CheckpointWriter.wait)
        outer = self

        def timed(fn: Any) -> Any:
            def wrapper(self: Any, *a: Any, **k: Any) -> Any:
                if getattr(self, "_in_timed", False):
                    return fn(self, *a, **k)
                self._in_timed = True
                t0 = time.perf_counter()
                try:
                    return fn(self, *a, **k)
                finally:
                    outer.seconds += time.perf_counter() - t0
                    self._in_timed = False

            return wrapper

        CheckpointWriter.submit = timed(CheckpointWriter.submit)  # type: ignore[method-assign]
        CheckpointWriter.wait = timed(CheckpointWriter.wait)  # type: ignore[method-assign]

    def close(self) -> None:
        self.cls.submit, self.cls.wait = self.orig  # type: ignore[method-assign]


def bench_overhead(
    rounds: int, epochs: int, only: list[str] | None = None, where_only: list[str] | None = None
) -> dict[str, Any]:
    variants = {
        "end_only": ["checkpoint.every=1000"],
        "every_epoch_background": ["checkpoint.every=1", "checkpoint.background=true"],
        "every_epoch_foreground": ["checkpoint.every=1", "checkpoint.background=false"],
    }
    if only:
        variants = {k: v for k, v in variants.items() if k in only or k == "end_only"}
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
                if where_only and where not in where_only:
                    continue
                times: dict[str, list[float]] = {k: [] for k in variants}
                blocked: dict[str, list[float]] = {k: [] for k in variants}
                epoch_s: dict[str, list[float]] = {k: [] for k in variants}
                for r in range(rounds):
                    for name, extra in variants.items():
                        cfg = load_config(
                            str(REPO / "bench" / "configs" / "fb15k237-transe-speed.yaml"),
                            [*root, f"run.name={where}-bench", f"data.root={DATASETS}",
                             f"training.epochs={epochs}", "evaluation.every=0",
                             "evaluation.test=false", *extra],
                        )  # fmt: skip
                        # the data is staged once; each variant starts without checkpoints
                        prepare_run(cfg, resume=True).store.remove("checkpoints")
                        clock = _Clock()
                        probe = _Blocked()
                        try:
                            result = train(cfg, callbacks=[clock], resume=True)
                        finally:
                            probe.close()
                        times[name].append(clock.seconds)
                        blocked[name].append(probe.seconds)
                        epoch_s[name].append(sum(h.seconds for h in result.history))
                        print(where, name, r, f"{clock.seconds:.2f} s, blocked "
                              f"{probe.seconds:.2f} s", flush=True)  # fmt: skip
                med = {k: statistics.median(v) for k, v in times.items()}
                base = med["end_only"]

                def overhead(k: str, med: dict[str, float] = med, base: float = base) -> Any:
                    return med[k] / base - 1 if k in med else None

                out[where] = {
                    "seconds": times,
                    "blocked_seconds": blocked,
                    "epoch_seconds": epoch_s,
                    "blocked_share_of_epochs": {
                        k: statistics.median(
                            b / e for b, e in zip(blocked[k], epoch_s[k], strict=True)
                        )
                        for k in variants
                    },
                    "median_seconds": med,
                    "overhead_background": overhead("every_epoch_background"),
                    "overhead_foreground": overhead("every_epoch_foreground"),
                }
        finally:
            weed.stop()
    return {"epochs": epochs, "rounds": rounds, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("what", choices=["store", "overhead"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--variants", help="comma-separated (end_only is always run)")
    p.add_argument("--where", help="comma-separated: local,s3")
    p.add_argument("--json")
    a = p.parse_args()
    t0 = time.perf_counter()
    split = lambda x: x.split(",") if x else None  # noqa: E731
    res = (
        bench_store(a.rounds)
        if a.what == "store"
        else bench_overhead(a.rounds, a.epochs, split(a.variants), split(a.where))
    )
    res = {"benchmark": f"checkpoint-{a.what}", "hardware": hardware(), "commit": commit(),
           "command": " ".join(sys.argv), "wall_seconds": time.perf_counter() - t0, **res}  # fmt: skip
    report(res, a.json)


if __name__ == "__main__":
    main()
