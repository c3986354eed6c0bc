"""Where training and evaluation run: the CPU or a CUDA GPU (``training.device``)."""

from __future__ import annotations

import torch

from kgpipe.errors import ConfigError

__all__ = ["process_group_backend", "resolve_device"]


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
