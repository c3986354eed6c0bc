"""Interrupted and killed ``kgpipe train`` commands (a 2-worker Dask run through the Prefect flow,
on the command's own temporary Prefect server): Ctrl-C and SIGTERM end it within seconds, quietly,
with exit 130 / 143; after SIGKILL nothing it started survives and its ranks commit no more; the
run folder stays resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kgpipe.checkpoint import CheckpointStore
from kgpipe.storage import Store

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PREFECT_HOME of these tests' own (never the user's ~/.prefect)."""
    return tmp_path_factory.mktemp("prefect-home")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def _start(root: Path, home: Path) -> subprocess.Popen[str]:
    """`kgpipe train` as a terminal would run it: its own session and process group, SIGINT at
    its default (a background job of a non-interactive shell would ignore it)."""
    sets = [f"run.root={root}", "run.name=s", "distributed.workers=2", "training.epochs=60",
            "evaluation.every=0", "evaluation.test=false", "model.dim=32"]  # fmt: skip
    cmd = [sys.executable, "-m", "kgpipe.cli", "train", "-c",
           str(REPO / "configs/umls-complex.yaml"), "-q", *[x for s in sets for x in ("--set", s)]]  # fmt: skip
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(home),
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_commit(proc: subprocess.Popen[str], run: Path, epoch: int) -> None:
    manifest = run / "checkpoints" / f"epoch-{epoch:06d}" / "manifest.json"
    deadline = time.monotonic() + 240
    while not manifest.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _processes_of(pid: int) -> list[str]:
    """What still runs in the command's session, and temporary Prefect servers it started."""
    ps = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
    left = []
    for line in ps.splitlines():
        _pid, sid, args = line.split(None, 2)
        if int(sid) == pid or ("flows.server" in args and args.split()[-1] == str(pid)):
            left.append(line.strip())
    return left


def _committed(run: Path) -> list[int]:
    return [c.epoch for c in CheckpointStore(Store(str(run))).committed()]


@pytest.mark.parametrize(
    "sig,group,status,said",
    [
        (signal.SIGINT, True, 130, "interrupted"),  # Ctrl-C: the whole foreground group
        (signal.SIGTERM, False, 143, "terminated"),
    ],
)
def test_an_interrupted_run_ends_within_seconds_quietly_and_stays_resumable(
    tmp_path: Path, prefect_home: Path, sig: int, group: bool, status: int, said: str
) -> None:
    proc = _start(tmp_path, prefect_home)
    _wait_for_commit(proc, tmp_path / "s", 5)
    t0 = time.monotonic()
    (os.killpg if group else os.kill)(proc.pid, sig)
    _out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == status, err[-3000:]
    assert took < 10, took
    assert "Traceback" not in err and err.strip().splitlines()[-1] == said, err[-3000:]
    assert "ERROR" not in err and "Crash" not in err, err[-3000:]  # Prefect's crash lines
    hint = err.strip().splitlines()[-2]  # how to go on: the same command, with --resume
    assert hint.startswith("to go on from its last checkpoint: kgpipe train -c "), err[-3000:]
    assert hint.endswith(" --set model.dim=32 --set run.name=s --resume"), hint
    time.sleep(3)
    assert _processes_of(proc.pid) == []
    done = _committed(tmp_path / "s")
    assert done and all(CheckpointStore(Store(str(tmp_path / "s"))).verify(c)
                        for c in CheckpointStore(Store(str(tmp_path / "s"))).committed())  # fmt: skip
    resumed = subprocess.run(
        [sys.executable, "-m", "kgpipe.cli", "train", "-c", str(tmp_path / "s" / "config.yaml"),
         "--no-prefect", "-q", "--resume", "--set", "training.epochs=60"],
        cwd=REPO, env=_env(prefect_home), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _committed(tmp_path / "s")[-1] == 60


def test_after_sigkill_nothing_survives_and_no_rank_commits(
    tmp_path: Path, prefect_home: Path
) -> None:
    proc = _start(tmp_path, prefect_home)
    _wait_for_commit(proc, tmp_path / "s", 5)
    assert any("flows.server" in p for p in _processes_of(proc.pid))  # our own server runs
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = _committed(tmp_path / "s")[-1]
    time.sleep(10)
    assert _processes_of(proc.pid) == []
    # a commit already past its check may land; after that the ranks commit nothing more
    assert _committed(tmp_path / "s")[-1] <= at_kill + 1
