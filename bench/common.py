"""Shared helpers of the benchmark scripts."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def hardware() -> dict[str, Any]:
    """CPU model, cores, torch threads and versions (recorded next to every result)."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def timed_training(cfg: Any, steps: int) -> tuple[Any, Any, Any]:
    """Train ``cfg`` on the first ``steps`` batches of its training triples: one warm-up pass,
    then one timed pass. Returns the data set, the model and the timed pass's epoch statistics.

    ``kgpipe`` is imported here, so a caller that put another checkout first on ``sys.path``
    times that checkout's code.
    """
    from kgpipe.data.dataset import load_dataset
    from kgpipe.models.model import KGEModel
    from kgpipe.process import configure
    from kgpipe.training.loop import Trainer

    # the run's kernels as a launcher sets them; threads and allocator stay the caller's
    configure(threads=None, allocator="system", deterministic=cfg.training.deterministic)
    ds = load_dataset(cfg.data)
    model = KGEModel.build(
        cfg.model, num_entities=ds.num_entities, num_relations=ds.num_relations, seed=0
    )
    subset = ds.train[: cfg.training.batch_size * steps]
    trainer = Trainer(
        model, subset, training=cfg.training, regularizer=cfg.model.regularizer, seed=0
    )
    trainer.train_epoch()  # warm-up
    return ds, model, trainer.train_epoch()


def commit() -> str:
    """The checkout's commit (of this file's checkout, wherever the benchmark runs from)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, cwd=Path(__file__).resolve().parent,
        )  # fmt: skip
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def report(result: dict[str, Any], path: str | None) -> None:
    """Print a benchmark's result as JSON and write it to ``path`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


def write_result(result: dict[str, Any], path: Path) -> None:
    """Write a benchmark's result file (its folder made if needed) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def stage_random_triples(folder: str, *, triples: int, entities: int, shards: int) -> None:
    """``triples`` random triples (``entities`` entities, 200 relations, seed 0) staged as a run
    folder's ``shards`` training shards in ``folder``."""
    import torch

    from kgpipe.data.shards import stage_shards
    from kgpipe.storage import Store

    gen = torch.Generator().manual_seed(0)
    train = torch.randint(0, entities, (triples, 3), generator=gen)
    train[:, 1] %= 200
    stage_shards(train, Store(folder), num_shards=shards, seed=0)


def peak_rss() -> int:
    """This process's own peak resident set in bytes.

    Linux: ``VmHWM`` of /proc/self/status, the high-water mark of this process's memory since
    it started its program. Not ``ru_maxrss``: the kernel carries that across fork and exec, so
    a Dask worker (spawned by a nanny inside the driver of a LocalCluster) starts with the
    driver's peak as its own -- after the driver staged a graph, both workers of a capacity run
    read the driver's 1,905 MB, identical to the byte. Elsewhere: ``ru_maxrss``.
    """
    import resource

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def rss() -> int:
    """This process's resident set in bytes now."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def synth_graph(
    graph: Path, *, entities: int, relations: int, edges: int, exponent: float = 1.1
) -> None:
    """A ``kgpipe synth`` graph in ``graph`` (kept when it is there already), 0.1 % valid/test;
    ``exponent`` is the power law's (lower: more of the entities appear in some edge)."""
    if (graph / "train.tsv").exists():
        return
    subprocess.run(
        [sys.executable, "-m", "kgpipe.cli", "synth", str(graph), "--entities", str(entities),
         "--relations", str(relations), "--edges", str(edges), "--valid", "0.001", "--test",
         "0.001", "--exponent", str(exponent), "-q"],
        check=True,
    )  # fmt: skip


def code_trees(before: str | None, root: Path) -> dict[str, str]:
    """``{"before": PATH, "after": ROOT}`` (``after`` alone without ``before``): the code trees a
    before/after benchmark runs, in the order each round runs them."""
    trees = {"after": str(root)}
    if before:
        trees = {"before": str(Path(before).resolve()), **trees}
    return trees


def interleaved_rounds(
    child: str, trees: dict[str, str], rounds: int, args: list[str], *, cwd: str
) -> dict[str, list[dict[str, Any]]]:
    """Run the Python source ``child`` (``sys.argv[1]``: the code tree to import kgpipe from,
    then ``args``) in a fresh process per tree and round, rounds interleaved, with
    ``PYTHONPATH`` cleared and in ``cwd`` (outside the checkout, whose ``kgpipe`` a ``-c``
    process would import first); returns each tree's rows (the JSON of the child's last
    line)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    env = {**os.environ, "PYTHONPATH": ""}
    for r in range(rounds):
        for name, tree in trees.items():
            res = subprocess.run(
                [sys.executable, "-c", child, tree, *args],
                capture_output=True, text=True, check=True, env=env, cwd=cwd,
            )  # fmt: skip
            row = json.loads(res.stdout.strip().splitlines()[-1])
            runs[name].append(row)
            print(r, name, json.dumps(row), flush=True)
    return runs


def train_sharded(graph: Path, runs: Path, dim: int, workers: int) -> Path:
    """One epoch of DistMult on ``graph`` (a `kgpipe synth` folder) with ``workers`` sharded
    LocalCluster workers, test off: the run folder ``runs/sharded``."""
    from kgpipe.config import parse_config
    from kgpipe.pipeline import train

    tree: dict[str, Any] = {
        "run": {"root": str(runs), "name": "sharded"},
        "data": {
            "train": str(graph / "train.tsv"),
            "valid": str(graph / "valid.tsv"),
            "test": str(graph / "test.tsv"),
            "header": False,
        },
        "model": {"name": "distmult", "dim": dim},
        "training": {"epochs": 1, "batch_size": 4096, "negatives": 64,
                     "loss": "cross_entropy", "optimizer": "adam"},
        "evaluation": {"every": 0, "test": False},
        "distributed": {"workers": workers, "strategy": "sharded"},
    }  # fmt: skip
    train(parse_config(tree))
    return runs / "sharded"
