"""Sharded commits in the background: how long training pauses for checkpoints (issue 22).

A 2-worker sharded gang trains a synthetic graph (``kgpipe synth``) for ``--epochs`` epochs in
one segment (no validation) with a checkpoint after every epoch, its commits written in the
background (``checkpoint.background: true``, the default since this benchmark) or from the live
tables between two steps (``false``: what every sharded commit did before), against one
checkpoint at the end only. Rounds are interleaved; medians.

Measured on rank 0: the wall time from the start of training to its end (the last commit
included), and the pause: that wall time less the epochs' own seconds (each epoch's training
loop), i.e. the time spent at epoch ends, which the commits dominate here.

    .venv/bin/python bench/sharded_commit.py --entities 2000000 --edges 2000000 --epochs 4 \
        --rounds 3 --json bench/results/sharded_commit_2000000.json
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, report, synth_graph
from kgpipe.training.hooks import Callback, TrainerView

VARIANTS = {
    "end_only": {"every": 1000},
    "every_epoch_foreground": {"every": 1, "background": False},
    "every_epoch_background": {"every": 1, "background": True},
}


class WallClock(Callback):
    """On rank 0: the time training starts and ends, appended to ``path`` (a worker process)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def _note(self, what: str) -> None:
        with open(self.path, "a") as f:
            f.write(f"{what} {time.time()}\n")

    def on_train_start(self, trainer: TrainerView) -> None:
        if trainer.rank == 0:
            self._note("start")

    def on_train_end(self, trainer: TrainerView) -> None:
        if trainer.rank == 0:
            self._note("end")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--entities", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=1_000_000)
    p.add_argument("--relations", type=int, default=50)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--graph", default=None, help="keep the synthetic graph here (reused)")
    p.add_argument("--json")
    args = p.parse_args()

    from distributed import Client

    from kgpipe.config import parse_config
    from kgpipe.distributed.client import open_cluster
    from kgpipe.pipeline import train
    from kgpipe.runs.stage import prepare_run

    t_all = time.perf_counter()
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        graph = Path(args.graph) if args.graph else Path(tmp) / "graph"
        synth_graph(graph, entities=args.entities, relations=args.relations, edges=args.edges)
        with open_cluster("local", workers=2) as client:
            assert isinstance(client, Client)
            for r in range(args.rounds):
                for name, ckpt in VARIANTS.items():
                    tree: dict[str, Any] = {
                        "run": {"root": str(Path(tmp) / "runs"), "name": "bench"},
                        "data": {"train": str(graph / "train.tsv"),
                                 "valid": str(graph / "valid.tsv"),
                                 "test": str(graph / "test.tsv"), "header": False},
                        "model": {"name": "transe", "dim": args.dim},
                        "training": {"epochs": args.epochs, "batch_size": 4096, "negatives": 64,
                                     "loss": "cross_entropy", "optimizer": "adam", "threads": 1},
                        "evaluation": {"every": 0, "test": False},
                        "checkpoint": {"keep_last": 2, **ckpt},
                        "distributed": {"workers": 2, "strategy": "sharded",
                                        "cluster": str(client.scheduler.address)},
                    }  # fmt: skip
                    config = parse_config(tree)
                    # the data is staged once; each variant starts without checkpoints
                    prepare_run(config, resume=True).store.remove("checkpoints")
                    clock = Path(tmp) / f"clock-{name}-{r}"
                    result = train(config, resume=True, rank_callbacks=[WallClock(clock)])
                    marks = dict(line.split() for line in clock.read_text().splitlines())
                    wall = float(marks["end"]) - float(marks["start"])
                    epochs = sum(h.seconds for h in result.history)
                    row = {"wall_s": wall, "epochs_s": epochs, "pause_s": wall - epochs}
                    rows[name].append(row)
                    print(r, name, {k: round(v, 2) for k, v in row.items()}, flush=True)
        info = json.loads((Path(tmp) / "runs" / "bench" / "data.json").read_text())
    medians = {
        name: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        for name, runs in rows.items()
    }
    base = medians["end_only"]["wall_s"]
    n = int(info["num_entities"])
    out = {
        "benchmark": "sharded-commit",
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "entities": n,
        "train_triples": int(info["splits"]["train"]["triples"]),
        "dim": args.dim,
        "epochs": args.epochs,
        "rounds": args.rounds,
        # one rank's share: half the entity rows, Adam's two moments
        "rank_checkpoint_bytes": 3 * 4 * (n // 2) * args.dim,
        "runs": rows,
        "medians": medians,
        "overhead_vs_end_only": {k: v["wall_s"] / base - 1 for k, v in medians.items()},
        "wall_seconds": time.perf_counter() - t_all,
    }
    report(out, args.json)


if __name__ == "__main__":
    main()
