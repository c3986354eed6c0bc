"""The `tune-kge` flow (flows/tune.py): a search on UMLS run in-process against a real Prefect
server, its artifacts read back through the client, a rerun that resumes the study; and the
deployments of prefect.yaml, whose entrypoints and default parameters must hold."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect_support import PrefectServer

REPO = Path(__file__).resolve().parents[1]

SPACE = """
training.lr: {loguniform: [0.02, 0.5]}
model.dim: {choices: [8, 16]}
"""
OVERRIDES = [
    "model.dim=16",
    "training.epochs=4",
    "training.batch_size=512",
    "evaluation.every=2",
    "evaluation.batch_size=512",
    "checkpoint.every=2",
]


def _artifacts(run_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as c:
        return list(
            c.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
        )


def _finished(study_dir: Path) -> dict[int, tuple[Any, Any]]:
    import optuna

    storage = f"sqlite:///{(study_dir / 'study.db').resolve()}"
    study = optuna.load_study(study_name=study_dir.name, storage=storage)
    return {
        t.number: (t.value, t.datetime_complete)
        for t in study.get_trials()
        if t.state.is_finished()
    }


@pytest.mark.slow
def test_tune_flow_publishes_its_trials_and_resumes(
    prefect_env: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.tune import tune_kge
    from kgpipe.config import load_config

    monkeypatch.chdir(REPO)  # config_url is relative to the flow run's working directory
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    study_dir = tmp_path / "studies" / "umls-small"
    params: dict[str, Any] = {
        "config_url": "configs/umls-complex.yaml",
        "overrides": OVERRIDES,
        "space_url": str(space),
        "workers": 2,
        "study": str(study_dir),
        "pruner": "none",
        "seed": 1,
    }
    # between the search and the winner's test the flow still holds the study: a second
    # search (a `tune --resume`) trying to start there is refused
    import tasks.tune as tune_tasks
    from kgpipe.errors import KgpipeError
    from kgpipe.runs.lease import RunLease
    from kgpipe.storage import Store

    other = RunLease(Store(str(study_dir.resolve())), ttl_s=60, holder="a resumed search")
    seen: list[str] = []
    real_summarize = tune_tasks.summarize

    def summarize(*args: Any, **kwargs: Any) -> Any:  # what summarize_study calls
        try:
            with other:
                seen.append("the study was free")
        except KgpipeError as err:
            seen.append(str(err))
        return real_summarize(*args, **kwargs)

    monkeypatch.setattr(tune_tasks, "summarize", summarize)
    state = tune_kge(**params, trials=4, return_state=True)
    assert state.is_completed(), state.message
    assert len(seen) == 1 and "a search of study umls-small" in seen[0], seen
    monkeypatch.setattr(tune_tasks, "summarize", real_summarize)
    summary = state.result()
    assert summary["study"] == str(study_dir.resolve())
    assert summary["trials"] == {"complete": 4}
    assert 0 < summary["best"]["test"]["mrr"] <= 1

    # the study folder: what the search found, and a best config that loads as it is
    results = json.loads((study_dir / "results.json").read_text())
    assert results["trials"] == {"complete": 4}
    best = load_config(str(study_dir / "best.yaml"))
    assert best.evaluation.test and best.model.dim in (8, 16)
    assert best.training.lr == pytest.approx(results["best"]["values"]["training.lr"])

    # the artifacts of the flow run: one trials table (one row per trial), progress, summary
    run_id = state.state_details.flow_run_id
    arts = _artifacts(run_id)
    tables = [a for a in arts if a.key == "kgpipe-study-umls-small-trials"]
    assert len(tables) == 1, [(a.key, a.id) for a in arts]
    rows = json.loads(tables[0].data)
    assert [r["trial"] for r in rows] == [0, 1, 2, 3]
    assert all(r["state"] == "complete" and 0 < r["valid_mrr"] <= 1 for r in rows), rows
    assert all(r["epochs"] == 4 and r["duration_s"] > 0 for r in rows), rows
    assert all({"training.lr", "model.dim"} <= set(r) for r in rows), rows
    progress = [a for a in arts if a.key == "kgpipe-study-umls-small-progress"]
    assert len(progress) == 1 and float(progress[0].data) == 100.0
    reports = [a for a in arts if a.key == "kgpipe-study-umls-small-summary"]
    assert len(reports) == 1
    md = reports[0].data
    assert md.count("data:image/png;base64,") == 1 + (study_dir / "importance.png").exists()
    assert "```yaml" in md and "Test metrics" in md and "| mrr |" in md
    assert f"## Best trial: {results['best']['trial']} " in md

    # the same flow again with a bigger budget: the 4 trials are kept, 2 are added
    before = _finished(study_dir)
    again = tune_kge(**params, trials=6, return_state=True)
    assert again.is_completed(), again.message
    after = _finished(study_dir)
    assert sorted(after) == list(range(6))
    assert {n: after[n] for n in before} == before  # not run again
    assert json.loads((study_dir / "results.json").read_text())["trials"] == {"complete": 6}
    assert sorted(p.name for p in (study_dir / "trials").iterdir()) == [
        f"trial-{n:04d}" for n in range(6)
    ]
    rows = json.loads(
        next(
            a for a in _artifacts(again.state_details.flow_run_id)
            if a.key == "kgpipe-study-umls-small-trials"
        ).data
    )  # fmt: skip
    assert [r["trial"] for r in rows] == list(range(6))

    # run again as a deployment's run whose default budget is 4 trials, with that default: the
    # study keeps its budget of 6 (a default cut a 40-trial study to 12 when it resumed)
    import flows.tune
    from kgpipe.tune.folder import open_study_folder

    monkeypatch.setattr(flows.tune, "deployment_defaults", lambda: {"trials": 4, "workers": 2})
    third = tune_kge(**params, trials=4, return_state=True)
    assert third.is_completed(), third.message
    assert open_study_folder(study_dir).settings.trials == 6


@pytest.mark.slow
def test_killed_flow_process_resumes_the_study_without_repeating_trials(
    prefect_server: PrefectServer, tmp_path: Path
) -> None:
    """The process running the tune-kge flow is killed with SIGKILL (with its cluster) once
    two trials have finished; the flow run again on the same study keeps the finished trials
    as they were, continues the interrupted ones and adds only the rest."""
    import os
    import signal
    import subprocess
    import sys
    import time

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    study_dir = tmp_path / "studies" / "killed"
    overrides = [o for o in OVERRIDES if not o.startswith("training.epochs")]
    params: dict[str, Any] = {
        "config_url": "configs/umls-complex.yaml",
        "overrides": [*overrides, "training.epochs=8"],
        "space_url": str(space),
        "workers": 2,
        "study": str(study_dir),
        "pruner": "none",
        "trials": 6,
    }
    code = f"from flows.tune import tune_kge\ntune_kge(**{params!r})\n"
    log = tmp_path / "flow.log"  # a file, not a pipe nobody reads until the end: it can fill
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=prefect_server.client_env(),
            start_new_session=True,  # its process group: the flow and its Dask cluster
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def finished() -> dict[int, tuple[Any, Any]]:
        try:
            return _finished(study_dir)
        except Exception:  # not created yet
            return {}

    from study_support import committed_epochs, metrics_lines

    trials = study_dir / "trials"

    def committed() -> dict[int, int]:  # an unfinished trial -> its last committed epoch
        return committed_epochs(trials, set(finished()))

    try:  # killed with two trials done and one interrupted after a commit
        deadline = time.monotonic() + 240
        while (len(finished()) < 2 or not committed()) and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = finished()
    assert 2 <= len(before) < 6, log.read_text(errors="replace")[-2000:]
    commits = committed()
    assert commits, log.read_text(errors="replace")[-2000:]
    trained = {n: metrics_lines(trials, n)[:epoch] for n, epoch in commits.items()}

    again = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=prefect_server.client_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    after = _finished(study_dir)
    assert sorted(after) == list(range(6))  # 6 in all: none repeated, none lost
    assert {n: after[n] for n in before} == before  # the finished ones kept as they were
    for n in range(6):  # a continued trial records each epoch once
        epochs = [json.loads(line)["epoch"] for line in metrics_lines(trials, n)]
        assert epochs == sorted(set(epochs)) and epochs[-1] == 8, (n, epochs)
    for n, lines in trained.items():  # continued from its commit, not trained again (the
        assert metrics_lines(trials, n)[: len(lines)] == lines, n  # timings would differ)
    assert json.loads((study_dir / "results.json").read_text())["trials"] == {"complete": 6}


@pytest.mark.slow
def test_bad_search_parameters_fail_before_any_work(
    prefect_env: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.tune import tune_kge

    monkeypatch.chdir(REPO)
    root = tmp_path / "studies"
    common: dict[str, Any] = {"config_url": "configs/umls-complex.yaml", "root": str(root)}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"space": {"training.lrr": {"uniform": [0.1, 1]}}}, "did you mean training.lr?"),
        ({"space": {"model.dim": {"choices": [8]}}, "space_url": "x.yaml"}, "not both"),
        ({"space_url": str(tmp_path / "nope.yaml")}, "search space file not found"),
        ({"timeout": "soon"}, "is not a duration"),
        ({"trials": 0}, "trials"),
        ({"overrides": ["training.epochs=-1"]}, "training.epochs"),
    ]
    for extra, message in cases:
        state = tune_kge(**common, **extra, return_state=True)
        assert state.is_failed(), extra
        assert message in str(state.message), (extra, state.message)
        assert "\n" not in str(state.message), state.message
    assert not root.exists() or not any(root.iterdir())  # nothing written


def test_study_location() -> None:
    from flows.tune import study_location
    from kgpipe.errors import ConfigError

    assert study_location(None, "./studies") == ("./studies", None)
    assert study_location("umls", "./studies") == ("./studies", "umls")
    assert study_location("./umls", "./studies") == (".", "umls")
    assert study_location("/data/studies/umls/", "./studies") == ("/data/studies", "umls")
    assert study_location("file:///s/umls", "x") == ("/s", "umls")
    with pytest.raises(ConfigError):
        study_location("studies/..", "x")


def test_trials_table_rows_have_every_column() -> None:
    import optuna

    from tasks.tune import table_rows

    study = optuna.create_study(direction="maximize")
    for i, values in enumerate([{"training.lr": 0.1}, {"training.lr": 0.2, "model.dim": 8}]):
        trial = study.ask()
        trial.set_user_attr("values", values)
        trial.set_user_attr("epochs", 4)
        trial.set_user_attr("seconds", 1.5)
        study.tell(trial, 0.5 + i / 10)
    failed = study.ask()
    failed.set_user_attr("values", {"training.lr": 0.3})
    failed.set_user_attr("error", "boom\nline 2")
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    rows = table_rows(study)
    assert list(rows[0]) == [
        "trial", "state", "valid_mrr", "duration_s", "epochs", "training.lr", "model.dim", "error",
    ]  # fmt: skip
    assert [r["state"] for r in rows] == ["complete", "complete", "fail"]
    assert rows[0]["model.dim"] is None and rows[1]["model.dim"] == 8
    assert rows[2]["error"] == "boom" and rows[0]["error"] is None


def _deployments() -> list[dict[str, Any]]:
    return list(yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"])


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_each_deployment_entrypoint_is_a_flow_taking_its_defaults(
    deployment: dict[str, Any],
) -> None:
    from prefect import Flow

    path, _, name = deployment["entrypoint"].partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    flow = getattr(module, name)
    assert isinstance(flow, Flow)
    flow.validate_parameters(deployment.get("parameters") or {})  # raises on a bad default


def test_the_tune_deployment_defaults_make_a_valid_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.params import resolve_config
    from flows.tune import flow_settings, flow_space
    from kgpipe.tune import default_space
    from kgpipe.tune.space_check import check_space

    monkeypatch.chdir(REPO)
    params = next(d for d in _deployments() if d["name"] == "tune")["parameters"]
    base = resolve_config(None, params["config_url"], params.get("overrides"))
    assert base.evaluation.every and base.training.epochs <= 30  # short trials
    space = flow_space(params.get("space_url"), params.get("space")) or default_space(
        base.model.name
    )
    check_space(space, base)
    settings = flow_settings(
        base, study=None, root=str(tmp_path), trials=params.get("trials"), timeout=None,
        workers=params.get("workers", 1), pruner="median", seed=0,
    )  # fmt: skip
    assert settings.trials is not None and settings.trials <= 20


def test_a_deployments_default_overrides_are_not_applied_to_a_config_of_the_run() -> None:
    """The tune deployment's default overrides (20-epoch trials) shape its default config: a
    run given its own config_url (or config) took them too, and trained 20-epoch trials
    whatever its config said."""
    from flows.tune import run_overrides
    from kgpipe.config import parse_config

    defaults = {"config_url": "configs/umls-complex.yaml", "overrides": ["training.epochs=20"]}
    said: list[str] = []
    own = run_overrides(None, "my-graph.yaml", ["training.epochs=20"], defaults, log=said.append)
    assert own is None and said == [
        "not applying the deployment's default overrides ['training.epochs=20'] to this run's "
        "config"
    ]
    config = parse_config({"data": {"dataset": "umls"}})
    default_url = "configs/umls-complex.yaml"
    assert run_overrides(config, default_url, ["training.epochs=20"], defaults) is None
    # the default config takes them; overrides given for the run are the run's
    assert run_overrides(None, default_url, ["training.epochs=20"], defaults) == [
        "training.epochs=20"
    ]
    assert run_overrides(None, "my.yaml", ["training.epochs=5"], defaults) == ["training.epochs=5"]
    assert run_overrides(None, "my.yaml", ["training.epochs=20"], {}) == ["training.epochs=20"]


def test_the_flow_takes_the_settings_the_cli_takes(tmp_path: Path) -> None:
    """Storage (a database URL), the median rule's warm-up, the cluster, threads per trial and
    keep_trials reach the search from the flow's parameters as from the CLI's options; bad
    ones are one-line ConfigErrors."""
    from flows.tune import flow_settings
    from kgpipe.config.io import parse_config
    from kgpipe.errors import ConfigError

    base = parse_config({"data": {"dataset": "umls"}, "evaluation": {"every": 2}})
    common: dict[str, Any] = {
        "study": "s", "root": str(tmp_path), "trials": 4, "timeout": None, "workers": 2,
        "seed": 0,
    }  # fmt: skip
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    s = flow_settings(
        base, pruner="median", storage=url, prune_warmup=0, cluster="tcp://127.0.0.1:8786",
        threads_per_worker=1, keep_trials="best", **common,
    )  # fmt: skip
    assert (s.storage, s.prune_warmup, s.cluster) == (url, 0, "tcp://127.0.0.1:8786")
    assert (s.threads_per_worker, s.keep_trials) == (1, "best")
    d = flow_settings(base, pruner="median", **common)  # the defaults: the library's
    assert (d.storage, d.prune_warmup, d.cluster, d.threads_per_worker) == (None, 1, "local", None)
    with pytest.raises(ConfigError, match="prune_warmup: for the median rule"):
        flow_settings(base, pruner="asha", prune_warmup=0, **common)
    with pytest.raises(ConfigError, match="cluster: 'nowhere'"):
        flow_settings(base, pruner="median", cluster="nowhere", **common)


def test_a_study_of_a_base_that_does_not_validate_resumes_without_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow's study task creates a study from a base with ``evaluation.every: 0`` (its
    trials validate every ``ceil(epochs / 5)`` epochs, kept in the study) and, run again with
    the same base, resumes it without saying the base differs from the study's."""
    import logging

    import tasks.tune as task_module
    from kgpipe.config import load_config
    from kgpipe.tune import SearchSpace, TuneSettings

    records: list[logging.LogRecord] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("test-study-task")
    logger.addHandler(Recorder())
    logger.setLevel(logging.INFO)
    monkeypatch.setattr(task_module, "get_run_logger", lambda: logger)
    base = load_config(
        str(REPO / "configs" / "umls-complex.yaml"),
        ["evaluation.every=0", "training.epochs=10", f"run.root={tmp_path / 'runs'}"],
    )
    space = SearchSpace.from_yaml(SPACE)
    settings = TuneSettings(root=str(tmp_path / "studies"), name="v", trials=2)
    first = task_module.open_or_prepare_study.fn(base, space, settings)
    assert first.base.evaluation.every == 2
    again = task_module.open_or_prepare_study.fn(base, space, settings)
    assert again.path == first.path and again.base == first.base
    said = [r.getMessage() for r in records]
    assert "trials of 10 epochs validated every 2 epochs" in said[0], said
    assert said[1].startswith("resuming study"), said
    assert not [r for r in records if r.levelno >= logging.WARNING], said
