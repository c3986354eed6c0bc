"""A client of the configured Dask cluster: one started here (a registered kind, closed on
exit) or an existing scheduler, and the set-up every worker runs at its start."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import torch
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

from kgpipe.distributed.clusters import CLUSTERS, worker_threads
from kgpipe.distributed.gang import live_workers
from kgpipe.errors import KgpipeError
from kgpipe.process import available_cores, check_guarded_script, configure, thread_environ

__all__ = ["TorchWorkerSetup", "open_cluster"]


class _NotARankFailure(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            str(record.msg).startswith("Compute Failed") and "kgpipe-rank-" in record.getMessage()
        )


# in a worker process: set by the driver (over client.run) just before it closes the cluster
_closing = threading.Event()


def _cluster_closing() -> None:
    _closing.set()


class _QuietClose(logging.Filter):
    """A worker's heartbeat that meets the scheduler already closing is part of a normal
    shutdown, not an error: Dask logs it with a 25-line CommClosedError traceback (seen at the
    end of one demo run in two). Dropped only once the driver said the cluster is closing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_closing.is_set() and "heartbeat" in str(record.msg))


# In a worker process: what kgpipe's set-ups changed, as it was before the first of them, and
# the set-ups in force (name -> environment, threads), latest last. Runs that share an existing
# scheduler overlap on its workers: the worker keeps the latest run's settings while any is in
# force, and gets its own back when the last one leaves.
_lock = threading.Lock()
_active: dict[str, tuple[dict[str, str], int]] = {}
_original_env: dict[str, str | None] = {}
_original: tuple[int, bool, bool] | None = None  # threads, deterministic, warn_only
_filters: list[logging.Filter] = []


def _apply(environ: dict[str, str], threads: int) -> None:
    for key in environ:
        _original_env.setdefault(key, os.environ.get(key))
    os.environ.update(environ)
    configure(threads=threads, allocator="system")


def _restore_env() -> None:
    for key, value in _original_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class TorchWorkerSetup(WorkerPlugin):
    """Per-worker set-up at worker start: the worker's share of torch threads, its environment.

    Removing the plugin (:func:`open_cluster` does, from the workers of a scheduler it did not
    start) puts back what it changed once no other run's set-up is in force on the worker: the
    environment, torch's thread count and deterministic setting, the log filters (while one
    is, the worker takes the latest such run's settings). Each registration has its own name,
    so one run never removes another's."""

    def __init__(
        self, threads: int | None, env: dict[str, str] | None = None, *, owned: bool = False
    ) -> None:
        self.threads = threads  # None: the worker's own Dask thread count (its host's share)
        self.env = dict(env or {})
        self.owned = owned
        self.name = f"kgpipe-torch-setup-{uuid.uuid4().hex[:8]}"

    def setup(self, worker: Any) -> None:
        global _original
        dask_threads = getattr(getattr(worker, "state", None), "nthreads", 0)
        threads = self.threads or max(1, int(dask_threads or available_cores()))
        environ = {**self.env, **thread_environ(threads)}
        with _lock:
            if not _active:
                _original = (
                    torch.get_num_threads(),
                    torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled(),
                )
            _apply(environ, threads)
            _active[self.name] = (environ, threads)
            # a rank's failure reaches the driver, which reports it in one line (and relaunches
            # the gang); Dask's own "Compute Failed" block with the task's traceback repeats it
            worker_log = logging.getLogger("distributed.worker")
            for quiet in (_NotARankFailure, _QuietClose):
                if not any(isinstance(f, quiet) for f in worker_log.filters):
                    _filters.append(quiet())
                    worker_log.addFilter(_filters[-1])
        if self.owned and threading.current_thread() is threading.main_thread():
            # a worker of a cluster kgpipe started shares the terminal's process group: a
            # Ctrl-C is the command's to handle (it closes the cluster), not each worker's to
            # die of with a traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def teardown(self, worker: Any) -> None:
        global _original
        if self.owned:
            # a worker of a cluster kgpipe started tears its plugins down as it closes with
            # the cluster, before it stops heartbeating (Dask's Worker.close): a heartbeat
            # already on its way meets the closed scheduler, quietly even when the driver's
            # word that it closes never arrived
            _cluster_closing()
        with _lock:
            if _active.pop(self.name, None) is None:
                return
            _restore_env()
            if _active:  # another run's set-up is in force: its settings
                _apply(*list(_active.values())[-1])
                return
            _original_env.clear()
            if _original is not None:
                threads, deterministic, warn_only = _original
                torch.set_num_threads(threads)
                torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
                _original = None
            if _closing.is_set():  # the worker closes: its last heartbeat stays quiet
                return
            for f in _filters:
                logging.getLogger("distributed.worker").removeFilter(f)
            _filters.clear()


