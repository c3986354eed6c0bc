"""Where training and evaluation run: the CPU or a CUDA GPU (``training.device``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kgpipe.errors import ConfigError
from kgpipe.models.interactions import INTERACTIONS

__all__ = [
    "device_memory",
    "native_bf16",
    "process_group_backend",
    "resolve_device",
    "resolve_precision",
    "worker_memory",
]


def resolve_device(setting: str, *, cluster: str | None = None) -> torch.device:
    """The device of ``training.device`` in this process.

    * ``cpu``: the CPU.
    * ``cuda``: the current CUDA device; a :class:`ConfigError` when torch sees no GPU. On a
      dask-cuda worker that is the worker's own GPU (``CUDA_VISIBLE_DEVICES`` lists it first).
    * ``auto``: a GPU when torch sees one, else the CPU -- except for ranks of a plain
      ``LocalCluster`` (``cluster="local"``): its worker processes all see the same GPUs, so
      they train on the CPU; use ``distributed.cluster: cuda`` for one GPU per worker.

    ``cluster`` is ``distributed.cluster`` for a Dask rank, ``None`` in a single process.
    """
    if setting == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if setting == "cuda":
        if not available:
            raise ConfigError(
                "training.device=cuda: torch sees no CUDA GPU here "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})"
            )
        return torch.device("cuda", torch.cuda.current_device())
    if setting != "auto":
        raise ConfigError(f"training.device={setting!r}: expected auto, cpu or cuda")
    if available and cluster != "local":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank_gpu(setting: str, cluster: str | None) -> torch.device | None:
    """The GPU a rank started here would train on; None for the CPU, or where the setting
    cannot be met (the rank reports that itself, in one line)."""
    try:
        device = resolve_device(setting, cluster=cluster)
    except ConfigError:
        return None
    return device if device.type == "cuda" else None


def device_identity(setting: str, cluster: str | None) -> str | None:
    """Which physical device a rank started here would train on: ``host/GPU uuid``, or ``None``
    for the CPU (run on each worker before a gang launches: NCCL refuses two ranks on one GPU)."""
    import socket

    device = _rank_gpu(setting, cluster)
    if device is None:
        return None
    props = torch.cuda.get_device_properties(device)
    return f"{socket.gethostname()}/{getattr(props, 'uuid', device.index)}"


def worker_memory(setting: str, cluster: str | None) -> dict[str, Any]:
    """What a worker holds now (``rss``: its process's resident bytes, read now: the
    scheduler's figure is sampled every few seconds, and at a first launch predates torch) and
    its card's ``gpu`` memory (:func:`device_memory`), run on each worker before a gang."""
    import psutil

    return {"rss": int(psutil.Process().memory_info().rss), "gpu": device_memory(setting, cluster)}


def device_memory(setting: str, cluster: str | None) -> dict[str, int] | None:
    """The GPU memory a rank started here could use, ``{"free": bytes, "total": bytes}``, or
    ``None`` where it would train on the CPU (run on each worker before a gang launches: the
    memory check counts what lives on the card against the card, not the worker's limit).
    Memory torch's allocator holds in this process but no tensor uses (a previous gang's) is
    counted as free: a rank started here reuses it."""
    device = _rank_gpu(setting, cluster)
    if device is None:
        return None
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return {"free": int(free), "total": int(total)}


def shared_devices(identities: dict[str, str | None]) -> dict[str, list[str]]:
    """``{device: [worker, ...]}`` of every GPU that more than one worker would train on."""
    by_device: dict[str, list[str]] = {}
    for worker, ident in identities.items():
        if ident is not None:
            by_device.setdefault(ident, []).append(worker)
    return {d: sorted(w) for d, w in by_device.items() if len(w) > 1}


def process_group_backend(setting: str, device: torch.device) -> str:
    """The torch.distributed backend for ``distributed.backend`` and the training device:
    ``auto`` is NCCL for CUDA tensors and gloo for CPU tensors."""
    if setting == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if setting == "nccl" and device.type != "cuda":
        raise ConfigError(
            "distributed.backend=nccl needs CUDA tensors, but this rank trains on the CPU "
            "(set training.device=cuda, or use backend auto or gloo)"
        )
    return setting


def native_bf16(device: torch.device, cpu_flags: str | None = None) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware.

    CUDA: what torch reports (Ampere and newer). CPU: the ``avx512_bf16`` or ``amx_bf16`` flag
    in ``/proc/cpuinfo`` (``cpu_flags`` replaces the file's text, for tests); without them,
    bfloat16 products are emulated, which is slower than float32 (docs/benchmarks.md, bf16
    under "What was tuned"). Unknown (no ``/proc/cpuinfo``): no.
    """
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if cpu_flags is None:
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set(cpu_flags.split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_precision(setting: str, model: str, device: torch.device) -> str:
    """``fp32`` or ``bf16`` for ``training.precision`` on ``device``: ``auto`` is bf16 for the
    bilinear models (matrix products worth running in bf16) where the device has native
    bfloat16 products, else fp32."""
    if setting != "auto":
        return setting
    return "bf16" if INTERACTIONS.get(model).bilinear and native_bf16(device) else "fp32"
