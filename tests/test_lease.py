"""One writer per run folder (kgpipe/runs/lease.py): the exclusive create underneath, the lease's
refusal, release, expiry and takeover, and commits fenced by it -- on a local disk and on S3
(SeaweedFS)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import S3Server

from kgpipe.checkpoint import CheckpointStore, TrainState
from kgpipe.errors import RunError
from kgpipe.runs.lease import LeaseLost, RunLease, check_holder
from kgpipe.storage import Store


def _store(where: str, s3_server: S3Server | None, name: str) -> Store:
    if where == "s3":
        assert s3_server is not None
        return Store(f"s3://kgpipe/leases/{name}", s3_server.storage_options())
    return Store(f"{where}/{name}")


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, S3Server | None]:
    if request.param == "s3":
        return "s3", request.getfixturevalue("s3_server")
    return str(tmp_path), None


def _create(args: tuple[str, dict[str, Any], str, Any]) -> bool:
    url, options, rel, start = args
    store = Store(url, options)
    start.wait()
    try:
        store.create(rel, b"mine")
        return True
    except FileExistsError:
        return False


def test_exactly_one_of_racing_creates_wins(where: tuple[str, S3Server | None]) -> None:
    """4 processes create the same file at the same moment, 10 times: one winner each time."""
    root, s3 = where
    store = _store(root, s3, f"race-{time.time_ns()}")
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(4) as pool:
        for trial in range(10):
            start = manager.Event()
            jobs = pool.map_async(
                _create, [(store.url, store.storage_options, f"f{trial}", start)] * 4
            )
            time.sleep(0.3)
            start.set()
            assert sorted(jobs.get(timeout=60)) == [False, False, False, True], trial
            assert store.read_bytes(f"f{trial}") == b"mine"
    assert not [n for n in store.list() if ".tmp-" in n]


def test_a_second_writer_is_refused_until_the_first_releases(
    where: tuple[str, S3Server | None],
) -> None:
    root, s3 = where
    store = _store(root, s3, "refused")
    store.write_text("config.yaml", "a run folder\n")
    first = RunLease(store, ttl_s=60, holder="the first writer")
    first.acquire()
    second = RunLease(store, ttl_s=60, holder="the second writer")
    with pytest.raises(RunError) as err:
        second.acquire()
    text = str(err.value)
    assert "another writer is using this run folder: the first writer (" in text
    assert "lease renewed 0 s ago" in text and "expires in 60 s" in text
    first.release()
    second.acquire()  # a released lease need not expire
    assert second.number == 2
    first.check()  # released, not taken over: no error for the old holder's check
    second.release()


def test_an_expired_lease_is_taken_over_and_the_old_writer_stops_committing(
    where: tuple[str, S3Server | None],
) -> None:
    """The first writer stalls (no renewal) past its time to live: a second takes the folder
    over; the first one's next commit is refused by the fence and writes no manifest."""
    root, s3 = where
    store = _store(root, s3, "expired")
    store.write_text("config.yaml", "a run folder\n")
    stalled = RunLease(store, ttl_s=1.0, holder="a stalled writer")
    stalled.acquire()
    with pytest.raises(RunError, match="a stalled writer"):
        RunLease(store, ttl_s=60, holder="too early").acquire()
    time.sleep(1.2)
    successor = RunLease(store, ttl_s=60, holder="the successor")
    successor.acquire()
    with pytest.raises(LeaseLost, match="taken over by the successor"):
        stalled.check()
    with pytest.raises(LeaseLost):
        stalled.renew()
    assert stalled.number is not None
    fenced = CheckpointStore(store, fence=lambda: check_holder(store, stalled.number or 0))
    state = TrainState(epoch=1, global_step=1, tables={"entity": torch.zeros(2, 2)},
                       optimizer={}, history=[{"epoch": 1, "loss": 1.0}])  # fmt: skip
    with pytest.raises(LeaseLost):
        fenced.save(state, {})
    # nothing half-committed stays (SeaweedFS keeps a marker of the emptied folder itself)
    left = store.fs.find(store.path("checkpoints/epoch-000001"))
    assert not [f for f in left if "state-" in f or "manifest" in f], left
    stalled.release()  # not the holder any more: the successor's record is left alone
    check_holder(store, successor.number or 0)
    successor.release()
    record = json.loads(store.read_text("lease/00000002.json"))
    assert record["released"] is True and record["holder"] == "the successor"