def _check_heartbeats_often(dask_scheduler: Any, every_s: float) -> None:
    """Dask checks for silent workers only every ``worker-ttl``, so a frozen worker is declared
    dead between one and two times the ttl after its last heartbeat (109 s at a 60 s ttl was
    seen). Checking ten times per ttl bounds it at 1.1 times the ttl."""
    callback = dask_scheduler.periodic_callbacks.get("worker-ttl")
    if callback is not None:
        callback.stop()
        callback.callback_time = every_s * 1000
        callback.start()


@contextlib.contextmanager
def open_cluster(
    cluster: str,
    *,
    workers: int,
    threads_per_worker: int | None = None,
    worker_ttl_s: float = 60.0,
    extra_env: dict[str, str] | None = None,
    memory_limit: int | None = None,
    log: Callable[[str], None] | None = None,
) -> Iterator[Client]:
    """A client of ``cluster`` (a registered kind, started here and closed on exit, or a
    scheduler address) with ``workers`` workers ready. ``worker_ttl_s`` is the heartbeat
    timeout of a cluster started here; ``extra_env`` is added to its workers' environment;
    ``memory_limit`` is the bytes of each worker of a cluster started here (an existing
    scheduler's workers keep their own)."""
    say = log or (lambda _m: None)
    threads = worker_threads(workers, threads_per_worker)
    owned: Any = None
    registered: str | None = None
    if cluster in CLUSTERS:
        check_guarded_script(f"the {cluster} Dask cluster")
        owned = CLUSTERS.get(cluster)().start(
            workers=workers,
            threads=threads,
            env=dict(extra_env or {}),
            worker_ttl_s=worker_ttl_s,
            memory_limit=memory_limit,
        )
        try:
            client = Client(owned)
        except BaseException:
            owned.close()
            raise
    else:
        try:
            client = Client(cluster, timeout=30)
        except (OSError, TimeoutError, TypeError, ValueError) as err:
            # a tls:// address without Dask's TLS settings is a TypeError ("TLS expects a
            # ssl_context"): its security comes from Dask's config (distributed.comm.tls.*)
            tls = " (TLS: set Dask's distributed.comm.tls config)" if "TLS" in str(err) else ""
            raise KgpipeError(
                f"cannot connect to the Dask scheduler {cluster}: {err}{tls}"
            ) from None
    try:
        try:
            client.wait_for_workers(workers, timeout=120)
        except TimeoutError:
            have = len(live_workers(client))
            raise KgpipeError(
                f"the Dask cluster has {have} workers, distributed.workers asks for {workers}"
            ) from None
        # an existing scheduler's workers run on other hosts: sized there, not by this one's
        # cores (a 2-core driver gave the ranks of 32-core workers 1 thread each)
        plugin = TorchWorkerSetup(
            threads if owned is not None else threads_per_worker, owned=owned is not None
        )
        client.register_plugin(plugin)
        registered = plugin.name
        if owned is not None:
            client.run_on_scheduler(_check_heartbeats_often, every_s=worker_ttl_s / 10)
        say(f"Dask dashboard: {client.dashboard_link}")
        yield client
    finally:
        if owned is not None:
            # best effort, bounded: a worker that died or froze has nothing to say
            with contextlib.suppress(Exception):
                client.sync(client._run, _cluster_closing, on_error="ignore", callback_timeout=5)
        if owned is None and registered is not None:
            # the scheduler's workers outlive this run: they get back their own settings
            # (best effort, bounded: a scheduler that went away has nothing to undo)
            with contextlib.suppress(Exception):
                client.sync(
                    client._unregister_worker_plugin, name=registered, nanny=False,
                    callback_timeout=10,
                )  # fmt: skip
        client.close()
        if owned is not None:
            owned.close()
