"""What the CLI shows: a progress bar for training, one for ranking, metric tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from kgpipe.training.hooks import Callback, TrainerView
from kgpipe.training.records import EpochStats

__all__ = ["EvalProgress", "TrainProgress", "print_metrics"]


class TrainProgress(Callback):
    """A rich progress bar over the run's steps, and one line per epoch."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task: Any = None

    def on_train_start(self, trainer: TrainerView) -> None:
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=trainer.total_steps, epoch=f"0/{trainer.epochs}", loss=0.0
        )
        self.progress.update(self.task, completed=trainer.global_step)

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        self.progress.update(
            self.task,
            completed=trainer.global_step,
            epoch=f"{epoch}/{trainer.epochs}",
            loss=loss,
        )

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        parts = [
            f"epoch {stats.epoch}: loss {stats.loss:.4f}",
            f"{stats.triples_per_s:,.0f} triples/s",
        ]
        if "valid_mrr" in stats.extra:
            parts.append(f"valid MRR {stats.extra['valid_mrr']:.4f}")
        self.progress.console.log(", ".join(parts))

    def on_train_end(self, trainer: TrainerView) -> None:
        self.progress.stop()


class EvalProgress:
    """A rich progress bar for ranking (queries done of total)."""

    def __init__(self, console: Console, label: str) -> None:
        self.progress = Progress(
            f"[bold]{label}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("rank", total=total)
        self.progress.update(self.task, completed=done)
        if done >= total:
            self.progress.stop()


def print_metrics(console: Console, results: dict[str, Any], title: str) -> None:
    """Filtered MRR, MR and Hits@k, both sides and per side."""
    table = Table(title=title)
    table.add_column("side")
    keys = ("mrr", "mr", "hits@1", "hits@3", "hits@10")
    for k in keys:
        table.add_column(k, justify="right")
    for side, m in (("both", results), ("head", results["head"]), ("tail", results["tail"])):
        table.add_row(side, *(f"{m[k]:.4f}" if k != "mr" else f"{m[k]:.1f}" for k in keys))
    console.print(table)
