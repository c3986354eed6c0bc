"""Gang launch: one long task per Dask worker, all or nothing.

Dask has no gang scheduling, so this module enforces it: every rank is pinned to its own worker
(``workers=[addr]``, ``allow_other_workers=False``, ``pure=False``); the driver watches the futures
and the scheduler's worker list, and when any rank raises or its worker disappears, it cancels
the others and raises :class:`GangError` naming the rank and the worker. Ranks blocked in a
collective are released by the collective timeout or by their peer's closed connection.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from distributed import Client, Future, Queue

from kgpipe.errors import ConfigError, Diverged, Fenced, KgpipeError, RunError, StorageFull
from kgpipe.training.hooks import NotInViewError

log = logging.getLogger("kgpipe.distributed")

__all__ = ["GangError", "free_port", "launch_gang", "live_workers", "pick_workers"]


class GangError(KgpipeError):
    """A rank of the gang failed or its worker died; the message names both. ``retryable`` is
    false when relaunching cannot help (the rank refused the configuration, a rank callback
    asked for what its view does not offer, the run root is full, or the rank may no longer
    commit: its run folder's lease was taken over)."""

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        worker: str,
        retryable: bool = True,
        kind: type[RunError] = RunError,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.worker = worker
        self.retryable = retryable
        self.kind = kind  # what the driver raises when it is not retried (Diverged: a trial's
        # search tells a diverged config from a failed one)


def _on_worker(client: Client, fn: Callable[[], Any], addr: str, timeout_s: float = 60) -> Any:
    """``fn()`` on the worker ``addr``; a :class:`GangError` (the gang is relaunched) when that
    worker leaves the cluster meanwhile -- after a worker died, the scheduler may still list
    it when the gang is relaunched, and a task pinned to it would wait forever."""
    future = client.submit(fn, workers=[addr], allow_other_workers=False, pure=False)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return future.result(timeout=1)
        except TimeoutError:
            pass
        alive = _polled(client)
        gone = alive is not None and addr not in alive
        if gone or time.monotonic() > deadline:
            future.cancel()
            raise GangError(
                f"rank 0's worker {addr} " + ("left the cluster" if gone else "did not answer"),
                rank=0,
                worker=addr,
            )


def free_port() -> int:
    """A free TCP port on this host (run on the worker that will host the rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def live_workers(client: Client) -> dict[str, dict[str, Any]]:
    """The scheduler's workers (address -> info), asked of the scheduler now.

    Not ``client.scheduler_info()``: that returns the client's cache, which its periodic refresh
    (every 2 s) replaces with an answer listing no worker, so a read racing the refresh sees an
    empty cluster (a CI run launched a gang of 0 ranks; 152 of 500 reads with a 1-ms refresh).
    """
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1)
    except OSError as err:
        raise KgpipeError(f"lost the Dask scheduler {client.scheduler.address}: {err}") from None
    return dict(info["workers"])


def _polled(client: Client) -> set[str] | None:
    """The live workers' addresses for a poll of the gang, None when the scheduler did not
    answer this time (the poll is skipped: a rank's own failure, or the next poll, tells)."""
    try:
        return set(live_workers(client))
    except KgpipeError as err:
        log.debug("a poll of the gang's workers: %s", err)
        return None


def pick_workers(client: Client, n: int) -> list[str]:
    """``n`` worker addresses, in a stable order; a retryable :class:`GangError` when fewer
    are alive (one left since the gang was sized: it is relaunched on those alive then)."""
    if n < 1:
        raise KgpipeError(f"a gang needs at least one worker, not {n}")
    workers = sorted(live_workers(client))
    if len(workers) < n:
        raise GangError(
            f"the Dask cluster has {len(workers)} workers, the gang needs {n}",
            rank=len(workers),
            worker="",
        )
    return workers[:n]


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0]


def launch_gang(
    client: Client,
    fn: Callable[..., Any],
    make_spec: Callable[[int, str, int], Any],
    *,
    world_size: int,
    queue: str | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 0.25,
) -> list[Any]:
    """Run ``fn(make_spec(rank, master_addr, master_port))`` on ``world_size`` workers.

    ``make_spec(rank, master_addr, master_port)`` builds each rank's argument; the ranks find
    a fresh rendezvous port on rank 0's host. Events that ranks put on the Dask queue named
    ``queue`` are passed to ``on_event`` as they arrive. Returns the ranks' results.
    """
    workers = pick_workers(client, world_size)
    master = _host(workers[0])
    port = _on_worker(client, free_port, workers[0])
    tag = uuid.uuid4().hex[:8]
    futures: list[Future] = []
    for rank, addr in enumerate(workers):
        futures.append(
            client.submit(
                fn,
                make_spec(rank, master, port),
                workers=[addr],
                allow_other_workers=False,
                pure=False,
                retries=0,
                key=f"kgpipe-rank-{rank}-{tag}",
            )
        )
    events = Queue(queue, client=client) if queue else None
    missing: set[int] = set()
    try:
        while True:
            time.sleep(poll_s)
            _drain(events, on_event)
            for rank, fut in enumerate(futures):
                if fut.status == "error":
                    exc = fut.exception()
                    dead = _dead_rank(client, workers, poll_s)
                    if dead is not None and dead != rank:  # the root cause, not its echo
                        log.debug("rank %d failed after rank %d's worker died: %r", rank, dead, exc)
                        raise GangError(
                            f"rank {dead}'s worker {workers[dead]} died (process killed or lost)",
                            rank=dead,
                            worker=workers[dead],
                        )
                    raise GangError(
                        f"rank {rank} on worker {workers[rank]} failed: "
                        f"{type(exc).__name__}: {exc}",
                        rank=rank,
                        worker=workers[rank],
                        retryable=not isinstance(
                            exc, ConfigError | NotInViewError | StorageFull | Fenced | Diverged
                        ),
                        kind=Diverged if isinstance(exc, Diverged) else RunError,
                    )
                if fut.status == "cancelled":
                    raise GangError(
                        f"rank {rank} on worker {workers[rank]} was cancelled",
                        rank=rank,
                        worker=workers[rank],
                    )
            if all(f.status == "finished" for f in futures):
                _drain(events, on_event)
                return [f.result() for f in futures]
            alive = _polled(client)
            if alive is None:
                continue
            for rank, addr in enumerate(workers):
                if addr in alive or futures[rank].status == "finished":
                    missing.discard(rank)
                elif rank not in missing:  # confirm on the next poll before failing the gang
                    missing.add(rank)
                else:
                    raise GangError(
                        f"rank {rank}'s worker {addr} died (process killed or lost)",
                        rank=rank,
                        worker=addr,
                    )
    except BaseException:
        client.cancel(futures, force=True)
        raise
    finally:  # the scheduler drops a queue once every holder closed it (it kept each gang's)
        if events is not None:
            with contextlib.suppress(Exception):
                events.close()


def _dead_rank(client: Client, workers: list[str], poll_s: float) -> int | None:
    """The rank whose worker left the cluster (checked twice, a poll apart), if any."""
    for _ in range(2):
        time.sleep(poll_s)
        alive = _polled(client)
        for rank, addr in enumerate(workers):
            if alive is not None and addr not in alive:
                return rank
    return None


def _drain(queue: Queue | None, on_event: Callable[[dict[str, Any]], None] | None) -> None:
    if queue is None:
        return
    while True:
        try:
            n = queue.qsize()
        except Exception:
            return
        if not n:
            return
        for item in queue.get(batch=n):
            if on_event is not None:
                on_event(item)
