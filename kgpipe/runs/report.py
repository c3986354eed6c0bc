"""The end-of-run report: a loss/MRR curve (PNG) and a markdown summary."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from kgpipe.runs.folder import CURVES, RunFolder

__all__ = ["curve_png", "markdown_report"]


def curve_png(history: Sequence[dict[str, Any]]) -> bytes:
    """Training loss per epoch, and validation MRR where it was measured, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=90)
    epochs = [h["epoch"] for h in history]
    ax.plot(epochs, [h["loss"] for h in history], color="tab:blue", label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    valid = [(h["epoch"], h["valid_mrr"]) for h in history if "valid_mrr" in h]
    if valid:
        ax2 = ax.twinx()
        ax2.plot(*zip(*valid, strict=True), "o-", color="tab:orange", label="valid MRR")
        ax2.set_ylabel("valid MRR (filtered)", color="tab:orange")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _fmt(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else ("—" if x is None else str(x))


def markdown_report(
    run: RunFolder,
    results: dict[str, Any] | None,
    history: Sequence[dict[str, Any]],
    *,
    seconds: float,
    previous: dict[str, Any] | None = None,
    png: bytes | None = None,
    dashboard: str | None = None,
) -> str:
    """Final metrics next to the previous model's, URLs, wall time, throughput, workers."""
    cfg = run.config
    lines = [f"# kgpipe run `{cfg.run.name}`", ""]
    lines += [
        f"- model: **{cfg.model.name}** (dim {cfg.model.dim}), "
        f"data: {cfg.data.dataset or cfg.data.train}",
        f"- run folder: `{run.url}`",
    ]
    training = (results or {}).get("training", {})
    if training.get("checkpoint"):
        lines.append(
            f"- final checkpoint: `{training['checkpoint']}` (epoch {training['model_epoch']})"
        )
    train_s = sum(float(h["seconds"]) for h in history)
    triples = sum(int(h["triples"]) for h in history)
    lines += [
        f"- epochs trained: {len(history)} of {cfg.training.epochs}"
        + (f" (resumed from epoch {run.resumed_epoch})" if run.resumed_epoch else ""),
        f"- wall time: {seconds:.1f} s (training {train_s:.1f} s, "
        f"{triples / train_s if train_s else 0:,.0f} triples/s)",
        f"- workers: {cfg.distributed.workers} (sync {cfg.distributed.sync}), "
        f"restarts: {training.get('restarts', 0)}",
    ]
    if dashboard:
        lines.append(f"- Dask dashboard: {dashboard}")
    lines.append("")
    if results is not None:
        prev = (previous or {}).get("results") or {}
        lines += ["| metric (test, filtered) | this run | previous model |", "|---|---:|---:|"]
        for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
            lines.append(f"| {k} | {_fmt(results[k])} | {_fmt(prev.get(k))} |")
        if previous:
            lines.append(f"\nprevious model: `{previous.get('url')}`")
        lines.append("")
    if png is not None:
        data = base64.b64encode(png).decode()
        lines += [f"![loss and validation MRR](data:image/png;base64,{data})", "",
                  f"Curve: `{run.store.url_of(CURVES)}`"]  # fmt: skip
    return "\n".join(lines) + "\n"
