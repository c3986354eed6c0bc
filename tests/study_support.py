"""Helpers of the tests that kill a search mid-study and resume it."""

from __future__ import annotations

from pathlib import Path


def committed_epochs(trials: Path, done: set[int]) -> dict[int, int]:
    """Each unfinished trial (not in ``done``) with a committed checkpoint past epoch 0 ->
    its last committed epoch, read from the trial folders under ``trials``."""
    out = {}
    for trial in trials.glob("trial-*"):
        n = int(trial.name.split("-")[1])
        manifests = trial.glob("checkpoints/epoch-*/manifest.json")
        last = max((int(m.parent.name.split("-")[1]) for m in manifests), default=0)
        if n not in done and last > 0:
            out[n] = last
    return out


def metrics_lines(trials: Path, n: int) -> list[str]:
    """Trial ``n``'s ``metrics.jsonl``, a record a line."""
    return [x for x in (trials / f"trial-{n:04d}" / "metrics.jsonl").read_text().splitlines() if x]
