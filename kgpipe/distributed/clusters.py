"""Dask clusters as configuration: the kinds kgpipe starts (``distributed.cluster``), or the
address of an existing scheduler.

``local`` is a :class:`distributed.LocalCluster` on 127.0.0.1, ``cuda`` a dask-cuda
``LocalCUDACluster`` (one worker per GPU); any other value of ``distributed.cluster`` is a
scheduler address (``tcp://host:8786``, ``host:8786``). Opening a client of either, and the
per-worker set-up at worker start, is :mod:`kgpipe.distributed.client`. Dask is imported only
when a cluster starts: the config reads this registry, and reading a config should not load
Dask.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from kgpipe.errors import ConfigError
from kgpipe.registry import Registry

__all__ = [
    "CLUSTERS",
    "QUIET_WORKER_CONFIG",
    "ClusterKind",
    "cluster_kwargs",
    "is_address",
    "worker_environ",
    "worker_threads",
]

_ADDRESS = re.compile(r"^([a-z][a-z0-9+.-]*://)?[^\s/:]+(:\d+)?/?$", re.IGNORECASE)


#: Dask's own comm schemes; a plug-in's are asked of Dask (:func:`_dask_knows`)
_SCHEMES = ("tcp", "tls", "inproc", "ucx", "ws", "wss")


def is_address(value: str) -> bool:
    """Whether ``value`` reads as a scheduler address (``tcp://host:port``, ``host:port``): a
    URL of a scheme Dask cannot connect with (``s3://bucket``) is none."""
    if "://" in value:
        scheme = value.split("://", 1)[0].lower()
        return scheme in _SCHEMES or _dask_knows(scheme)
    return ":" in value and bool(_ADDRESS.match(value))


def _dask_knows(scheme: str) -> bool:
    """Whether a comm backend is registered for ``scheme`` (Dask's entry points)."""
    try:
        from distributed.comm.registry import get_backend
    except ImportError:  # pragma: no cover -- Dask is a core dependency
        return False
    try:
        get_backend(scheme)
    except ValueError:
        return False
    return True


def worker_threads(workers: int, threads_per_worker: int | None, cores: int | None = None) -> int:
    """torch threads per worker so that the machine is not oversubscribed."""
    from kgpipe.process import available_cores  # here: the config imports this module

    if threads_per_worker:
        return threads_per_worker
    return max(1, (cores or available_cores()) // workers)


def _drop_dask_malloc_trim() -> None:
    """Any Dask nanny started earlier in this process (a plain LocalCluster in a notebook, a
    flow, a test) wrote Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` into ``os.environ`` before
    spawning its worker, for good; every worker spawned later inherited it, ours too (see
    :func:`worker_environ`). Dask's own value is removed; a user's other value stays."""
    import os

    if os.environ.get("MALLOC_TRIM_THRESHOLD_") == "65536":
        del os.environ["MALLOC_TRIM_THRESHOLD_"]


def worker_environ(threads: int) -> dict[str, str]:
    """Environment of the worker processes we start.

    Dask's default sets ``MALLOC_TRIM_THRESHOLD_=65536``, which makes glibc return memory to the
    OS on nearly every free and slows training steps several times over (docs/distributed.md);
    we leave malloc alone and give OpenMP/BLAS the worker's share of the cores.
    """
    from kgpipe.process import thread_environ  # imports torch: not when a config is read

    return thread_environ(threads)


# Event-loop housekeeping of the worker processes we start, made less frequent. A rank's step
# loop is Python-heavy; every wake-up of the worker's event loop thread takes the GIL from it.
# Dask's defaults are a 20 ms "tick" (only measures event-loop latency, for a warning) and a
# 500 ms system monitor (psutil samples for the dashboard). Measured against the in-process loop
# in docs/benchmarks.md ("The 1-worker overhead"). Heartbeats, the memory monitor and worker-ttl
# are untouched.
QUIET_WORKER_CONFIG: dict[str, Any] = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.tick.limit": "30s",
    "distributed.admin.system-monitor.interval": "5s",
}


def cluster_kwargs(workers: int, memory_limit: int | str | None = None) -> dict[str, Any]:
    """Keyword arguments of the LocalCluster of ``workers`` workers (pure, tested alone);
    ``memory_limit`` per worker (None: Dask's default, the machine's memory shared)."""
    extra = {} if memory_limit is None else {"memory_limit": memory_limit}
    return {
        **extra,
        "n_workers": workers,
        "threads_per_worker": 1,  # one rank per worker; torch uses its own threads
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": logging.ERROR,
    }


class ClusterKind(ABC):
    """A kind of cluster kgpipe starts itself (and closes when the run ends)."""

    name: ClassVar[str]

    @abstractmethod
    def start(
        self,
        *,
        workers: int,
        threads: int,
        env: dict[str, str],
        worker_ttl_s: float,
        memory_limit: int | None = None,
    ) -> Any:
        """Start the cluster's scheduler and ``workers`` workers (not yet waited for), each
        with ``memory_limit`` bytes (None: the kind's default)."""


CLUSTERS: Registry[ClusterKind] = Registry(
    "cluster", doc="Dask clusters kgpipe starts: distributed.cluster (else a scheduler address)"
)


@CLUSTERS.register("local")
class Local(ClusterKind):
    """A LocalCluster of worker processes on 127.0.0.1 (CPU)."""

    def start(
        self,
        *,
        workers: int,
        threads: int,
        env: dict[str, str],
        worker_ttl_s: float,
        memory_limit: int | None = None,
    ) -> Any:
        import dask
        from distributed import LocalCluster

        settings = {
            "distributed.nanny.pre-spawn-environ": {**worker_environ(threads), **env},
            "distributed.scheduler.worker-ttl": f"{worker_ttl_s}s",
            # the statistical profiler samples every worker thread's stack every 10 ms under the
            # GIL, competing with the rank's Python-side step loop; the dashboard's other pages
            # (task stream, progress, memory) stay
            "distributed.worker.profile.enabled": False,
            **QUIET_WORKER_CONFIG,
        }
        _drop_dask_malloc_trim()
        with dask.config.set(settings):
            return LocalCluster(**cluster_kwargs(workers, memory_limit))


@CLUSTERS.register("cuda")
class Cuda(ClusterKind):
    """A dask-cuda LocalCUDACluster: one worker per visible GPU (the ``gpu`` extra)."""

    def start(
        self,
        *,
        workers: int,
        threads: int,
        env: dict[str, str],
        worker_ttl_s: float,
        memory_limit: int | None = None,
    ) -> Any:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise ConfigError(
                "distributed.cluster=cuda needs dask-cuda: pip install 'kgpipe[gpu]'"
            ) from None
        import dask
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("distributed.cluster=cuda: no CUDA GPU is visible to torch")
        settings = {
            "distributed.nanny.pre-spawn-environ": env,
            "distributed.scheduler.worker-ttl": f"{worker_ttl_s}s",
            "distributed.worker.profile.enabled": False,
            **QUIET_WORKER_CONFIG,
        }
        _drop_dask_malloc_trim()
        with dask.config.set(settings):
            extra = {} if memory_limit is None else {"memory_limit": memory_limit}
            return LocalCUDACluster(n_workers=workers, **extra)
