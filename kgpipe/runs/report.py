"""The end-of-run report: a loss/MRR curve (PNG), a markdown summary, and the per-epoch metrics
table (what the Prefect flow publishes as artifacts; rounded for reading, one set of columns)."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kgpipe.runs.folder import CURVES, DATA, RunFolder

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "best_validation",
    "curve_figure",
    "curve_png",
    "markdown_report",
    "metrics_table",
    "png_data_uri",
]

#: Columns of every row of the metrics table, and how each is rounded (decimals; 0: an integer;
#: None: as recorded). A value an epoch does not have (validation, ...) is None, so that every
#: row has the same keys: a table UI takes its columns from the first row.
TABLE_COLUMNS: dict[str, int | None] = {
    "epoch": None,
    "loss": 4,
    "lr": None,
    "valid_mrr": 4,
    "valid_hits@10": 4,
    "triples_per_s": 0,
    "seconds": 2,
}
#: Columns shown only when some epoch recorded them (training on a Dask gang).
OPTIONAL_COLUMNS: dict[str, int | None] = {"world_size": 0, "bytes_sent": 0, "restarts": 0}


def _rounded(value: Any, decimals: int | None) -> Any:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if decimals == 0:
        return round(value)
    if decimals is None:
        return float(f"{value:.6g}") if isinstance(value, float) else value
    return round(float(value), decimals)


def metrics_table(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per epoch, every row with the same keys (see :data:`TABLE_COLUMNS`)."""
    columns = dict(TABLE_COLUMNS)
    columns.update({k: d for k, d in OPTIONAL_COLUMNS.items() if any(k in h for h in history)})
    return [{k: _rounded(h.get(k), d) for k, d in columns.items()} for h in history]