def test_a_lease_over_nothing_leaves_no_folder(where: tuple[str, S3Server | None]) -> None:
    """A writer refused for bad input wrote nothing but its lease: releasing it leaves nothing."""
    root, s3 = where
    store = _store(root, s3, "nothing")
    with RunLease(store, ttl_s=60):
        assert store.list() == ["lease"]
    assert not [f for f in store.fs.find(store.path("")) if f.endswith(".json")]
    if s3 is None:
        assert not Path(root, "nothing").exists()


def test_the_holder_renews_in_the_background(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "renewed"))
    store.write_text("config.yaml", "a run folder\n")
    with RunLease(store, ttl_s=0.4, holder="renewing") as lease:
        time.sleep(1.0)  # past the time to live, renewed every 0.1 s
        with pytest.raises(RunError, match="renewing"):
            RunLease(store, ttl_s=60).acquire()
        assert lease.lost is None
    RunLease(store, ttl_s=60).acquire()  # released on exit


# -- two `kgpipe train` commands with one run.name ------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


def _train_cmd(
    root: str, name: str, *extra: str, options: dict[str, Any] | None = None
) -> list[str]:
    sets = [f"run.root={root}", f"run.name={name}", "data.dataset=umls", "model.name=distmult",
            "model.dim=8", "training.epochs=3", "training.batch_size=512",
            "training.negatives=4", "evaluation.test=false", "evaluation.every=0",
            "fault_tolerance.lease_ttl_s=5", *extra]  # fmt: skip
    if options:
        sets.append(f"run.storage_options={json.dumps(options)}")
    cmd = [sys.executable, "-m", "kgpipe.cli", "train", "-c", str(REPO / "configs/umls-complex.yaml"),
           "--no-prefect", "-q"]  # fmt: skip
    return cmd + [x for s in sets for x in ("--set", s)]


