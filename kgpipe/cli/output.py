"""What the CLI shows: a progress bar for training, one for ranking, metric tables."""

from __future__ import annotations

import os
import time
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

__all__ = ["EvalProgress", "TrainProgress", "print_metrics", "ranking_word", "result_console"]


def result_console() -> Console:
    """Where a command's result (a table) goes: stdout, so that ``> file`` and ``| grep`` get
    it; progress, log lines and errors stay on stderr."""
    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 160  # a file or a pipe: a table's rows as they are, not wrapped at 80
    return out


class TrainProgress(Callback):
    """One progress display for the whole run, across its segments (each segment starts and
    ends a trainer: the display outlives them; :meth:`close` ends it).

    On a terminal: one bar over the run's steps with the epoch, the last epoch's mean loss and
    the latest valid MRR, and a line above it at each validation. Elsewhere (a log file, CI):
    plain lines -- at each validation, at the last epoch, and otherwise at most one every
    ``every_s`` seconds -- so a 100-epoch run is a handful of lines, not a hundred."""

    def __init__(self, console: Console, *, every_s: float = 30.0) -> None:
        self.console = console
        self.live = console.is_terminal
        self.every_s = every_s
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[valid]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.started: float | None = None
        self.last_line = time.monotonic()
        self.best: tuple[float, int] | None = None

    def _note_best(self, stats: EpochStats) -> None:
        valid = stats.extra.get("valid_mrr")
        if valid is not None and (self.best is None or valid > self.best[0]):
            self.best = (float(valid), stats.epoch)

    def on_train_start(self, trainer: TrainerView) -> None:
        if self.best is None:  # a resumed run's best may be an epoch from before
            for h in trainer.history:
                self._note_best(h)
        if not self.live:
            if self.started is None:  # the periodic lines count from the first step
                self.started = self.last_line = time.monotonic()
            return
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task(
                "train",
                total=trainer.total_steps,
                completed=trainer.global_step,
                epoch=f"{trainer.epoch}/{trainer.epochs}",
                loss="—",
                valid="",
            )
        else:  # the next segment: the same bar goes on
            self.progress.update(
                self.task, total=trainer.total_steps, completed=trainer.global_step
            )

    def on_batch_end(
        self, trainer: TrainerView, epoch: int, step: int, steps: int, loss: float
    ) -> None:
        if self.task is not None:
            self.progress.update(
                self.task, completed=trainer.global_step, epoch=f"{epoch}/{trainer.epochs}"
            )

    def on_epoch_end(self, trainer: TrainerView, stats: EpochStats) -> None:
        valid = stats.extra.get("valid_mrr")
        self._note_best(stats)
        line = f"epoch {stats.epoch}/{trainer.epochs}: loss {stats.loss:.4f}"
        line += f", {stats.triples_per_s:,.0f} triples/s"
        if valid is not None and self.best is not None:
            line += f", valid MRR {valid:.4f} (best {self.best[0]:.4f} at epoch {self.best[1]})"
        if self.task is not None:
            shown = "" if self.best is None else f"valid MRR {self.best[0]:.4f}"
            self.progress.update(self.task, loss=f"{stats.loss:.4f}", valid=shown)
            if valid is not None:
                self.console.log(line)
            return
        now = time.monotonic()
        if (
            valid is not None
            or stats.epoch >= trainer.epochs
            or now - self.last_line >= self.every_s
        ):
            self.console.log(line)
            self.last_line = now

    def close(self) -> None:
        """End the display (after the run, or when it fails)."""
        if self.task is not None:
            self.progress.stop()
            self.task = None


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
    sets = results.get("protocol", {}).get("candidate_sets")
    if sets is not None:  # a title is cut to the table's width: a line of its own
        source = f"seed {sets['seed']}" if "seed" in sets else "from data.candidates files"
        console.print(
            f"ranked against {sets['per_query']} candidates per query ({source}), "
            "not all entities: not comparable with full ranking"
        )


def ranking_word(results: dict[str, Any]) -> str:
    """How the metrics were ranked, for a title: ``filtered`` or ``unfiltered``."""
    return "filtered" if results.get("protocol", {}).get("filter", True) else "unfiltered"
