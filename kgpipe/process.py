"""Process-wide settings, made in one place: torch threads, the allocator, deterministic kernels.

Called by the CLI, the in-process launcher and the Dask worker plugin (and a rank's task thread,
since OpenMP's thread count belongs to the calling thread). Nothing here runs at import.

**Sharing the machine.** Intra-op threads of torch (OpenMP) spin-wait at the end of every
parallel region. Alone that is the fastest setting, but next to another busy process one of our
threads is descheduled while the other spins for it, and a run slows down several times over
(docs/benchmarks.md, "Sharing the machine"). A static single thread avoids that but gives up much
of the speed of running alone (most for the 1-vs-all matrix products). So unless
``training.threads`` pins the count, a :class:`ThreadGovernor` measures how much CPU the *other*
processes use (``/proc/stat`` minus this process's own time) every second and runs with the
cores they leave free: all of them alone, fewer next to a busy neighbour or a second kgpipe run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "ThreadGovernor",
    "available_cores",
    "check_guarded_script",
    "check_not_reimported",
    "configure",
    "cpu_sample",
    "retain_freed_memory",
    "thread_environ",
]

log = logging.getLogger("kgpipe.process")


def check_not_reimported(what: str) -> None:
    """Refuse to start ``what`` from the top level of a script that a new process is importing.

    Dask's workers (and any ``multiprocessing`` process started by spawning) import the main
    script again, as ``__mp_main__``: a script that trains at its top level, not under
    ``if __name__ == "__main__":``, trained again in every worker as it started, which failed on
    the run folder the first process holds, with an error about another writer."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            from kgpipe.errors import KgpipeError

            raise KgpipeError(
                f"{what} was called while a new process (a Dask worker) imported the script "
                f"{frame.f_globals.get('__file__', '')}: put the call under "
                '`if __name__ == "__main__":`, as a new process imports the script again'
            )
        frame = frame.f_back  # type: ignore[assignment]


def _unguarded_call_in_main() -> tuple[str, int] | None:
    """The script and line of a call from its top level outside ``if __name__ == "__main__":``,
    or None (no script, a guarded call, or anything not understood)."""
    import ast

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None
    spec = getattr(main, "__spec__", None)
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return None  # `python -m package`: multiprocessing does not import it again
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None

    def names_main(node: ast.AST) -> bool:  # `__name__` compared with "__main__", any form
        return any(
            isinstance(c, ast.Compare)
            and {"__name__"} <= {n.id for n in ast.walk(c) if isinstance(n, ast.Name)}
            and any(isinstance(k, ast.Constant) and k.value == "__main__" for k in ast.walk(c))
            for c in ast.walk(node)
        )

    def exits(node: ast.If) -> bool:  # its body ends the script: `sys.exit()`, `raise ...`
        last = node.body[-1]
        call = last.value if isinstance(last, ast.Expr) else None
        func = call.func if isinstance(call, ast.Call) else None
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        return isinstance(last, ast.Raise) or name in ("exit", "_exit", "quit")

    for node in ast.walk(tree):
        # the call inside such a test's `if`, or after an early exit at the top level
        # (`if __name__ != "__main__": sys.exit()`): guarded, or not understood -- not refused
        if isinstance(node, ast.If) and names_main(node.test):
            end = getattr(node, "end_lineno", None) or node.lineno
            if node.lineno <= line <= end:
                return None
            if node in tree.body and node.lineno < line and exits(node):
                return None
    return path, line


