"""The Prefect pipeline against a real `prefect server` on 127.0.0.1: deployments from
prefect.yaml run by a process worker, artifacts, the UI (headless Chromium), retraining."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from prefect_support import PrefectServer, find_chromium, render_page
from safetensors.torch import load as st_load
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _artifacts(run_id: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as c:
        return list(
            c.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
        )


def _artifacts_with_key(key: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as c:
        return list(
            c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        )


@pytest.mark.slow
def test_deployment_run_on_a_real_server(prefect_env: PrefectServer, tmp_path: Path) -> None:
    server = prefect_env
    env = server.client_env()  # the server's address: nothing of kgpipe's in the environment
    for cmd in (["work-pool", "create", "kgpipe-process", "--type", "process"],
                ["--no-prompt", "deploy", "--all"]):  # fmt: skip
        done = subprocess.run(
            [str(BIN / "prefect"), *cmd], cwd=REPO, env=env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    # it looks for scheduled runs every second (Prefect's default: every 10 s)
    worker_env = {**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", "kgpipe-process"],
        cwd=REPO, env=worker_env, stdout=worker_log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        params = {
            "resume": False,
            "config": {
                "run": {"root": str(tmp_path / "runs"), "name": "deployed", "seed": 0},
                "data": {"dataset": "umls"},
                "model": {"name": "complex", "dim": 64, "reciprocal": True},
                "training": {"epochs": 6, "mode": "1vsall", "loss": "cross_entropy",
                             "optimizer": "adagrad", "lr": 0.1, "batch_size": 256},
                "evaluation": {"every": 3},
            },
        }  # fmt: skip
        # `config` in the run's parameters; the deployment's default config_url gives way
        out = subprocess.run(
            [str(BIN / "prefect"), "deployment", "run", "train-kge/train",
             "--params", json.dumps(params), "--watch", "--watch-timeout", "600"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=700,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        # a config file of the checkout (relative to the worker's directory) and overrides
        overrides = ["model.dim=64", "training.epochs=2", f"run.root={tmp_path / 'runs'}",
                     "run.name=from-url"]  # fmt: skip
        out = subprocess.run(
            [str(BIN / "prefect"), "deployment", "run", "train-kge/train",
             "--param", "config_url=configs/umls-complex.yaml",
             "--param", f"overrides={json.dumps(overrides)}",
             "--watch", "--watch-timeout", "600"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=700,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        worker_log.close()

    from prefect.client.orchestration import get_client

    run_dir = tmp_path / "runs" / "deployed"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["mrr"] > 0.5 and results["training"]["epochs"] == 6
    with get_client(sync_client=True) as c:
        assert str(c.api_url).rstrip("/") == server.api_url
        runs = c.read_flow_runs()
        deployed = [r for r in runs if r.deployment_id is not None and r.state_name != "Scheduled"]
        assert len(deployed) == 2  # (besides the nightly schedule's runs)
        assert all(r.state is not None and r.state.is_completed() for r in deployed)
        flow_run = next(r for r in deployed if "config" in r.parameters)
    from_url = tmp_path / "runs" / "from-url"
    assert "dim: 64" in (from_url / "config.yaml").read_text()
    assert "epochs: 2" in (from_url / "config.yaml").read_text()
    entity = load_file(from_url / "model.safetensors")["entity"]
    assert entity.shape[0] == 135 and entity.shape[1] in (64, 128)  # complex: 2 x dim reals
    assert json.loads((from_url / "results.json").read_text())["training"]["epochs"] == 2

    # one metrics table per run, every row with the validation columns
    tables = _artifacts_with_key("kgpipe-deployed-metrics")
    assert len(tables) == 1, [(a.id, a.created) for a in tables]
    rows = json.loads(tables[0].data)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all({"valid_mrr", "valid_hits@10", "lr", "loss"} <= set(r) for r in rows), rows
    assert [r["valid_mrr"] is not None for r in rows] == [False, False, True] * 2
    arts = _artifacts(str(flow_run.id))
    keys = {a.key for a in arts}
    assert {"kgpipe-deployed-progress", "kgpipe-deployed-metrics", "kgpipe-deployed-report"} <= keys
    progress = next(a for a in arts if a.key == "kgpipe-deployed-progress")
    assert float(progress.data) == 100.0
    report = next(a for a in arts if a.key == "kgpipe-deployed-report")
    assert "mrr" in report.data and "data:image/png;base64," in report.data
    assert (run_dir / "curves.png").stat().st_size > 1000
    on_disk = (run_dir / "report.md").read_text()
    assert "](curves.png)" in on_disk and "base64" not in on_disk
    assert "| dim | 64 |" in report.data and "best validation: epoch" in report.data

    # the run and its artifacts in the Prefect UI (headless Chromium)
    if find_chromium() is None:
        if os.environ.get("KGPIPE_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required (KGPIPE_REQUIRE_CHROMIUM) but not installed")
        pytest.skip("chromium is not installed (CI installs it)")
    ui = tmp_path / "ui"
    html, png = render_page(
        f"{server.ui_url}/v2/runs/flow-run/{flow_run.id}?tab=Artifacts", ui, name="flow-run"
    )
    assert flow_run.name in html and "Completed" in html
    for key in ("kgpipe-deployed-progress", "kgpipe-deployed-metrics", "kgpipe-deployed-report"):
        assert key in html, key
    html2, png2 = render_page(f"{server.ui_url}/artifacts/artifact/{report.id}", ui, name="report")
    assert "kgpipe-deployed-report" in html2 and "deployed" in html2
    html3, png3 = render_page(
        f"{server.ui_url}/artifacts/artifact/{tables[0].id}", ui, name="metrics"
    )
    assert "valid_mrr" in html3 and "valid_hits@10" in html3  # columns of the table
    keep = REPO / "tests" / "screenshots"
    keep.mkdir(exist_ok=True)
    for p in (png, png2, png3):
        shutil.copy(p, keep / p.name)
    print(f"Prefect UI screenshots: {keep}")


# -- scheduled retraining: warm start on change, early exit without -------------------------------
def _write(path: Path, rows: list[str]) -> None:
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.slow
def test_retrain_warm_starts_and_skips_unchanged(
    prefect_env: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.retrain import retrain_kge
    from kgpipe.config import parse_config
    from kgpipe.data.dataset import load_dataset

    umls = load_dataset(parse_config({"data": {"dataset": "umls"}}).data)
    labels = umls.vocab
    rows = [
        f"{labels.entities[h]}\t{labels.relations[r]}\t{labels.entities[t]}"
        for h, r, t in umls.train.tolist()
    ]
    src = tmp_path / "graph"
    src.mkdir()
    _write(src / "train.tsv", rows[:4000])
    _write(src / "valid.tsv", rows[4000:4100])
    _write(src / "test.tsv", rows[4100:4200])
    config = parse_config({
        "run": {"root": str(tmp_path / "runs"), "name": "nightly", "seed": 1},
        "data": {"train": str(src / "train.tsv"), "valid": str(src / "valid.tsv"),
                 "test": str(src / "test.tsv")},
        "model": {"name": "complex", "dim": 32, "reciprocal": True},
        "training": {"epochs": 3, "mode": "1vsall", "loss": "cross_entropy",
                     "optimizer": "adagrad", "lr": 0.1},
        "checkpoint": {"keep_last": 10},
    })  # fmt: skip

    first = retrain_kge(config, return_state=True)
    assert first.is_completed() and first.message == "retrained"
    run1 = Path(first.result()["run"])
    # the graph grows: triples with entities the first run never saw
    new = [f"new-entity-{i}\t{labels.relations[0]}\t{labels.entities[i]}" for i in range(5)]
    _write(src / "train.tsv", rows[:4000] + new)
    second = retrain_kge(config, return_state=True)
    assert second.is_completed() and second.message == "retrained"
    run2 = Path(second.result()["run"])
    assert run2 != run1
    old_model = load_file(run1 / "model.safetensors")
    old_vocab = [
        x.split("\t")[1] for x in (run1 / "vocab" / "entities.tsv").read_text().splitlines()
    ]
    new_vocab = [
        x.split("\t")[1] for x in (run2 / "vocab" / "entities.tsv").read_text().splitlines()
    ]
    init_dir = run2 / "checkpoints" / "epoch-000000"
    manifest = json.loads((init_dir / "manifest.json").read_text())
    assert manifest["warm_start"]["new_entities"] == 5
    assert manifest["warm_start"]["kept_entities"] == len(old_vocab)
    init = st_load(next(init_dir.glob("state-*")).read_bytes())["table.entity"]
    final = load_file(run2 / "model.safetensors")["entity"]
    where = {e: i for i, e in enumerate(new_vocab)}
    for i, e in enumerate(old_vocab):  # unchanged entities start from the previous vectors
        assert torch.equal(init[where[e]], old_model["entity"][i]), e
    for i in range(5):  # and the new ones were trained
        j = where[f"new-entity-{i}"]
        assert not torch.equal(init[j], final[j])
    # and training went on from those vectors: its first epoch's loss is the trained model's,
    # not a fresh one's (4.90 and 3.27 here; a run that skipped the warm start: 4.94)
    first_loss = [
        json.loads((r / "metrics.jsonl").read_text().splitlines()[0])["loss"] for r in (run1, run2)
    ]
    assert first_loss[1] < 0.8 * first_loss[0], first_loss
    assert json.loads((run2 / "results.json").read_text())["mrr"] > 0
    runs_before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    third = retrain_kge(config, return_state=True)
    assert third.is_completed() and third.message == "no change"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs_before
    # the series' model changes (another dim), the graph does not: it retrains, from scratch
    # (it said "no change" while the graph was the same, then every night failed to warm-start
    # the other dimension, leaving a staged folder each time, force or not)
    wider = config.model_copy(update={"model": config.model.model_copy(update={"dim": 16})})
    fourth = retrain_kge(wider, return_state=True)
    assert fourth.is_completed() and fourth.message == "retrained", fourth.message
    run4 = Path(fourth.result()["run"])
    assert not (run4 / "checkpoints" / "epoch-000000").exists()  # no warm start
    assert load_file(run4 / "model.safetensors")["entity"].shape[1] == 16
    assert retrain_kge(wider, return_state=True).message == "no change"
    # the graph is replaced while a night stages it: the series records the graph the run
    # trained on, not the one read before (which retrained the next night on the same data)
    import flows.retrain

    monkeypatch.setattr(flows.retrain, "fingerprint_source", lambda config: "read-before")
    assert retrain_kge(wider, force=True, return_state=True).message == "retrained"
    monkeypatch.undo()
    assert retrain_kge(wider, return_state=True).message == "no change"


@pytest.mark.slow
def test_flow_parameters_never_hold_credentials(prefect_env: PrefectServer, tmp_path: Path) -> None:
    """Credentials in the config reach the tasks but are redacted in what Prefect records."""
    from prefect.client.orchestration import get_client

    from flows.train import train_kge
    from kgpipe.config import parse_config

    secret = "do-not-leak-5e3b"
    config = parse_config({
        "run": {"root": str(tmp_path), "name": "creds",
                "storage_options": {"secret": secret, "auto_mkdir": True}},
        "data": {"dataset": "umls"},
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 1, "max_steps_per_epoch": 2},
        "evaluation": {"test": False},
    })  # fmt: skip
    state = train_kge(config, resume=False, return_state=True)
    assert state.is_completed()
    with get_client(sync_client=True) as c:
        flow_run = c.read_flow_run(state.state_details.flow_run_id)
    recorded = json.dumps(flow_run.parameters)
    assert secret not in recorded and "***redacted***" in recorded
    assert secret not in (tmp_path / "creds" / "config.yaml").read_text()


def test_an_early_stopped_run_shows_its_progress_complete(
    prefect_env: PrefectServer, tmp_path: Path
) -> None:
    """Early stopping ends training before training.epochs: the progress artifact, updated
    per epoch, stayed at the stopping epoch's share of a Completed run (10 % here)."""
    from flows.train import train_kge
    from kgpipe.config import parse_config

    config = parse_config({
        "run": {"root": str(tmp_path), "name": "es"},
        "data": {"dataset": "umls"},
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 20, "lr": 1e-12, "max_steps_per_epoch": 2},
        "evaluation": {"every": 1, "patience": 1, "test": False},
    })  # fmt: skip
    state = train_kge(config, resume=False, return_state=True)
    assert state.is_completed(), state.message
    epochs = [json.loads(x)["epoch"] for x in (tmp_path / "es/metrics.jsonl").open()]
    assert epochs[-1] < 20  # stopped early
    progress = next(a for a in _artifacts(str(state.state_details.flow_run_id))
                    if a.key == "kgpipe-es-progress")  # fmt: skip
    assert float(progress.data) == 100.0


