"""Experiment tracking in MLflow (``tracking.backend: mlflow``), against a real ``mlflow server``
on 127.0.0.1: params, each epoch logged once (``step=epoch``) also across resumes and replayed
epochs, test metrics, the report and the curve, nested trials of a search, and one-line errors
for a missing package or a server that does not answer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow  # noqa: F401  (a dev dependency: missing, the suite fails, not skips these)
import pytest
from cli_support import run_cli
from distributed import Client, LocalCluster

from kgpipe.config import RunConfig, config_hash, parse_config, training_differences
from kgpipe.errors import ConfigError, KgpipeError
from kgpipe.tracking import (
    TRACKING,
    RunTracker,
    TrackingError,
    check_tracking,
    log_finished_run,
    log_parent_result,
    start_parent_run,
)

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real tracking server for this module: SQLite runs, artifacts served from a folder,
    one worker, no job runner; killed (its whole process group) at teardown."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
        "--artifacts-destination", str(root / "artifacts"),
    ]  # fmt: skip
    # no job runner: it starts a dozen huey consumers the tests do not need
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(root / "server.log", "wb") as out:
        proc = subprocess.Popen(
            command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (root / "server.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"mlflow server did not start (exit {proc.poll()}):\n{log}")
            time.sleep(0.2)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _steps(uri: str, run_id: str, key: str) -> list[int]:
    return [int(m.step) for m in _client(uri).get_metric_history(run_id, key)]


def _values(uri: str, run_id: str, key: str) -> dict[int, float]:
    return {int(m.step): m.value for m in _client(uri).get_metric_history(run_id, key)}


def _config(root: Path, name: str, uri: str, **training: Any) -> RunConfig:
    return parse_config(
        {
            "run": {"root": str(root), "name": name},
            "data": {"dataset": "umls"},
            "model": {"name": "distmult", "dim": 16},
            "training": {"epochs": 4, "batch_size": 512, **training},
            "evaluation": {"every": 2},
            "tracking": {"backend": "mlflow", "uri": uri, "tags": {"suite": "kgpipe"}},
        }
    )


# -- the config ---------------------------------------------------------------------------------


def test_the_tracking_section_leaves_the_config_hash_alone() -> None:
    base = RunConfig.model_validate({"data": {"dataset": "umls"}})
    tracked = RunConfig.model_validate(
        {
            "data": {"dataset": "umls"},
            "tracking": {"backend": "mlflow", "uri": "http://x:1", "experiment": "e", "tags": {"a": 1}},
        }
    )  # fmt: skip
    # the known hash of this config (tests/test_training.py): every existing run keeps its hash
    assert config_hash(base) == "bc668d8ead534ecf4fdbfb94465fc2a89efe3ec934952c3f6801c241610c32c6"
    assert config_hash(tracked) == config_hash(base)
    assert training_differences(base, tracked) == []  # a resume may turn tracking on or off
    assert tracked.tracking.tags == {"a": "1"}


def test_mlflow_needs_a_tracking_uri_with_its_scheme() -> None:
    data = {"data": {"dataset": "umls"}, "tracking": {"backend": "mlflow"}}
    with pytest.raises(ConfigError, match=r"tracking.uri: .*required with tracking.backend=mlflow"):
        parse_config(data)
    with pytest.raises(ConfigError, match="not a tracking URI"):
        parse_config({**data, "tracking": {"backend": "mlflow", "uri": "localhost:5000"}})
    check_tracking(parse_config({"data": {"dataset": "umls"}}).tracking)  # none: nothing to check


def test_a_missing_mlflow_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # `import` raises ImportError
    config = _config(Path("/nonexistent"), "x", "http://127.0.0.1:1")
    with pytest.raises(ConfigError) as err:
        check_tracking(config.tracking)
    assert str(err.value) == (
        "tracking.backend=mlflow needs the mlflow package: pip install 'kgpipe[mlflow]'"
    )


def test_an_unreachable_server_fails_fast_in_one_line_before_anything_is_written(
    tmp_path: Path,
) -> None:
    from kgpipe.pipeline import train

    config = _config(tmp_path, "down", f"http://127.0.0.1:{_free_port()}")  # nothing listens
    t0 = time.perf_counter()
    with pytest.raises(TrackingError) as err:
        train(config)
    seconds = time.perf_counter() - t0
    message = str(err.value)
    assert "\n" not in message and seconds < 10, (message, seconds)
    assert "cannot reach the MLflow tracking server (connection refused)" in message
    assert not (tmp_path / "down").exists()


def test_a_store_mlflow_will_not_open_is_one_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow 3 refuses file:// stores (the URI the docs used to suggest) unless told to: that
    was MLflow's traceback; it is one line naming the way out. A sqlite:/// store works."""
    from kgpipe.pipeline import train

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    config = _config(tmp_path, "files", f"file://{tmp_path}/mlruns")
    with pytest.raises(TrackingError) as err:
        train(config)
    message = str(err.value)
    assert "\n" not in message and "MLFLOW_ALLOW_FILE_STORE=true" in message, message
    assert "sqlite:///" in message and not (tmp_path / "files").exists()
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts in ./mlruns
    check_tracking(_config(tmp_path, "db", f"sqlite:///{tmp_path}/mlflow.db").tracking)


