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
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", "kgpipe-process"],
        cwd=REPO, env=env, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
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
        out = subprocess.run(
            [str(BIN / "prefect"), "deployment", "run", "train-kge/train",
             "--params", json.dumps(params), "--watch", "--watch-timeout", "600"],
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
        flow_run = next(r for r in runs if r.deployment_id is not None)
        assert flow_run.state is not None and flow_run.state.is_completed()
    arts = _artifacts(str(flow_run.id))
    keys = {a.key for a in arts}
    assert {"kgpipe-deployed-progress", "kgpipe-deployed-metrics", "kgpipe-deployed-report"} <= keys
    progress = next(a for a in arts if a.key == "kgpipe-deployed-progress")
    assert float(progress.data) == 100.0
    report = next(a for a in arts if a.key == "kgpipe-deployed-report")
    assert "mrr" in report.data and "data:image/png;base64," in report.data
    assert (run_dir / "curves.png").stat().st_size > 1000

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
    keep = REPO / "tests" / "screenshots"
    keep.mkdir(exist_ok=True)
    for p in (png, png2):
        shutil.copy(p, keep / p.name)
    print(f"Prefect UI screenshots: {keep}")


# -- scheduled retraining: warm start on change, early exit without -------------------------------
def _write(path: Path, rows: list[str]) -> None:
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.slow
def test_retrain_warm_starts_and_skips_unchanged(
    prefect_env: PrefectServer, tmp_path: Path
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
    assert json.loads((run2 / "results.json").read_text())["mrr"] > 0
    runs_before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    third = retrain_kge(config, return_state=True)
    assert third.is_completed() and third.message == "no change"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs_before


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


def test_task_retry_condition_retries_transient_faults_only() -> None:
    from kgpipe.errors import ConfigError, StorageAccessDenied, StorageError
    from tasks.kge import transient

    class Failed:
        def __init__(self, err: Exception) -> None:
            self.err = err

        def result(self) -> None:
            raise self.err

    assert transient(None, None, Failed(StorageError("s3://b/x: failed after 7 attempts")))
    assert transient(None, None, Failed(ConnectionError("reset")))
    assert not transient(None, None, Failed(StorageAccessDenied("s3://b/x: access denied")))
    assert not transient(None, None, Failed(ConfigError("bad key")))
    assert not transient(None, None, Failed(ValueError("bug")))
