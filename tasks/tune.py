"""Thin Prefect tasks of the hyperparameter search (``flows/tune.py``) over :mod:`kgpipe.tune`,
and the search's artifacts: one trials table and one progress bar per flow run, updated as
trials start and finish, and a summary (plots inlined, the best config, its test metrics).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate

from kgpipe.config import RunConfig
from kgpipe.runs.report import png_data_uri
from kgpipe.tune import (
    SearchSpace,
    StudyEvent,
    StudyFolder,
    TuneSettings,
    open_study_folder,
    prepare_study,
    search_base,
    trial_length_text,
)
from kgpipe.tune.folder import STUDY
from kgpipe.tune.results import summarize, trial_rows
from kgpipe.tune.study import load_optuna_study, run_study, search_held

__all__: Sequence[str] = [
    "new_trials_progress",
    "new_trials_table",
    "open_or_prepare_study",
    "publish_summary",
    "run_search",
    "study_key",
    "summarize_study",
    "table_rows",
    "update_trials_table",
]

_FIRST = ("trial", "state", "valid_mrr", "duration_s", "epochs")


@task(cache_policy=NO_CACHE, timeout_seconds=600)
def open_or_prepare_study(
    base: RunConfig,
    space: SearchSpace | None,
    settings: TuneSettings,
    budget: dict[str, Any] | None = None,
) -> StudyFolder:
    """The study folder ``settings.root/settings.name``: resumed when it exists (its own base
    config, space and budget, but for what ``budget`` gives: trials, timeout_s, workers,
    trial_timeout_s), else checked and created (``space`` None: the model's shipped space)."""
    logger = get_run_logger()
    path = Path(settings.root) / settings.name if settings.name else None
    if path is None or not (path / STUDY).exists():
        folder = prepare_study(base, space, settings)
        logger.info(
            "new study %s (%d trial(s) in all; %s)",
            folder.path, settings.trials or 0, trial_length_text(folder.base),
        )  # fmt: skip
        return folder
    folder = open_study_folder(path)
    if folder.base.model_dump(mode="json") != search_base(base).model_dump(mode="json"):
        logger.warning("%s resumes with the base config it was created with, not this run's", path)
    if space is not None and folder.space.raw != space.raw:
        logger.warning("%s resumes with the search space it was created with, not this run's", path)
    for name in ("pruner", "prune_warmup", "seed", "storage"):
        given = getattr(settings, name)  # (storage None: not given)
        if given is not None and getattr(folder.settings, name) != given:
            logger.warning(
                "%s keeps its %s (%s), not this run's (%s)",
                path, name, getattr(folder.settings, name), getattr(settings, name),
            )  # fmt: skip
    folder = folder.with_settings(**(budget or {}))
    trials = folder.settings.trials
    budget_text = f"{trials} trial(s) in all" if trials else "no trial limit"
    logger.info("resuming study %s (%s)", folder.path, budget_text)
    return folder


@task(cache_policy=NO_CACHE)  # no timeout: the search has its own budget (trials, timeout)
def run_search(
    folder: StudyFolder, table_id: Any = None, progress_id: Any = None, *, held: bool = False
) -> float:
    """Run the study to its budget on the Dask cluster it opens (held for the whole search;
    a resumed study keeps its finished trials and continues the interrupted ones); the trials
    table and the progress bar follow each trial. ``held``: the flow holds the study's lease
    (else the search takes it). Returns the search's seconds."""
    logger = get_run_logger()
    t0 = time.perf_counter()
    s = folder.settings

    def on_event(event: StudyEvent) -> None:
        try:  # the artifacts are for reading: a failed update must not fail the search
            if table_id is not None:
                update_trials_table(table_id, table_rows(event.study))
            if progress_id is not None and event.kind == "finished":
                if s.trials:
                    done = 100.0 * event.finished / s.trials
                else:
                    done = 100.0 * (time.perf_counter() - t0) / float(s.timeout_s or 1)
                update_progress_artifact(progress_id, min(99.0, done))
        except Exception as err:
            logger.warning("trials artifacts not updated: %s", err)

    search = search_held if held else run_study
    study = search(folder, on_event=on_event, log=logger.info)
    try:  # the final state (also when the budget was spent already: a rerun of a done study)
        if table_id is not None:
            update_trials_table(table_id, table_rows(study))
        if progress_id is not None:
            update_progress_artifact(progress_id, 100.0)
    except Exception as err:
        logger.warning("trials artifacts not updated: %s", err)
    return time.perf_counter() - t0


@task(timeout_seconds=6 * 3600, cache_policy=NO_CACHE)
def summarize_study(folder: StudyFolder, seconds: float, *, held: bool = False) -> dict[str, Any]:
    """trials.csv, best.yaml, the plots and results.json in the study folder; the best trial
    (only it) is tested. ``held``: the flow holds the study's lease (else this task takes it)."""
    logger = get_run_logger()
    study = load_optuna_study(folder)
    return summarize(
        folder,
        study,
        seconds=seconds,
        test=folder.settings.test_best,
        log=logger.info,
        lease=not held,
    )


@task(timeout_seconds=600, cache_policy=NO_CACHE)
def publish_summary(folder: StudyFolder, results: dict[str, Any]) -> str:
    """The study's summary artifact (plots inlined: the Prefect UI cannot reach the folder);
    its key."""
    key = study_key(folder, "summary")
    create_markdown_artifact(
        key=key,
        markdown=summary_markdown(folder, results),
        description=f"kgpipe search: {folder.name}",
    )
    return key


# -- the artifacts --------------------------------------------------------------------------


def study_key(folder: StudyFolder, what: str) -> str:
    """Artifact keys: lowercase letters, digits and dashes only (``kgpipe-study-NAME-WHAT``)."""
    name = "".join(c if c.isalnum() else "-" for c in folder.name.lower())
    name = "-".join(p for p in name.split("-") if p)
    return f"kgpipe-study-{name[: 100 - len(what)].strip('-')}-{what}"


def table_rows(study: Any) -> list[dict[str, Any]]:
    """The trials table: trial, state, valid MRR, duration, epochs, then the sampled values
    (every row has every column: conditional parameters are empty where not sampled)."""
    rows = []
    for row in trial_rows(study):
        row = dict(row)
        row["duration_s"] = row.pop("seconds", None)
        rows.append(row)
    columns = list(_FIRST)
    for row in rows:
        columns += [k for k in row if k not in columns and k != "error"]
    if any("error" in row for row in rows):
        columns.append("error")
    return [{c: row.get(c) for c in columns} for row in rows]


def new_trials_table(folder: StudyFolder) -> Any:
    """The study's trials table of this flow run (a resumed study's trials so far); its id."""
    return create_table_artifact(
        key=study_key(folder, "trials"),
        table=table_rows(load_optuna_study(folder)),
        description=f"Trials of the search {folder.name} (valid MRR: best validation)",
    )


def update_trials_table(artifact_id: Any, rows: list[dict[str, Any]]) -> None:
    """Replace the rows of the trials table (one table that grows, not one per trial)."""
    data = json.dumps(rows, default=str)  # what create_table_artifact stores
    with get_client(sync_client=True) as client:
        client.update_artifact(artifact_id=artifact_id, artifact=ArtifactUpdate(data=data))


def new_trials_progress(folder: StudyFolder) -> Any:
    """A progress bar over the study's trials (a resumed study's finished ones count)."""
    done = sum(r["state"] in ("complete", "pruned", "fail") for r in table_rows(
        load_optuna_study(folder)
    ))  # fmt: skip
    budget = folder.settings.trials
    return create_progress_artifact(
        progress=min(100.0, 100.0 * done / budget) if budget else 0.0,
        key=study_key(folder, "progress"),
        description=f"Trials finished in the search {folder.name}",
    )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def summary_markdown(folder: StudyFolder, results: dict[str, Any]) -> str:
    """The search's summary: trials by state, the best trial, its values and test metrics, the
    best-so-far and importance plots (inlined) and the best config (``best.yaml``)."""
    counts = ", ".join(f"{n} {state}" for state, n in results.get("trials", {}).items())
    lines = [
        f"# Search {folder.name}",
        "",
        f"{sum(results.get('trials', {}).values())} trial(s): {counts or 'none'}; "
        f"{results.get('trial_epochs', 0)} epochs in {results.get('trial_seconds', 0)} s of "
        f"trials; this run's search: {results.get('seconds', 0)} s.",
        "",
        f"Study folder: `{folder.path.resolve()}`",
        "",
    ]
    best = results.get("best")
    if not best:
        lines += ["**No trial completed**: see the errors in the trials table.", ""]
    else:
        lines += [
            f"## Best trial: {best['trial']} (valid MRR {best['valid_mrr']:.4f}"
            + (f", epoch {best['epoch']})" if best.get("epoch") is not None else ")"),
            "",
            "| parameter | value |",
            "|---|---|",
            *(f"| {k} | {_cell(v)} |" for k, v in best.get("values", {}).items()),
            "",
        ]
        test = best.get("test")
        if test:
            scalars = {
                k: v
                for k, v in test.items()
                if (k in ("mrr", "mr") or k.startswith("hits@")) and isinstance(v, int | float)
            }
            where = ", ".join(
                text
                for text, ok in (
                    (f"{test.get('triples')} triples", test.get("triples") is not None),
                    (f"checkpoint of epoch {test.get('checkpoint_epoch')}",
                     test.get("checkpoint_epoch") is not None),
                )
                if ok
            )  # fmt: skip
            lines += [
                "### Test metrics (filtered; of the best trial only, after the search"
                + (f"; {where})" if where else ")"),
                "",
                "| metric | value |",
                "|---|---|",
                *(f"| {k} | {_cell(v)} |" for k, v in scalars.items()),
                "",
            ]
    plots = results.get("plots", {})
    for what, title in (("best", "Best valid MRR so far"), ("importance", "Parameter importance")):
        path = plots.get(what)
        if path and Path(path).exists():
            uri = png_data_uri(Path(path).read_bytes())
            lines += [f"## {title}", "", f"![{title}]({uri})", ""]
        elif what == "importance":
            lines += [f"## {title}", "", "(needs at least 3 complete trials that differ)", ""]
    best_yaml = folder.file("best.yaml")
    if best and best_yaml.exists():
        lines += [
            "## Best config (`best.yaml`: `kgpipe train -c` it as it is)",
            "",
            "```yaml",
            best_yaml.read_text(encoding="utf-8").rstrip(),
            "```",
            "",
        ]
    return "\n".join(lines)
