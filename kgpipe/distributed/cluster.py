"""Dask clusters as configuration: a LocalCluster, a LocalCUDACluster, or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import dask
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from kgpipe.config import DistributedConfig, FaultToleranceConfig
from kgpipe.errors import ConfigError, KgpipeError

__all__ = [
    "QUIET_WORKER_CONFIG",
    "TorchWorkerSetup",
    "cluster_kwargs",
    "open_cluster",
    "worker_environ",
    "worker_threads",
]


class TorchWorkerSetup(WorkerPlugin):
    """Per-worker set-up at worker start: torch threads and environment variables."""

    name = "kgpipe-torch-setup"

    def __init__(self, threads: int, env: dict[str, str] | None = None) -> None:
        self.threads = threads
        self.env = dict(env or {})

    def setup(self, worker: Any) -> None:
        import torch

        os.environ.update(self.env)
        os.environ["OMP_NUM_THREADS"] = str(self.threads)
        torch.set_num_threads(self.threads)


def worker_threads(cfg: DistributedConfig, cores: int | None = None) -> int:
    """torch threads per worker so that the machine is not oversubscribed."""
    if cfg.threads_per_worker:
        return cfg.threads_per_worker
    return max(1, (cores or os.cpu_count() or 1) // cfg.workers)


def worker_environ(cfg: DistributedConfig) -> dict[str, str]:
    """Environment of the worker processes we start.

    Dask's default sets ``MALLOC_TRIM_THRESHOLD_=65536``, which makes glibc return memory to the
    OS on nearly every free: measured 4x slower training steps here (41k vs 160k triples/s on
    FB15k-237). We leave malloc alone and give OpenMP/BLAS the worker's share of the cores.
    """
    threads = str(worker_threads(cfg))
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}


# Event-loop housekeeping of the worker processes we start, made less frequent. A rank's step
# loop is Python-heavy; every wake-up of the worker's event loop thread takes the GIL from it.
# Dask's defaults are a 20 ms "tick" (only measures event-loop latency, for a warning) and a
# 500 ms system monitor (psutil samples for the dashboard). With one worker on FB15k-237 the
# Dask path went from +10 % per epoch against the in-process loop to -0.5 % (interleaved rounds,
# docs/benchmarks.md). Heartbeats, the memory monitor and worker-ttl are untouched.
QUIET_WORKER_CONFIG: dict[str, Any] = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.tick.limit": "30s",
    "distributed.admin.system-monitor.interval": "5s",
}


def cluster_kwargs(cfg: DistributedConfig) -> dict[str, Any]:
    """Keyword arguments of the LocalCluster for ``cfg`` (a pure function, tested alone)."""
    return {
        "n_workers": cfg.workers,
        "threads_per_worker": 1,  # one rank per worker; torch uses its own threads
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": logging.ERROR,
    }


@contextlib.contextmanager
def open_cluster(
    cfg: DistributedConfig,
    *,
    log: Callable[[str], None] | None = None,
    fault: FaultToleranceConfig | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Client]:
    """A client of the configured cluster with ``cfg.workers`` workers ready; closes what it
    started. ``fault.worker_ttl_s`` sets the heartbeat timeout of a cluster started here;
    ``extra_env`` is added to its workers' environment (e.g. ``PREFECT_API_URL``)."""
    say = log or (lambda _m: None)
    owned: Any = None
    ttl = f"{(fault or FaultToleranceConfig()).worker_ttl_s}s"
    if cfg.cluster == "local":
        settings = {
            "distributed.nanny.pre-spawn-environ": {**worker_environ(cfg), **(extra_env or {})},
            "distributed.scheduler.worker-ttl": ttl,
            # the statistical profiler samples every worker thread's stack every 10 ms under the
            # GIL, competing with the rank's Python-side step loop; the dashboard's other pages
            # (task stream, progress, memory) stay
            "distributed.worker.profile.enabled": False,
            **QUIET_WORKER_CONFIG,
        }
        with dask.config.set(settings):
            owned = LocalCluster(**cluster_kwargs(cfg))
        client = Client(owned)
    elif cfg.cluster == "cuda":
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise ConfigError(
                "distributed.cluster=cuda needs dask-cuda: pip install 'kgpipe[gpu]'"
            ) from None
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("distributed.cluster=cuda: no CUDA GPU is visible to torch")
        quiet = {"distributed.worker.profile.enabled": False, **QUIET_WORKER_CONFIG}
        with dask.config.set({"distributed.scheduler.worker-ttl": ttl, **quiet}):
            owned = LocalCUDACluster(n_workers=cfg.workers)
        client = Client(owned)
    else:
        try:
            client = Client(cfg.cluster, timeout=30)
        except (OSError, TimeoutError) as err:
            raise KgpipeError(
                f"cannot connect to the Dask scheduler {cfg.cluster}: {err}"
            ) from None
    try:
        try:
            client.wait_for_workers(cfg.workers, timeout=120)
        except TimeoutError:
            have = len(client.scheduler_info()["workers"])
            raise KgpipeError(
                f"the Dask cluster has {have} workers, distributed.workers asks for {cfg.workers}"
            ) from None
        client.register_plugin(TorchWorkerSetup(worker_threads(cfg)))
        say(f"Dask dashboard: {client.dashboard_link}")
        yield client
    finally:
        client.close()
        if owned is not None:
            owned.close()
