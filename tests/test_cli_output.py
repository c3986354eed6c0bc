"""What `kgpipe train` prints: one progress display for the whole run, quiet Prefect and Dask."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console

from kgpipe.cli.output import TrainProgress
from kgpipe.training.hooks import TrainerView
from kgpipe.training.records import EpochStats

REPO = Path(__file__).resolve().parents[1]


@dataclass
class _View:
    epochs: int = 20
    steps: int = 10  # per epoch
    epoch: int = 0
    global_step: int = 0
    history: list[EpochStats] = field(default_factory=list)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps


def _run(progress: TrainProgress, segments: list[tuple[int, int]], every: int) -> None:
    """The callbacks a run of ``segments`` (first, last epoch) makes, validating every ``every``."""
    view = _View()
    for first, last in segments:
        view.epoch = first - 1
        progress.on_train_start(cast(TrainerView, view))
        for epoch in range(first, last + 1):
            for step in range(view.steps):
                view.global_step += 1
                progress.on_batch_end(cast(TrainerView, view), epoch, step, view.steps, 9.0)
            extra: dict[str, Any] = {"valid_mrr": 0.5 + epoch / 100} if epoch % every == 0 else {}
            stats = EpochStats(epoch, 1.0 / epoch, 1000, 0.5, 0.1, view.steps, extra)
            view.epoch = epoch
            progress.on_epoch_end(cast(TrainerView, view), stats)
        progress.on_train_end(cast(TrainerView, view))
    progress.close()


def test_outside_a_terminal_a_line_per_validation_not_per_epoch() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200, log_path=False)
    _run(TrainProgress(console, every_s=3600), [(1, 5), (6, 10), (11, 15), (16, 20)], every=5)
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 4, lines  # epochs 5, 10, 15, 20; not one per epoch, no bar copies
    assert lines[-1].endswith(
        "epoch 20/20: loss 0.0500, 2,000 triples/s, valid MRR 0.7000 (best 0.7000 at epoch 20)"
    )
    assert "━" not in out.getvalue()  # no bar drawn into a file


def test_outside_a_terminal_long_gaps_get_a_line_now_and_then() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200, log_path=False)
    _run(TrainProgress(console, every_s=0), [(1, 3)], every=100)
    assert len(out.getvalue().strip().splitlines()) == 3


def test_on_a_terminal_one_bar_for_the_whole_run() -> None:
    """The bar is not re-created per segment; it shows the epoch's mean loss (not the last
    batch's 9.0) and the best validation MRR."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, log_path=False)
    progress = TrainProgress(console)
    _run(progress, [(1, 5), (6, 10), (11, 15), (16, 20)], every=5)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    finals = [line for line in text.splitlines() if "200/200" in line]
    assert finals, text
    assert "loss 0.0500" in finals[-1] and "valid MRR 0.7000" in finals[-1]
    assert "loss 9.0" not in text
    assert len(progress.progress.tasks) == 1 and progress.task is None  # one bar, closed
    assert text.count("valid MRR 0.5500 (best") == 1  # one line at each validation


def test_a_resumed_run_says_its_best_validation_from_before() -> None:
    """After --resume the line said "best" of this process's epochs only (0.5685 at epoch 6
    where the run's best was 0.5755 at epoch 5)."""
    out = io.StringIO()
    progress = TrainProgress(Console(file=out, force_terminal=False, width=200))
    view = _View(epochs=6, epoch=5, global_step=50)
    view.history = [EpochStats(5, 1.0, 1000, 0.5, 0.1, 10, {"valid_mrr": 0.5755})]
    progress.on_train_start(cast(TrainerView, view))
    stats = EpochStats(6, 1.0, 1000, 0.5, 0.1, 10, {"valid_mrr": 0.5685})
    progress.on_epoch_end(cast(TrainerView, view), stats)
    progress.close()
    assert "valid MRR 0.5685 (best 0.5755 at epoch 5)" in out.getvalue(), out.getvalue()


def test_the_run_is_announced_once_not_at_every_validation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plain loop trains a segment per validation with the same trainer: the line that
    says what trains (model, steps, run folder) comes once, with the command's epochs; a
    resume says where it goes on from."""
    from cli_support import run_cli

    argv = ["train", "-c", str(REPO / "configs/umls-complex.yaml"), "--no-prefect",
            "--set", "model.dim=16", "--set", "training.epochs=6", "--set", "evaluation.every=2",
            "--set", "evaluation.test=false", "--set", f"run.root={tmp_path}",
            "--set", "run.name=once"]  # fmt: skip
    code, _, err = run_cli([*argv, "--set", "training.epochs=4"], capsys)
    assert code == 0, err
    said = re.findall(r"training complex \(dim 16, fp32 scores\) epochs (\S+), 21 steps each", err)
    assert said == ["1..4"], err
    assert re.findall(r"epoch (\d)/4:", err) == ["2", "4"], err
    code, _, err = run_cli([*argv, "--resume"], capsys)
    assert code == 0, err
    assert re.findall(r"scores\) epochs (\S+),", err) == ["5..6"], err
    # a log file: lines as the messages are, no padding to the width, no message broken
    lines = err.splitlines()
    assert all(line == line.rstrip() for line in lines), [x for x in lines if x != x.rstrip()]
    assert any(
        re.fullmatch(rf"\[[\d:]+\] training complex .* -> {re.escape(str(tmp_path))}/once", x)
        for x in lines
    ), err


@pytest.mark.slow
def test_kgpipe_train_through_prefect_is_quiet(tmp_path: Path) -> None:
    """The Prefect path prints each reported epoch once (not also as a Prefect log line), no
    Prefect task-state lines, no Dask notices, no traceback; kgpipe's own messages (what was
    read, the test metrics) are there."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", None)
    proc = subprocess.run(
        [
            sys.executable, "-m", "kgpipe.cli", "train", "-c", "configs/umls-complex.yaml",
            "--set", "distributed.workers=2", "--set", "training.epochs=10",
            "--set", "evaluation.every=5", "--set", "model.dim=32",
            "--set", f"run.root={tmp_path / 'runs'}", "--set", "run.name=quiet",
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "Task run" not in text and "Finished in state" not in text
    assert "distributed." not in text and "jupyter" not in text, text
    epochs = re.findall(r"epoch (\d+)/10:", text)
    assert epochs == ["5", "10"], text
    # the gang's line comes once, not again for the second segment (its own Prefect task)
    assert re.findall(r"epochs (\S+) on 2 Dask worker\(s\)", text) == ["1..10"], text
    assert "train: 5,216 triples" in text and "│ both │" in text
    assert len(text.strip().splitlines()) <= 30, text
