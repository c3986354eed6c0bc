"""Why a worker's peak is read from ``VmHWM`` and not ``ru_maxrss`` (bench.common.peak_rss).

A child started with multiprocessing's ``spawn`` (as a Dask nanny starts its worker) reads its
``ru_maxrss`` and ``VmHWM`` before and after the parent touched 800 MB: ``ru_maxrss`` becomes
the parent's peak, to the byte; ``VmHWM`` stays the child's own. Linux only.

    .venv/bin/python bench/peak_probe.py
"""

from __future__ import annotations

import multiprocessing as mp
import resource
from typing import Any


def _child(q: Any) -> None:
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    q.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, hwm))


def _probe(ctx: Any, tag: str) -> None:
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    maxrss, hwm = q.get()
    p.join()
    print(f"{tag}: child ru_maxrss {maxrss:,} KiB, child VmHWM {hwm:,} KiB")


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    _probe(ctx, "before the parent grows")
    block = bytearray(800 * 1024 * 1024)  # zero-filled: every page touched
    del block
    print(f"parent ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss:,} KiB")
    _probe(ctx, "after")