# -- a run, resumed -----------------------------------------------------------------------------


def test_a_run_is_one_mlflow_run_across_resumes_and_logs_every_epoch_once(
    mlflow_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kgpipe train --no-prefect`: params, one value per epoch, the test metrics, the report
    and the curve; extended by --resume, the same MLflow run goes on; epochs trained again
    after a resume from an earlier checkpoint are not logged twice."""
    resolved = _config(tmp_path / "runs", "r", mlflow_uri)
    config = tmp_path / "c.yaml"
    config.write_text(resolved.model_dump_json())
    argv = ["train", "-c", str(config), "--no-prefect", "-q"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, out + err
    folder = tmp_path / "runs" / "r"
    state = json.loads((folder / TRACKING).read_text())
    run_id = state["run_id"]
    run = _client(mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert _client(mlflow_uri).get_experiment(run.info.experiment_id).name == "umls"
    params = run.data.params
    assert params["model.name"] == "distmult" and params["training.lr"] == str(resolved.training.lr)
    assert params["model.dim"] == "16" and "tracking.uri" not in params
    assert run.data.tags["suite"] == "kgpipe" and run.data.tags["kgpipe.run"] == str(folder)
    assert _steps(mlflow_uri, run_id, "loss") == [1, 2, 3, 4]
    assert _steps(mlflow_uri, run_id, "valid_mrr") == [2, 4]
    assert _steps(mlflow_uri, run_id, "valid_hits_at_10") == [2, 4]
    assert _steps(mlflow_uri, run_id, "lr") == [1, 2, 3, 4]
    results = json.loads((folder / "results.json").read_text())
    assert _values(mlflow_uri, run_id, "test_mrr") == {4: pytest.approx(results["mrr"])}
    assert _steps(mlflow_uri, run_id, "test_hits_at_10") == [4]
    artifacts = {a.path for a in _client(mlflow_uri).list_artifacts(run_id)}
    assert {"report.md", "curves.png", "config.yaml", "results.json"} <= artifacts
    first = _values(mlflow_uri, run_id, "loss")

    # extended to 6 epochs: the same MLflow run, epochs 5 and 6 added
    code, out, err = run_cli([*argv, "--resume", "--set", "training.epochs=6"], capsys)
    assert code == 0, out + err
    assert json.loads((folder / TRACKING).read_text())["run_id"] == run_id
    assert _steps(mlflow_uri, run_id, "loss") == [1, 2, 3, 4, 5, 6]
    assert _steps(mlflow_uri, run_id, "valid_mrr") == [2, 4, 6]
    assert _steps(mlflow_uri, run_id, "test_mrr") == [4, 6]
    assert _client(mlflow_uri).get_run(run_id).info.status == "FINISHED"
    second = _values(mlflow_uri, run_id, "loss")
    assert {e: second[e] for e in first} == first

    # resumed from the checkpoint of epoch 4 (those of 5 and 6 lost): 5 and 6 train again,
    # and MLflow keeps one value each -- the first
    for epoch in (5, 6):
        shutil.rmtree(folder / "checkpoints" / f"epoch-{epoch:06d}")
    code, out, err = run_cli([*argv, "--resume", "--set", "training.epochs=6"], capsys)
    assert code == 0, out + err
    assert _steps(mlflow_uri, run_id, "loss") == [1, 2, 3, 4, 5, 6]
    assert _steps(mlflow_uri, run_id, "valid_mrr") == [2, 4, 6]
    assert _steps(mlflow_uri, run_id, "test_mrr") == [4, 6]
    assert _values(mlflow_uri, run_id, "loss") == second
    runs = _client(mlflow_uri).search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs if r.info.run_name == "r"] == [run_id]


@pytest.mark.slow
def test_kgpipe_train_through_prefect_tracks_the_run(mlflow_uri: str, tmp_path: Path) -> None:
    """The default CLI path: the Prefect flow is the driver that logs; the report and curve
    are the ones the flow published in the run folder."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [
            sys.executable, "-m", "kgpipe.cli", "train", "-c", "configs/umls-complex.yaml",
            "--set", "training.epochs=4", "--set", "evaluation.every=2", "--set", "model.dim=16",
            "--set", f"run.root={tmp_path / 'runs'}", "--set", "run.name=viaprefect",
            "--set", "tracking.backend=mlflow", "--set", f"tracking.uri={mlflow_uri}",
            "--set", "tracking.experiment=prefect-path",
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "View run" not in text, text
    assert "tracking in MLflow: " in text
    folder = tmp_path / "runs" / "viaprefect"
    run_id = json.loads((folder / TRACKING).read_text())["run_id"]
    run = _client(mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert _client(mlflow_uri).get_experiment(run.info.experiment_id).name == "prefect-path"
    assert _steps(mlflow_uri, run_id, "loss") == [1, 2, 3, 4]
    assert _steps(mlflow_uri, run_id, "valid_mrr") == [2, 4]
    assert _steps(mlflow_uri, run_id, "test_mrr") == [4]
    report = Path(_client(mlflow_uri).download_artifacts(run_id, "report.md", str(tmp_path)))
    assert report.read_text() == (folder / "report.md").read_text()
    assert "curves.png" in {a.path for a in _client(mlflow_uri).list_artifacts(run_id)}


# -- a search: a parent run, trials logged after the fact -----------------------------------------


def _history(epochs: range) -> list[dict[str, Any]]:
    return [
        {"epoch": e, "loss": 1.0 / e, "lr": 0.1, "seconds": 0.5, "triples": 100}
        | ({"valid_mrr": 0.1 * e, "valid_hits@10": 0.2 * e} if e % 2 == 0 else {})
        for e in epochs
    ]


def test_a_trial_is_logged_after_the_fact_nested_under_its_study(
    mlflow_uri: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, "trial-0", mlflow_uri)
    tracking = config.tracking.model_copy(update={"experiment": "search"})
    parent = start_parent_run(tracking, name="study", params={"sampler": "tpe", "n_trials": 2})
    assert start_parent_run(tracking, name="study", params={"more": 1}, run_id=parent) == parent

    trial = log_finished_run(
        tracking, name="trial-0", parent_run_id=parent, config=config, history=_history(range(1, 4)),
        params={"training.lr": 0.05}, metrics={"valid_mrr": 0.2}, status="KILLED",
        tags={"optuna.trial": "0"},
    )  # fmt: skip
    client = _client(mlflow_uri)
    run = client.get_run(trial)
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["optuna.trial"] == "0" and run.info.status == "KILLED"
    assert run.info.experiment_id == client.get_run(parent).info.experiment_id
    assert run.data.params["training.lr"] == "0.05"  # the sampled value, not the config's
    assert _steps(mlflow_uri, trial, "loss") == [1, 2, 3]
    assert _steps(mlflow_uri, trial, "valid_hits_at_10") == [2]
    assert _steps(mlflow_uri, trial, "valid_mrr") == [2, 3]  # the epoch, then the final value

    # the same trial, continued: only what it lacks is added
    again = log_finished_run(
        tracking, name="trial-0", parent_run_id=parent, config=config, history=_history(range(1, 6)),
        metrics={"valid_mrr": 0.4}, run_id=trial,
    )  # fmt: skip
    assert again == trial and client.get_run(trial).info.status == "FINISHED"
    assert _steps(mlflow_uri, trial, "loss") == [1, 2, 3, 4, 5]
    assert _steps(mlflow_uri, trial, "valid_mrr") == [2, 3, 4, 5]

    summary = tmp_path / "study.md"
    summary.write_text("# study\n")
    log_parent_result(tracking, parent, metrics={"best_valid_mrr": 0.4}, artifacts=[str(summary)])
    study = client.get_run(parent)
    assert study.info.status == "FINISHED" and study.data.metrics["best_valid_mrr"] == 0.4
    assert study.data.params["sampler"] == "tpe" and study.data.params["more"] == "1"
    assert [a.path for a in client.list_artifacts(parent)] == ["study.md"]
    with pytest.raises(TrackingError, match="no such file"):
        log_parent_result(tracking, parent, metrics={}, artifacts=[str(tmp_path / "nope")])


# -- MLflow faults during training ------------------------------------------------------------------


class _Flaky:
    """An MLflow client whose first batch of epochs fails (and was stored all the same)."""

    def __init__(self) -> None:
        self.logged: list[int] = []
        self.fail = True

    def log_epochs(self, run_id: str, rows: Any, *, after: int) -> int:
        epochs = [int(r["epoch"]) for r in rows if int(r["epoch"]) > after]
        self.logged += epochs
        if self.fail:
            self.fail = False
            raise TrackingError("MLflow at http://x: log_batch failed: the connection failed")
        return max(epochs, default=after)

    def last_epoch(self, run_id: str) -> int:
        return max(self.logged, default=0)


def test_mlflow_faults_during_training_are_warnings_and_log_nothing_twice() -> None:
    from kgpipe.training.records import EpochStats

    class View:
        def __init__(self) -> None:
            self.history: list[EpochStats] = []

    config = _config(Path("/tmp"), "x", "http://x:1")
    run = type("Run", (), {"config": config, "url": "/tmp/x"})()
    warnings: list[str] = []
    tracker = RunTracker(run, warn=warnings.append, retry_after_s=0.0)
    tracker.mlflow, tracker.run_id = _Flaky(), "id"  # type: ignore[assignment]
    view = View()
    for epoch in (1, 2, 3):
        stats = EpochStats(epoch, 1.0, 10, 0.1, 0.1, 1)
        tracker.on_epoch_end(view, stats)  # type: ignore[arg-type]
        view.history.append(stats)
    assert len(warnings) == 1 and "training goes on" in warnings[0]
    assert tracker.mlflow.logged == [1, 2, 3] and tracker.last_epoch == 3  # type: ignore[union-attr]


class _Silent:
    """An MLflow client whose server has stopped answering: every call times out."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise TrackingError("MLflow at http://x: the server did not answer in time")

        return call


def test_a_silent_server_is_tried_ever_less_often_and_not_again_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each try at a server that stopped answering costs a timeout and retries (~48 s) in
    the training loop, and the end of the run made three more: the tries double their
    distance (60 s, 120 s, ...), and the end makes none after a failed one."""
    from kgpipe.training.records import EpochStats

    config = _config(Path("/tmp"), "x", "http://x:1")
    run = type("Run", (), {"config": config, "url": "/tmp/x", "store": None})()
    warnings: list[str] = []
    tracker = RunTracker(run, warn=warnings.append, retry_after_s=60.0)
    tracker.mlflow, tracker.run_id = _Silent(), "id"  # type: ignore[assignment]
    monkeypatch.setattr(tracker, "_save", lambda: None)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    view = type("View", (), {"history": []})()
    for epoch in range(1, 8):  # an epoch every 50 s: tries at 50, 150, 300 (60, 120, 240 s on)
        clock[0] += 50.0
        tracker.on_epoch_end(view, EpochStats(epoch, 1.0, 10, 0.1, 0.1, 1))  # type: ignore[arg-type]
    assert [w.split("next try in ")[1] for w in warnings] == ["60 s)", "120 s)", "240 s)"]
    before = len(tracker.mlflow.calls)  # type: ignore[union-attr]
    tracker.finish({"mrr": 0.5}, [{"epoch": 7, "loss": 1.0}])
    assert len(tracker.mlflow.calls) == before + 1  # type: ignore[union-attr]  # one epoch log
    assert "was left as it is" in warnings[-1] and tracker.ended


def test_errors_are_kgpipe_errors() -> None:
    assert issubclass(TrackingError, KgpipeError)  # the CLI prints them as one line


@pytest.mark.slow
def test_a_search_is_a_parent_run_with_one_nested_run_per_trial(
    mlflow_uri: str, tmp_path: Path
) -> None:
    """kgpipe tune with tracking: the study's run holds its findings, each trial is one nested
    run with its epochs (step=epoch) and sampled values; a resumed search continues the same
    parent and logs no trial twice."""
    from kgpipe.tune import (
        SearchSpace,
        TuneSettings,
        open_study_folder,
        prepare_study,
        run_and_summarize,
    )

    base = _config(tmp_path, "base", mlflow_uri, epochs=4)
    base = base.model_copy(
        update={
            "evaluation": base.evaluation.model_copy(update={"every": 2}),
            "tracking": base.tracking.model_copy(update={"experiment": "search-test"}),
        }
    )
    space = SearchSpace.from_yaml("training.lr: {loguniform: [1.0e-3, 0.1]}")
    # the trials run on a cluster of our own, so that its worker can be asked afterwards
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True) as cluster:
        settings = TuneSettings(
            root=str(tmp_path / "studies"), name="s", trials=2, workers=1,
            cluster=cluster.scheduler_address,
        )  # fmt: skip
        folder = prepare_study(base, space, settings)
        run_and_summarize(folder)
        run_and_summarize(open_study_folder(folder.path).with_settings(trials=3))
        with Client(cluster) as dask:  # the driver logs: a worker ran trials, never MLflow
            loaded = dask.run(lambda: ("kgpipe.tune.trial" in sys.modules, "mlflow" in sys.modules))
            assert list(loaded.values()) == [(True, False)]

    client = _client(mlflow_uri)
    exp = client.get_experiment_by_name("search-test")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kgpipe.kind") == "study"]
    assert len(parents) == 1  # continued on resume, not a second one
    parent = parents[0]
    assert parent.data.metrics["best_valid_mrr"] > 0
    assert "best_test_mrr" in parent.data.metrics
    # the resumed search's findings, not the first one's: each summary at the step of the
    # trials it had, so the latest is shown and none is logged twice
    assert sum(v for k, v in parent.data.metrics.items() if k.startswith("trials_")) == 3
    assert sorted(_steps(mlflow_uri, parent.info.run_id, "best_valid_mrr")) == [2, 3]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["kgpipe.trial"] for r in children) == ["0", "1", "2"]
    for child in children:
        steps = _steps(mlflow_uri, child.info.run_id, "loss")
        assert steps == sorted(set(steps)) and steps[-1] <= 4  # every epoch once
        assert "training.lr" in child.data.params
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert names == {"config.yaml", "curves.png"}  # the trial's own config and curve
    # the winner, tested by the study, has its test metrics on its own run too
    results = json.loads((folder.path / "results.json").read_text())
    winner = next(
        r for r in children if r.data.tags["kgpipe.trial"] == str(results["best"]["trial"])
    )
    assert winner.data.metrics["test_mrr"] == pytest.approx(results["best"]["test"]["mrr"])
    assert parent.data.metrics["best_test_mrr"] == pytest.approx(results["best"]["test"]["mrr"])
    assert parent.data.metrics["best_trial"] == results["best"]["trial"]
    # the only other tested trial is the first search's winner (2 trials), if another one
    tested = {r.info.run_id for r in children if "test_mrr" in r.data.metrics}
    assert winner.info.run_id in tested and len(tested) <= 2
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.json", "best.yaml", "trials.csv"} <= artifacts


def test_a_search_that_stops_on_failures_ends_its_parent_run_failed(
    mlflow_uri: str, tmp_path: Path
) -> None:
    """A search stopped by trials that all fail does not leave its study's MLflow run
    RUNNING: it ends FAILED, its failed trials logged under it."""
    from kgpipe.errors import SearchStopped
    from kgpipe.tune import SearchSpace, TuneSettings, prepare_study, run_and_summarize

    tree = _config(tmp_path, "base", mlflow_uri).model_dump(mode="json")
    missing = tmp_path / "missing.tsv"
    missing.write_text("a\tr\tb\nb\tr\tc\n")  # there as the study starts (it reads it once)
    tree["data"] = {"train": str(missing)}
    tree["tracking"]["experiment"] = "stopped-search"
    base = parse_config(tree)
    space = SearchSpace.from_yaml("training.lr: {loguniform: [1.0e-3, 0.1]}")
    settings = TuneSettings(
        root=str(tmp_path / "studies"), name="s", trials=10, workers=1, max_failures=2
    )
    study = prepare_study(base, space, settings)
    missing.unlink()  # then gone: no trial can read it
    with pytest.raises(SearchStopped):
        run_and_summarize(study)
    client = _client(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("stopped-search").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("kgpipe.kind") == "study")
    assert parent.info.status == "FAILED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.status for r in children) == ["FAILED", "FAILED"]


def test_a_refused_config_is_a_failed_trial_run_with_its_values(
    mlflow_uri: str, tmp_path: Path
) -> None:
    """A sampled combination the config refuses never trains, but shows in MLflow: a FAILED
    run under the study's, with the sampled values and the refusal; a resume logs it once."""
    from kgpipe.tune import SearchSpace, TuneSettings, prepare_study
    from kgpipe.tune.study import run_study

    base = _config(tmp_path, "base", mlflow_uri)
    base = base.model_copy(
        update={"tracking": base.tracking.model_copy(update={"experiment": "refused"})}
    )
    # 1vsall needs cross_entropy or bce: every sample is refused, no trial trains
    space = SearchSpace.from_yaml(
        "training.mode: {choices: [1vsall]}\ntraining.loss: {choices: [softplus]}\n"
        "training.lr: {loguniform: [1.0e-3, 0.1]}\n"
    )
    settings = TuneSettings(root=str(tmp_path / "studies"), name="s", trials=2, workers=1)
    folder = prepare_study(base, space, settings)
    run_study(folder)
    # logged again with its kept run id (a driver that died after logging, before telling
    # Optuna): the same run, nothing new
    from kgpipe.tracking import log_refused_trial
    from kgpipe.tune.study import load_optuna_study
    from kgpipe.tune.track import PARENT

    first = load_optuna_study(folder).get_trials()[0]
    again = log_refused_trial(
        base.tracking, name="again", parent_run_id=load_optuna_study(folder).user_attrs[PARENT],
        params={}, error="again", tags={}, run_id=first.user_attrs[PARENT],
    )  # fmt: skip
    assert again == first.user_attrs[PARENT]
    client = _client(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("refused").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("kgpipe.kind") == "study")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["kgpipe.trial"] for r in children) == ["0", "1"]
    for child in children:
        assert child.info.status == "FAILED"
        assert child.data.tags["kgpipe.trial_state"] == "fail"
        assert "needs training.loss" in child.data.tags["kgpipe.error"]
        assert child.data.params["training.loss"] == "softplus"
        assert float(child.data.params["training.lr"]) > 0


def test_a_search_logs_its_database_url_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """results.json masked a study database's password; the search's MLflow params did not."""
    from types import SimpleNamespace

    import kgpipe.tracking
    from kgpipe.tune.track import StudyTracker

    logged: dict[str, Any] = {}
    monkeypatch.setattr(kgpipe.tracking, "check_tracking", lambda tracking: None)
    monkeypatch.setattr(
        kgpipe.tracking, "start_parent_run", lambda tracking, **kw: logged.update(kw) or "p1"
    )
    settings = SimpleNamespace(
        model_dump=lambda mode: {"storage": "postgresql://optuna:S3cretPw@db:5432/optuna"}
    )
    folder = SimpleNamespace(
        base=_config(Path("/nonexistent"), "x", "http://127.0.0.1:1"), settings=settings,
        space=SimpleNamespace(describe=lambda: ["lr"]), name="s",
    )  # fmt: skip
    study = SimpleNamespace(user_attrs={}, set_user_attr=lambda k, v: None)
    assert StudyTracker.open(folder, study, print) is not None  # type: ignore[arg-type]
    assert logged["params"]["tune.storage"] == "postgresql://optuna:***@db:5432/optuna"


def test_a_password_in_the_tracking_uri_is_masked_in_what_is_written() -> None:
    """config.yaml (in the run folder, and as the MLflow run's artifact) kept a password given
    in tracking.uri; the config in memory keeps it (the driver logs with it)."""
    from kgpipe.config import config_to_yaml
    from kgpipe.tracking.client import shown_uri

    uri = "https://alice:hunter2@mlflow.example.com:8443/x"
    config = parse_config({"data": {"dataset": "umls"},
                           "tracking": {"backend": "mlflow", "uri": uri}})  # fmt: skip
    written = config_to_yaml(config)
    assert (
        "hunter2" not in written and "uri: https://alice:***@mlflow.example.com:8443/x" in written
    )
    assert config.tracking.uri == uri and shown_uri("http://h:5000") == "http://h:5000"


def test_a_server_behind_a_proxy_is_not_probed_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's client sends its requests through HTTP(S)_PROXY; the direct TCP probe failed
    every run on a network that reaches the server only through the proxy."""
    from kgpipe.tracking.client import _probe

    uri = "http://mlflow.corp.invalid:5000"
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")
    _probe(uri)  # no error: the proxy is the way there
    monkeypatch.delenv("http_proxy")
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    with pytest.raises(TrackingError, match="unknown host"):
        _probe(uri)


def test_an_interrupted_run_waits_for_a_silent_server_at_most_5_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ctrl-C during a tracked run marks the MLflow run KILLED on the way out; a server that
    stopped answering (here a socket that listens and never replies) held the exit for
    MLflow's timeout and retries (~45 s). It now waits at most 5 s, as a search does."""
    import socket

    from kgpipe.tracking import connect, track_run

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        config = _config(tmp_path, "x", uri)
        run = type("Run", (), {"config": config, "url": str(tmp_path / "x"), "store": None})()

        def start(self: RunTracker) -> str:  # as if the server answered until now
            self.mlflow, self.run_id = connect(config.tracking), "0123abcd"
            return "0123abcd"

        monkeypatch.setattr(RunTracker, "start", start)
        monkeypatch.setattr(RunTracker, "_save", lambda self: None)
        warnings: list[str] = []
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt), track_run(run, warn=warnings.append):  # type: ignore[arg-type]
            raise KeyboardInterrupt
        assert time.monotonic() - t0 < 9.0
        assert warnings == ["the MLflow run 0123abcd was not marked KILLED: no answer in 5 s"], (
            warnings
        )
    finally:
        silent.close()
