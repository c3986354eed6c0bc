"""Where training and evaluation run: the CPU or a CUDA GPU (``training.device``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

import torch

from kgpipe.errors import ConfigError

__all__ = [
    "native_bf16",
    "process_group_backend",
    "resolve_device",
    "resolve_precision",
    "retain_freed_memory",
]

BF16_MODELS = ("distmult", "complex")  # bilinear scores: matrix products worth running in bf16

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_retaining = False


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
    bfloat16 products are emulated and measured 2.7x *slower* than float32 on a 2-core Xeon
    (docs/benchmarks.md). Unknown (no ``/proc/cpuinfo``): no.
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
    bilinear models where the device has native bfloat16 products, else fp32."""
    if setting != "auto":
        return setting
    return "bf16" if model in BF16_MODELS and native_bf16(device) else "fp32"


def retain_freed_memory() -> bool:
    """Keep freed CPU buffers in this process's heap instead of handing them back to the OS.

    glibc serves every allocation above its mmap threshold (at most 32 MiB by default) with a
    fresh ``mmap`` and unmaps it on free, so a training step that allocates a
    (batch x entities) score matrix of hundreds of MiB page-faults all of it in again on every
    step: on a 2-core AMD EPYC half of a WN18RR 1-vs-all step was kernel time. Raising the mmap
    and trim thresholds (``mallopt``, what ``MALLOC_MMAP_THRESHOLD_`` does from the
    environment) lets the next step reuse the pages: 1.5-1.8x more 1-vs-all triples/s there
    (docs/benchmarks.md, bench/allocator.py). The price is that the process keeps its peak heap instead of
    shrinking between steps.

    Applies to the whole process, once; a no-op (``False``) off Linux or without glibc.
    Called at the start of training (``training.allocator: retain``), never at import.
    """
    global _retaining
    if _retaining:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and friends: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # 1 GiB: larger blocks still get their own mapping; the trim threshold is the largest int
    ok = mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    _retaining = ok
    return ok