def test_a_flow_run_names_an_unnamed_run_after_itself(
    prefect_env: PrefectServer, tmp_path: Path
) -> None:
    """Without run.name the flow's run folder was timestamped, so a retry of the flow run (the
    `train` deployment resumes by default) started a new folder from epoch 0. It is named after
    the flow run, as the tune flow names its study: a retry finds its folder."""
    from prefect.client.orchestration import get_client

    from flows.train import train_kge
    from kgpipe.config import parse_config

    config = parse_config({
        "run": {"root": str(tmp_path)},
        "data": {"dataset": "umls"},
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 1, "max_steps_per_epoch": 2},
        "evaluation": {"test": False},
    })  # fmt: skip
    state = train_kge(config, return_state=True)
    assert state.is_completed(), state.message
    with get_client(sync_client=True) as c:
        flow_run = c.read_flow_run(state.state_details.flow_run_id)
    name = f"distmult-umls-{flow_run.name}-{str(flow_run.id)[:8]}"
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [name]
    assert state.result()["run"] == str(tmp_path / name)


@pytest.mark.slow
def test_a_bad_override_fails_the_flow_run_before_staging(
    prefect_env: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.train import train_kge
    from kgpipe.config import parse_config

    monkeypatch.chdir(REPO)
    root = tmp_path / "runs"
    state = train_kge(
        config_url="configs/umls-complex.yaml",
        overrides=[f"run.root={root}", "run.name=bad", "model.dimm=64"],
        return_state=True,
    )
    assert state.is_failed()
    assert state.message is not None and "model.dimm: unknown key" in state.message
    assert "\n" not in str(state.message)
    assert not root.exists()  # nothing staged, no lease taken
    both = train_kge(
        parse_config({"data": {"dataset": "umls"}, "run": {"root": str(root)}}),
        config_url="configs/umls-complex.yaml",
        return_state=True,
    )
    assert both.is_failed() and "not both" in str(both.message)
    assert not root.exists()


@pytest.mark.slow
def test_the_flow_has_a_sharded_gang_rank_the_test_split(
    prefect_env: PrefectServer, tmp_path: Path
) -> None:
    """train-kge with the sharded strategy: the test split is ranked by a gang on the flow's
    cluster (a task of its own, before the cluster closes), as one process ranks it."""
    from flows.train import train_kge
    from kgpipe.config import parse_config
    from kgpipe.runs.read import evaluate_run

    config = parse_config({
        "run": {"root": str(tmp_path), "name": "sharded", "seed": 0},
        "data": {"dataset": "umls"},
        "model": {"name": "transe", "dim": 16},
        "training": {"epochs": 2, "batch_size": 512, "negatives": 32, "chunk_size": 64},
        "evaluation": {"every": 0},
        "distributed": {"workers": 2, "strategy": "sharded", "entity_shards": 4},
    })  # fmt: skip
    state = train_kge(config, return_state=True)
    assert state.is_completed(), state.message
    results = json.loads((tmp_path / "sharded" / "results.json").read_text())
    assert (results["ranked_by"], results["ranks"]) == ("gang", 2)
    one = evaluate_run(str(tmp_path / "sharded"))
    assert results["mrr"] == pytest.approx(one["mrr"], rel=1e-9)


def test_task_retry_condition_retries_transient_faults_only() -> None:
    from kgpipe.errors import ConfigError, StorageAccessDenied, StorageError, StorageUnreachable
    from tasks.kge import transient

    class Failed:
        def __init__(self, err: Exception) -> None:
            self.err = err

        def result(self) -> None:
            raise self.err

    assert transient(None, None, Failed(StorageError("s3://b/x: failed after 7 attempts")))
    assert transient(None, None, Failed(ConnectionError("reset")))
    assert not transient(None, None, Failed(StorageAccessDenied("s3://b/x: access denied")))
    # at start-up an endpoint that does not answer fails fast, not after 42 s of task retries
    assert not transient(None, None, Failed(StorageUnreachable("s3://b/x: cannot reach")))
    assert not transient(None, None, Failed(ConfigError("bad key")))
    assert not transient(None, None, Failed(ValueError("bug")))