def check_guarded_script(what: str) -> None:
    """Refuse to start new processes (``what``: a Dask cluster's workers) from the top level
    of a script outside ``if __name__ == "__main__":``: each process imports the script again
    and would run the call again (:func:`check_not_reimported` stops it there, but the parent
    then only hears that its workers failed to start)."""
    found = _unguarded_call_in_main()
    if found is not None:
        from kgpipe.errors import KgpipeError

        raise KgpipeError(
            f"{found[0]}, line {found[1]}: {what} starts new processes, which import this script "
            'again and would run this call again: put it under `if __name__ == "__main__":`'
        )


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_retaining = False


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_environ(threads: int) -> dict[str, str]:
    """Environment that sizes OpenMP/MKL/OpenBLAS pools of a process started with it."""
    t = str(threads)
    return {"OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t}


def configure(
    *, threads: int | None, allocator: str = "retain", deterministic: bool = True
) -> None:
    """Apply the process settings of a run (``training.threads``, ``.allocator``,
    ``.deterministic``). ``threads=None`` leaves the count to a :class:`ThreadGovernor`."""
    if threads:
        torch.set_num_threads(threads)
    if allocator == "retain":
        retain_freed_memory()
    # warn_only: a kernel without a deterministic variant warns instead of failing the run
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def retain_freed_memory() -> bool:
    """Keep freed CPU buffers in this process's heap instead of handing them back to the OS.

    glibc serves every allocation above its mmap threshold (at most 32 MiB by default) with a
    fresh ``mmap`` and unmaps it on free, so a training step that allocates a
    (batch x entities) score matrix of hundreds of MiB page-faults all of it in again on every
    step. Raising the mmap and trim thresholds (``mallopt``, what ``MALLOC_MMAP_THRESHOLD_`` does
    from the environment) lets the next step reuse the pages (measured in docs/benchmarks.md,
    "Where freed memory goes"). The price is that the process keeps its peak heap instead of
    shrinking between steps.

    Applies to the whole process, once; a no-op (``False``) off Linux or without glibc.
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


# torch's own default thread count (OMP_NUM_THREADS, else the physical cores), read before
# anything here changes it: the most a governor uses unless told otherwise
_DEFAULT_THREADS = torch.get_num_threads()
_STAT = Path("/proc/stat")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
Sample = tuple[float, float]  # (busy CPU seconds of the cores we may use, our own CPU seconds)


def _cpus() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def cpu_sample(cpus: frozenset[int] | None = None) -> Sample | None:
    """CPU seconds run on the cores in ``cpus`` (all when None) by every process, the
    hypervisor's stolen time included, and this process's own CPU seconds; None without
    ``/proc/stat``."""
    try:
        lines = _STAT.read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        fields = line.split()
        if cpus is not None and int(fields[0][3:]) not in cpus:
            continue
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        v = [int(x) for x in fields[1:9]]
        busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    t = os.times()
    return busy / _TICK, t.user + t.system


class ThreadGovernor:
    """Sizes torch's intra-op threads to the cores other processes leave free.

    :meth:`tick` is cheap and meant to be called often (every training step, every evaluation
    chunk) from the thread that runs the computation; at most every ``interval_s`` it compares
    the busy time of the cores this process may use with its own and sets ``cores - others``
    threads (at least 1, at most ``cap``), rounding 0.3 of a core up so that a light neighbour
    does not halve a run. ``cap`` defaults to torch's own default (``OMP_NUM_THREADS``, else the
    physical cores). Where ``/proc/stat`` is missing it keeps ``cap`` threads. ``sample``
    replaces the measurement (tests).
    """

    def __init__(
        self,
        cap: int | None = None,
        *,
        interval_s: float = 1.0,
        sample: Callable[[], Sample | None] | None = None,
    ) -> None:
        self.cores = available_cores()
        self.cap = max(1, min(cap or _DEFAULT_THREADS, self.cores))
        self.interval_s = interval_s
        self.threads = self.cap
        self.changes = 0
        cpus = _cpus()
        self._sample = sample or (lambda: cpu_sample(cpus))
        self._last: tuple[float, Sample] | None = None
        self._next = 0.0

    def start(self) -> ThreadGovernor:
        """Begin with ``cap`` threads; the first decision follows after a quarter interval (a
        neighbour already running costs the first fraction of a second, not an interval)."""
        torch.set_num_threads(self.threads)
        first = self._sample()
        self._last = (time.monotonic(), first) if first is not None else None
        self._next = time.monotonic() + self.interval_s / 4
        return self

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next or self._last is None:
            return
        sample = self._sample()
        if sample is None:
            self._last = None  # no /proc/stat: stay at cap
            return
        then, last = self._last
        others = max(0.0, (sample[0] - last[0]) - (sample[1] - last[1])) / max(now - then, 1e-9)
        self._last, self._next = (now, sample), now + self.interval_s
        target = max(1, min(self.cap, int(self.cores - others + 0.3)))
        if target != self.threads:
            log.info(
                "torch threads %d -> %d (other processes use %.1f of %d cores)",
                self.threads, target, others, self.cores,
            )  # fmt: skip
            torch.set_num_threads(target)
            self.threads = target
            self.changes += 1