def best_validation(history: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The epoch record with the highest validation MRR (the first of equals), if any."""
    valid = [h for h in history if h.get("valid_mrr") is not None]
    return max(valid, key=lambda h: float(h["valid_mrr"])) if valid else None


def _mrr_top(best: float) -> float:
    """Upper limit of the MRR axis: 0 to at most 1, room above the best value, and never so
    tight that a change in the third decimal looks like a trend."""
    return min(1.0, max(0.2, math.ceil(best * 1.25 * 10) / 10))


def curve_figure(history: Sequence[dict[str, Any]]) -> Figure:
    """Training loss per epoch (left axis) and validation MRR where it was measured (right axis,
    from 0), with the best validation epoch marked; a matplotlib figure (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    epochs = [h["epoch"] for h in history]
    lines = ax.plot(
        epochs, [h["loss"] for h in history], color="tab:blue", lw=1.8, label="train loss"
    )
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    ax.grid(alpha=0.3)
    valid = [(h["epoch"], float(h["valid_mrr"])) for h in history if h.get("valid_mrr") is not None]
    if valid:
        ax2 = ax.twinx()
        lines += ax2.plot(
            *zip(*valid, strict=True),
            "o-",
            color="tab:orange",
            lw=1.8,
            label="valid MRR (filtered)",
        )
        best = best_validation(history)
        assert best is not None
        lines += ax2.plot(
            [best["epoch"]], [best["valid_mrr"]], "*", color="tab:red", markersize=16,
            label=f"best: epoch {best['epoch']}, MRR {float(best['valid_mrr']):.4f}",
        )  # fmt: skip
        ax.axvline(best["epoch"], color="tab:red", ls=":", lw=1)
        ax2.set_ylim(0.0, _mrr_top(max(m for _, m in valid)))
        ax2.set_ylabel("valid MRR (filtered)", color="tab:orange")
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="center right")
    ax.set_title("training loss and validation MRR")
    fig.tight_layout()
    return fig


def curve_png(history: Sequence[dict[str, Any]]) -> bytes:
    """:func:`curve_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = curve_figure(history)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def png_data_uri(png: bytes) -> str:
    """A PNG inlined as a ``data:`` URI (for a report read where the run folder is not)."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _fmt(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else ("—" if x is None else str(x))


def _hyperparameters(run: RunFolder) -> list[str]:
    m, t, e = run.config.model, run.config.training, run.config.evaluation
    reg = m.regularizer.type
    if reg != "none":
        reg += f" (weight {m.regularizer.weight:g})"
    negatives = f"{t.negatives} per positive" if t.mode == "negative_sampling" else f"— ({t.mode})"
    schedule = t.schedule + (f", {t.warmup_steps} warm-up steps" if t.warmup_steps else "")
    every = f"every {e.every} epochs" if e.every else "never"
    if e.every and e.patience:
        every += f", early stopping after {e.patience} without gain"
    rows = [
        ("model", f"{m.name}" + (" (reciprocal relations)" if m.reciprocal else "")),
        ("dim", str(m.dim)),
        ("regularizer", reg),
        ("mode", t.mode),
        ("loss", t.loss),
        ("optimizer", t.optimizer),
        ("learning rate", f"{t.lr:g}"),
        ("batch size", str(t.batch_size)),
        ("negatives", negatives),
        ("schedule", schedule),
        ("epochs", str(t.epochs)),
        ("validation", every),
        ("seed", str(run.config.run.seed)),
    ]
    return ["| hyperparameter | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _data(run: RunFolder) -> list[str]:
    """The sources read and their counts, from the run folder's ``data.json``."""
    store = run.store
    if not store.exists(DATA):
        return []
    info = store.read_json(DATA)
    fingerprint = str(info.get("fingerprint", ""))[:12]
    out = [
        f"{int(info['num_entities']):,} entities, {int(info['num_relations']):,} relations "
        f"(input fingerprint `{fingerprint}`)",
        "",
        "| split | triples | lines read | duplicates removed | unseen | source |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for split, rep in info.get("splits", {}).items():
        unseen = "—" if rep.get("unseen_action") == "n/a" else (
            f"{rep.get('unseen', 0):,} ({rep.get('unseen_action')})"
        )  # fmt: skip
        out.append(
            f"| {split} | {rep['triples']:,} | {rep['lines']:,} | {rep['duplicates']:,} "
            f"| {unseen} | `{rep['source']}` |"
        )
    return out


def markdown_report(
    run: RunFolder,
    results: dict[str, Any] | None,
    history: Sequence[dict[str, Any]],
    *,
    seconds: float,
    previous: dict[str, Any] | None = None,
    png: bytes | None = None,
    curve: str | None = None,
    dashboard: str | None = None,
) -> str:
    """What a reader asks first: final test metrics next to the previous model's, the best
    validation epoch, the hyperparameters, the data read; then URLs, wall time, throughput,
    workers and the curve. The curve is ``curve`` (a link, e.g. ``curves.png`` beside the
    report) or else ``png`` inlined (for a report read away from the run folder)."""
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
    best = best_validation(history)
    if best is not None:
        hits = best.get("valid_hits@10")
        lines.append(
            f"- best validation: epoch **{best['epoch']}**, MRR **{float(best['valid_mrr']):.4f}**"
            + (f", Hits@10 {float(hits):.4f}" if hits is not None else "")
            + _against(best.get("valid_candidates"))
        )
    else:
        lines.append("- best validation: — (no validation ran)")
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
        protocol = results.get("protocol", {})
        ranking = "filtered" if protocol.get("filter", True) else "unfiltered"
        ranking += _against(protocol.get("candidates"))
        lines += [f"| metric (test, {ranking}) | this run | previous model |", "|---|---:|---:|"]
        for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
            lines.append(f"| {k} | {_fmt(results[k])} | {_fmt(prev.get(k))} |")
        if previous:
            lines.append(f"\nprevious model: `{previous.get('url')}`")
        lines.append("")
    lines += ["## Hyperparameters", "", *_hyperparameters(run), ""]
    data = _data(run)
    if data:
        lines += ["## Data", "", *data, ""]
    if curve is not None or png is not None:
        image = curve if curve is not None else png_data_uri(png or b"")
        lines += ["## Curves", "", f"![loss and validation MRR]({image})", "",
                  f"Curve: `{run.store.url_of(CURVES)}`"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _against(candidates: Any) -> str:
    """What a ranking was against, where not every entity: sampled and per-query candidates
    give higher MRRs than full ranking (not comparable with published results)."""
    if not candidates or candidates in ("all", "all entities"):
        return ""
    return f" against {candidates} candidates, not all entities"