@pytest.mark.slow
def test_two_concurrent_writers_one_trains_the_other_is_refused(
    where: tuple[str, S3Server | None],
) -> None:
    """10 trials, each two `kgpipe train` of the same run.name started together: exactly one
    trains, the other is refused in one line naming the holder; the checkpoints all verify."""
    root, s3 = where
    base = "s3://kgpipe/concurrent" if s3 else root
    options = s3.storage_options() if s3 else None
    for trial in range(10):
        name = f"t{trial}"
        procs = [
            subprocess.Popen(_train_cmd(base, name, options=options), cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]  # fmt: skip
        outs = [p.communicate(timeout=300) for p in procs]
        codes = sorted(p.returncode for p in procs)
        refused = [err for (_, err), p in zip(outs, procs, strict=True) if p.returncode == 2]
        assert codes == [0, 2], (trial, outs)
        assert "Traceback" not in refused[0] and len(refused[0].strip().splitlines()) == 1
        assert (
            "another writer is using this run folder: kgpipe train" in refused[0]
            or "a run with this name exists" in refused[0]  # the first had already finished
        ), refused[0]
        store = Store(f"{base}/{name}", options)
        checkpoints = CheckpointStore(store)
        assert [c.epoch for c in checkpoints.committed()][-1] == 3
        assert all(checkpoints.verify(c) for c in checkpoints.committed())
        assert json.loads(store.read_text("lease/00000001.json"))["released"] is True


def test_a_killed_writers_lease_is_taken_over_at_once_here_and_after_expiry_elsewhere(
    tmp_path: Path,
) -> None:
    """SIGKILL leaves the lease unreleased. A resume on the same host sees that the holder's
    process is gone and takes over at once (the README's plain `--resume` after a crash). Had
    the writer run on another host, only the lease's age tells: refused, saying when the lease
    expires, and taken over after that."""
    for case in ("this host", "another host"):
        root = tmp_path / case.replace(" ", "-")
        cmd = _train_cmd(str(root), "k", "training.epochs=200")
        proc = subprocess.Popen(cmd, cwd=REPO)
        # any committed epoch: 200 tiny epochs take a few seconds, and retention (keep_last)
        # removes epoch 1 three epochs later, faster than a poll may look
        checkpoints_dir = root / "k" / "checkpoints"
        deadline = time.monotonic() + 120
        while not any(checkpoints_dir.glob("epoch-*/manifest.json")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        resume = [*cmd, "--resume"]
        if case == "another host":
            record = root / "k" / "lease" / "00000001.json"
            data = json.loads(record.read_text())
            # the record's own TTL (60 s, not the config's 5 s): the resume's start-up on busy
            # cores (18.9 s once in CI) must not outlast a lease that is meant to be live
            held = {**data, "host": "elsewhere", "renewed": time.time(), "ttl_s": 60.0}
            record.write_text(json.dumps(held))
            early = subprocess.run(resume, cwd=REPO, capture_output=True, text=True, timeout=300)
            assert early.returncode == 2, early.stderr
            assert "another writer is using this run folder" in early.stderr
            assert "elsewhere" in early.stderr and "expires in" in early.stderr
            assert "Traceback" not in early.stderr
            # a minute later, never renewed: expired
            record.write_text(json.dumps({**held, "renewed": time.time() - 61}))
        done = subprocess.run(resume, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (case, done.stderr)
        checkpoints = CheckpointStore(Store(str(root / "k")))
        assert [c.epoch for c in checkpoints.committed()][-1] == 200


def test_a_holder_that_exited_but_was_not_reaped_is_gone() -> None:
    """A killed writer whose parent has not reaped it yet (a zombie: where PID 1 does not reap
    orphans, it stays one) answers signal 0 like a live process; its lease is free at once
    all the same."""
    from kgpipe.runs.lease import _holder_gone, _machine, _started

    proc = subprocess.Popen([sys.executable, "-c", "pass"])  # not waited for: a zombie
    record = {
        "host": socket.gethostname(),
        "pid": proc.pid,
        "pid_started": _started(proc.pid),
        "machine": _machine(),
    }
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, 0)  # no error: to signal 0 it still looks alive
    assert _holder_gone(record)
    live = {**record, "pid": os.getppid(), "pid_started": _started(os.getppid())}
    assert not _holder_gone(live)  # a running process holds its lease
    proc.wait()
    assert _holder_gone(record)  # reaped: gone


def test_a_record_being_written_is_not_an_expired_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without hard links a lease record is created empty, then written. A second writer that
    read it in between took it for a lease renewed in 1970 (expired) and took the folder from
    a writer that had just acquired it. It looks again instead."""
    import kgpipe.runs.lease as lease

    first = RunLease(Store(str(tmp_path)), ttl_s=60.0, holder="the first")
    first.acquire()
    real, torn = lease._read, [{}]
    monkeypatch.setattr(lease, "_read", lambda store, n: torn.pop() if torn else real(store, n))
    with pytest.raises(RunError, match="another writer is using this run folder: the first"):
        RunLease(Store(str(tmp_path)), ttl_s=60.0, holder="the second").acquire()
    first.check()  # still the holder
    first.release()


def test_two_writers_of_one_record_leave_one(tmp_path: Path) -> None:
    """Where a store's create is not atomic, two writers racing for one record both held it,
    and every check, renewal and commit fence passed for both. The writer whose record is
    not the one stored stops at its next check."""
    first = RunLease(Store(str(tmp_path)), ttl_s=60.0, holder="the first")
    first.acquire()
    rel = next((tmp_path / "lease").iterdir())
    record = json.loads(rel.read_text())
    rel.write_text(json.dumps({**record, "holder": "the second", "token": "b" * 32}))
    with pytest.raises(LeaseLost, match="is also the second"):
        first.check()
    first.release()  # and its release leaves the other's record held (it marked it released)
    after = json.loads(rel.read_text())
    assert after["holder"] == "the second" and not after["released"]


def test_the_commit_fence_checks_the_writers_token(tmp_path: Path) -> None:
    """A run's commits (this process or a gang's rank 0) check the lease by its handle
    (NUMBER/TOKEN): the loser of a record two writers created (a store whose create is not
    atomic) stops committing at once, not only when its driver's renewal notices."""
    from kgpipe.config import RunConfig
    from kgpipe.runs.folder import RunFolder
    from kgpipe.runs.lease import check_handle

    config = RunConfig.model_validate(
        {"run": {"root": str(tmp_path), "name": "r"}, "data": {"dataset": "umls"}}
    )
    store = Store(str(tmp_path / "r"))
    first = RunLease(store, ttl_s=60.0, holder="the first")
    first.acquire()
    assert first.handle is not None and first.handle.startswith(f"{first.number}/")
    run = RunFolder(store.url, config, 3, 1, 2, "f", 0, lease=first.handle)
    check_handle(store, first.handle)  # its own record: passes
    rel = next((tmp_path / "r" / "lease").iterdir())
    record = json.loads(rel.read_text())
    rel.write_text(json.dumps({**record, "holder": "the second", "token": "b" * 32}))
    state = TrainState(epoch=1, global_step=1, tables={"entity": torch.zeros(2, 2)},
                       optimizer={}, history=[{"epoch": 1, "loss": 1.0}])  # fmt: skip
    with pytest.raises(LeaseLost, match="not held by this writer"):
        run.checkpoints().save(state, {})
    assert not store.exists("checkpoints/epoch-000001")
    with pytest.raises(LeaseLost, match="not a lease handle"):
        check_handle(store, "7")
