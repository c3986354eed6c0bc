"""The ``kgpipe`` command line: train, evaluate, export, predict.

User errors (bad config, bad data, missing run folders) print one clear message and exit with
status 2; nothing is half-written. Unexpected errors keep their traceback (they are bugs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from kgpipe.errors import KgpipeError

__all__ = ["main"]


def _progress_callback(console: Any) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from kgpipe.training import Callback, EpochStats, Trainer

    class RichProgress(Callback):
        def __init__(self) -> None:
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

        def on_train_start(self, trainer: Trainer) -> None:
            self.progress.start()
            self.task = self.progress.add_task(
                "train", total=trainer.total_steps, epoch=f"0/{trainer.cfg.epochs}", loss=0.0
            )
            self.progress.update(self.task, completed=trainer.global_step)

        def on_batch_end(
            self, trainer: Trainer, epoch: int, step: int, steps: int, loss: float
        ) -> None:
            self.progress.update(
                self.task,
                completed=trainer.global_step,
                epoch=f"{epoch}/{trainer.cfg.epochs}",
                loss=loss,
            )

        def on_epoch_end(self, trainer: Trainer, stats: EpochStats) -> None:
            parts = [
                f"epoch {stats.epoch}: loss {stats.loss:.4f}",
                f"{stats.triples_per_s:,.0f} triples/s",
            ]
            if "valid_mrr" in stats.extra:
                parts.append(f"valid MRR {stats.extra['valid_mrr']:.4f}")
            self.progress.console.log(", ".join(parts))

        def on_train_end(self, trainer: Trainer) -> None:
            self.progress.stop()

    return RichProgress()


class _EvalProgress:
    """A rich progress bar for ranking (queries done of total)."""

    def __init__(self, console: Any, label: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

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


def _print_metrics(console: Any, results: dict[str, Any], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    table.add_column("side")
    for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
        table.add_column(k, justify="right")
    for side, m in (("both", results), ("head", results["head"]), ("tail", results["tail"])):
        table.add_row(
            side,
            *(
                f"{m[k]:.4f}" if k != "mr" else f"{m[k]:.1f}"
                for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10")
            ),
        )
    console.print(table)


def _cmd_train(args: argparse.Namespace, console: Any) -> int:
    from kgpipe.config import load_config

    config = load_config(args.config, args.set or [])
    callbacks = [] if args.quiet else [_progress_callback(console)]
    t0 = time.perf_counter()
    if args.no_prefect:
        from kgpipe.run import train

        result = train(
            config,
            callbacks=callbacks,
            overwrite=args.overwrite,
            resume=args.resume,
            log=None if args.quiet else console.log,
            eval_progress=None if args.quiet else _EvalProgress(console, "test ranking"),
        )
        url, results = result.url, result.results
    else:
        url, results = _train_flow(config, args, callbacks)
    if results is not None:
        _print_metrics(console, results, f"test ({results['triples']} triples, filtered)")
    console.print(f"run folder: {url}  ({time.perf_counter() - t0:.1f} s)")
    return 0


def local_prefect_defaults() -> None:
    """Environment defaults for running a flow on Prefect's temporary local API server; call
    before Prefect is imported (its settings are read then). A value already set wins.

    * no telemetry: offline it only logs an error;
    * a 120 s start-up wait instead of Prefect's 20 s: the first start on a new machine
      creates and migrates the database, and on 2 busy cores that measured 31 s (the flow then
      failed with "Timed out while attempting to connect to ephemeral Prefect API server").
    """
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _train_flow(config: Any, args: argparse.Namespace, callbacks: list[Any]) -> tuple[str, Any]:
    """Run the Prefect flow ``train-kge`` in this process (ephemeral Prefect API unless
    ``PREFECT_API_URL`` is set)."""
    import json as _json

    local_prefect_defaults()
    try:
        from flows.train import train_kge
        from tasks import kge
    except ImportError as err:  # not run from a checkout / install with the flows
        raise KgpipeError(f"the Prefect flow is not importable ({err}); use --no-prefect") from None
    from kgpipe.run import run_exists_error, run_store

    config = config.with_run_name()
    store = run_store(config)
    exists = store.exists("config.yaml")
    if exists and not (args.overwrite or args.resume):
        raise run_exists_error(store.url)
    if not exists or args.overwrite:
        # bad input stops here with a plain message, before Prefect logs a task failure and
        # before an existing run is replaced (the flow's staging reads the data again)
        from kgpipe.data import load_dataset

        load_dataset(config.data)
        if exists:
            store.remove()
    kge.EXTRA_CALLBACKS[:] = callbacks
    try:
        summary = train_kge(config, resume=True)
    finally:
        kge.EXTRA_CALLBACKS.clear()
    results = _json.loads(store.read_text("results.json")) if store.exists("results.json") else None
    return str(summary["run"]), results


def _cmd_evaluate(args: argparse.Namespace, console: Any) -> int:
    from kgpipe.run import evaluate_run

    progress = None if args.json else _EvalProgress(console, f"{args.split} ranking")
    results = evaluate_run(
        args.run, split=args.split, batch_size=args.batch_size, progress=progress
    )
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print_metrics(console, results, f"{args.split} ({results['triples']} triples, filtered)")
        console.print(f"{results['seconds']:.2f} s")
    return 0


def _cmd_export(args: argparse.Namespace, console: Any) -> int:
    from kgpipe.export import export_embeddings
    from kgpipe.run import load_run

    run = load_run(args.run)
    written = export_embeddings(run.model, run.vocab, args.out, fmt=args.format)
    for url in written:
        console.print(url)
    return 0


def _cmd_predict(args: argparse.Namespace, console: Any) -> int:
    import torch
    from rich.table import Table

    from kgpipe.data import load_dataset
    from kgpipe.run import load_run

    if (args.head is None) == (args.tail is None):
        raise KgpipeError(
            "give exactly one of --head (to predict tails) or --tail (to predict heads)"
        )
    run = load_run(args.run)
    vocab, model = run.vocab, run.model
    r = torch.tensor([vocab.relation_id(args.relation)])
    if args.head is not None:
        anchor = torch.tensor([vocab.entity_id(args.head)])
        scores = model.score_all_tails(anchor, r)[0]
        known_col = 2
    else:
        anchor = torch.tensor([vocab.entity_id(args.tail)])
        scores = model.score_all_heads(r, anchor)[0]
        known_col = 0
    known: set[int] = set()
    if not args.no_known:
        train = load_dataset(run.config.data).train
        other = 0 if known_col == 2 else 2
        mask = (train[:, 1] == r) & (train[:, other] == anchor)
        known = set(train[mask, known_col].tolist())
    top = torch.topk(scores, min(args.top, scores.numel()))
    side = "tail" if args.head is not None else "head"
    table = Table(
        title=f"top {args.top} {side}s for "
        + (
            f"({args.head}, {args.relation}, ?)"
            if args.head is not None
            else f"(?, {args.relation}, {args.tail})"
        )
    )
    table.add_column("#", justify="right")
    table.add_column(side)
    table.add_column("score", justify="right")
    table.add_column("in train")
    rows = []
    for i, (s, e) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True), 1):
        label = vocab.entities[e]
        rows.append({"rank": i, side: label, "score": s, "known": e in known})
        table.add_row(str(i), label, f"{s:.4f}", "yes" if e in known else "")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kgpipe", description="Train knowledge-graph embeddings.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model and write a run folder")
    t.add_argument("-c", "--config", required=True, help="YAML config (any fsspec URL)")
    t.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE", help="override a config value"
    )
    t.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run folder's latest committed checkpoint (a fresh run if none)",
    )
    t.add_argument(
        "--no-prefect",
        action="store_true",
        help="train with the plain library loop, without the Prefect flow (for debugging)",
    )
    t.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    t.set_defaults(func=_cmd_train)

    e = sub.add_parser("evaluate", help="filtered link-prediction metrics of a trained run")
    e.add_argument("run", help="run folder URL")
    e.add_argument("--split", choices=("valid", "test"), default="test")
    e.add_argument("--batch-size", type=int, default=None, help="queries ranked at once")
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(func=_cmd_evaluate)

    x = sub.add_parser("export", help="export embeddings")
    x.add_argument("run", help="run folder URL")
    x.add_argument("--format", choices=("parquet", "npy"), default="parquet")
    x.add_argument("--out", required=True, help="output folder URL")
    x.set_defaults(func=_cmd_export)

    q = sub.add_parser("predict", help="top-scored tails (--head) or heads (--tail)")
    q.add_argument("run", help="run folder URL")
    q.add_argument("--head", help="head entity label: predict tails")
    q.add_argument("--tail", help="tail entity label: predict heads")
    q.add_argument("--relation", required=True, help="relation label")
    q.add_argument("--top", type=int, default=10)
    q.add_argument("--no-known", action="store_true", help="do not mark triples seen in train")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=_cmd_predict)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kgpipe`` console script."""
    from rich.console import Console

    args = build_parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        return int(args.func(args, console))
    except KgpipeError as err:
        from rich.markup import escape

        console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
