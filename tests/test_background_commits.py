"""runs.callbacks.BackgroundCommits, the one mechanism behind background commits (the replicated
CheckpointWriter and the sharded ShardedCommit): what it copies, when it waits, where a
background commit's error surfaces, and that a close bounded by a timeout never hangs."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kgpipe.checkpoint import TrainState
from kgpipe.runs.callbacks import BackgroundCommits


def _state(epoch: int = 1) -> TrainState:
    return TrainState(
        epoch, 10 * epoch, {"entity": torch.zeros(4, 2)}, {"entity.sum": torch.zeros(4)}
    )


class Recorder:
    """A commit that records what it was given, optionally held until released or failing."""

    def __init__(self, *, hold: bool = False, fail_at: int | None = None) -> None:
        self.seen: list[tuple[int, TrainState, Any, str]] = []
        self.release = threading.Event()
        self.started = threading.Event()
        if not hold:
            self.release.set()
        self.fail_at = fail_at

    def __call__(self, state: TrainState, extra: Any) -> int:
        self.started.set()
        self.release.wait(30)
        self.seen.append((state.epoch, state, extra, threading.current_thread().name))
        if state.epoch == self.fail_at:
            raise OSError(f"disk full at epoch {state.epoch}")
        return state.epoch


def test_a_background_commit_writes_a_copy_while_training_goes_on() -> None:
    commit = Recorder(hold=True)
    commits = BackgroundCommits(commit, background=True, name="t-ckpt")
    state = _state(1)
    assert commits.submit(state, {"m": 1}) is None  # returned at once: in flight
    assert commit.started.wait(10)
    state.tables["entity"] += 1.0  # the next epoch trains on the live tables
    commit.release.set()
    assert commits.wait(10) == 1
    _, written, extra, thread = commit.seen[0]
    assert written is not state and float(written.tables["entity"].sum()) == 0.0  # the copy
    assert extra == {"m": 1} and thread.startswith("t-ckpt")
    assert commits.wait() is None  # nothing in flight any more
    commits.close()


def test_a_commit_made_at_once_is_not_copied_and_waits_for_the_one_in_flight() -> None:
    commit = Recorder()
    commits = BackgroundCommits(commit, background=True, name="t-ckpt")
    commits.submit(_state(1), None)
    last = _state(2)
    # a segment's last commit: made in the caller's thread, after the one in flight, no copy
    assert commits.submit(last, None, wait=True) == 2
    assert [s[0] for s in commit.seen] == [1, 2]
    assert commit.seen[1][1] is last and commit.seen[1][3] == threading.current_thread().name
    commits.close()


def test_without_a_thread_every_commit_is_made_at_once() -> None:
    commit = Recorder()
    commits = BackgroundCommits(commit, background=False, name="t-ckpt")
    state = _state(3)
    assert commits.submit(state, None) == 3 and commit.seen[0][1] is state
    assert commits.close() is None


def test_a_failed_background_commit_is_raised_by_the_next_submit_wait_or_close() -> None:
    for then in ("submit", "wait", "close"):
        commit = Recorder(fail_at=1)
        commits = BackgroundCommits(commit, background=True, name="t-ckpt")
        commits.submit(_state(1), None)
        with pytest.raises(OSError, match="disk full at epoch 1"):
            if then == "submit":
                commits.submit(_state(2), None)
            elif then == "wait":
                commits.wait(10)
            else:
                commits.close(10)
        if then == "submit":  # the failed commit stopped the next one from starting
            assert [s[0] for s in commit.seen] == [1]
        commits.close()  # raised once: closing again is quiet


def test_close_with_a_timeout_does_not_wait_for_a_stuck_commit() -> None:
    commit = Recorder(hold=True)
    commits = BackgroundCommits(commit, background=True, name="t-ckpt")
    commits.submit(_state(1), None)
    assert commit.started.wait(10)
    with pytest.raises(TimeoutError):
        commits.close(0.2)  # a peer that never answers: the failure path gives up
    commit.release.set()  # (the thread ends on its own)


def test_check_raises_a_failed_commit_without_waiting_for_a_running_one() -> None:
    commit = Recorder(hold=True, fail_at=1)
    commits = BackgroundCommits(commit, background=True, name="t-ckpt")
    assert commits.check() is None  # nothing in flight
    commits.submit(_state(1), None)
    assert commit.started.wait(10)
    assert commits.check() is None  # still running: not waited for
    commit.release.set()
    deadline = time.monotonic() + 10
    with pytest.raises(OSError, match="disk full at epoch 1"):
        while time.monotonic() < deadline:
            commits.check()
            time.sleep(0.01)
    assert commits.check() is None  # raised once
    ok = BackgroundCommits(Recorder(), background=True, name="t-ckpt")
    ok.submit(_state(2), None)
    pending = ok._pending
    assert pending is not None
    concurrent.futures.wait([pending], timeout=10)
    assert ok.check() == 2  # a finished commit's result
    assert ok.wait() is None  # taken by check
    commits.close()
    ok.close()


def test_failed_tells_without_waiting_or_raising_and_keeps_the_error_for_wait() -> None:
    """What a sharded rank asks each epoch before the ranks agree to stop: ``failed()`` says
    whether the commit in flight has ended with an error; the error stays for ``wait()``."""
    commit = Recorder(hold=True, fail_at=1)
    commits = BackgroundCommits(commit, background=True, name="t-ckpt")
    assert not commits.in_flight and not commits.failed()
    commits.submit(_state(1), None)
    assert commit.started.wait(10)
    assert commits.in_flight and not commits.failed()  # still running
    commit.release.set()
    deadline = time.monotonic() + 10
    while not commits.failed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert commits.failed() and commits.in_flight  # not taken by asking
    with pytest.raises(OSError, match="disk full at epoch 1"):
        commits.wait()
    assert not commits.in_flight and not commits.failed()
    ok = BackgroundCommits(Recorder(), background=True, name="t-ckpt")
    ok.submit(_state(2), None)
    assert ok.wait(10) == 2 and not ok.failed()
    commits.close()
    ok.close()


class _FailingStore:
    """Checkpoint storage whose writes fail (an object store that went away)."""

    def save(self, state: TrainState, meta: dict[str, Any]) -> None:
        raise OSError(f"the store is gone (epoch {state.epoch})")

    def prune(self) -> None:
        pass


def test_a_failed_background_upload_stops_training_at_the_next_epochs_end() -> None:
    """Before, a failed upload surfaced only at the next commit, ``checkpoint.every`` epochs
    later: that many epochs were trained for nothing (the relaunch resumes from the last
    commit). Now the epoch after it ends with its error."""
    from kgpipe.runs.callbacks import CheckpointCallback
    from kgpipe.training.records import EpochStats

    def stats(epoch: int) -> EpochStats:
        return EpochStats(epoch=epoch, loss=0.0, triples=1, seconds=1.0, lr=0.1, steps=1)

    callback = CheckpointCallback(
        _FailingStore(),  # type: ignore[arg-type]
        lambda history: _state(history[-1].epoch),
        every=5,
        until=20,
        meta={},
    )
    trainer = SimpleNamespace(history=[])
    try:
        callback.on_epoch_end(trainer, stats(5))  # type: ignore[arg-type]  # in the background
        pending = callback.writer._pending
        assert pending is not None
        concurrent.futures.wait([pending], timeout=10)
        with pytest.raises(OSError, match=r"the store is gone \(epoch 5\)"):
            callback.on_epoch_end(trainer, stats(6))  # type: ignore[arg-type]
        callback.on_train_end(trainer)  # type: ignore[arg-type]  # raised once
    finally:
        callback.close(10)


def test_the_sharded_ranks_agreement_does_not_count_in_the_next_epochs_collective_stats(
    tmp_path: Any,
) -> None:
    """ShardedCommit's per-epoch max over the group (has a rank's commit thread failed?) is a
    real collective, but the epoch it runs after has had its stats taken and the next epoch's
    ``comm_seconds`` and ``collectives`` must be that epoch's own: the counters it adds are
    taken back (a one-rank gloo group in this process; the gang's tests run two)."""
    import torch.distributed as dist

    from kgpipe.distributed.comm import Comm
    from kgpipe.runs.sharded import ShardedCommit

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    commit, sharded = Recorder(hold=True), None
    try:
        comm = Comm(world_size=1)
        exchange = SimpleNamespace(comm=comm, own=torch.arange(4), rank=0)
        sharded = ShardedCommit(
            None,  # type: ignore[arg-type]  # no commit reaches the store here
            lambda history: _state(),
            exchange,  # type: ignore[arg-type]
            every=5,
            until=20,
            meta={},
        )
        sharded._commits = BackgroundCommits(commit, background=True, name="t-shards")
        sharded._commits.submit(_state(5), None)  # a commit in flight: the agreement runs
        comm.seconds, comm.calls = 0.25, 3  # the next epoch's traffic so far
        calls: list[int] = []
        real = comm.max_int

        def counted(value: int) -> int:
            calls.append(value)
            return real(value)

        comm.max_int = counted  # type: ignore[method-assign]
        sharded._stop_together()
        assert calls == [0]  # it ran, over the group, and no thread had failed
        assert (comm.seconds, comm.calls) == (0.25, 3)
        assert real(0) == 0 and comm.calls == 4  # a max that is not the agreement counts
    finally:
        commit.release.set()
        if sharded is not None:
            sharded.close(10)
        dist.destroy_process_group()
