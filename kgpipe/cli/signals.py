"""Ctrl-C and SIGTERM still end a command when their exception is swallowed.

A signal handler raises in whatever Python code the main thread runs when the signal lands. If
that code was called from C that cannot pass an exception on (a ``__del__``, a weakref callback,
an ``isinstance`` check inside an extension), Python prints "Exception ignored in ..." with a
traceback and carries on: the interrupt is gone and the command runs to its end. (Seen in CI: a
SIGTERM that landed in such a place while the Prefect flow trained; Prefect's own SIGTERM handler
raised, the exception was swallowed, and ``kgpipe train`` finished its epochs with exit 0.)

``resend_swallowed_signals()`` installs a ``sys.unraisablehook`` that recognises such an
exception in the main thread and, without printing it, has the same signal sent again:
- from another thread, ``RESEND_AFTER_S`` later (sent from the hook itself, the handler would
  raise inside the hook, where it is swallowed again); a signal swallowed again is sent again,
  and after ``QUIET_RESENDS`` swallows the reports are printed as well;
- or, if the command ends before that, as the block exits, so that it ends as interrupted;
- not at all when the command is already ending for a signal (a second Ctrl-C landing in a
  ``__del__`` during the clean-up does not interrupt the clean-up), or when the signal is no
  longer handled by Python code (ignored, or at its default).

Not covered: an exception that C code clears without reporting it (``PyErr_Clear``), and signals
of threads other than the main one (Python runs handlers in the main thread only).
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Terminated", "resend_swallowed_signals", "signal_of"]

RESEND_AFTER_S = 0.05  # time for the main thread to leave the code that swallowed it
QUIET_RESENDS = 3  # swallowed this often: print the reports too (something keeps swallowing)


class Terminated(BaseException):
    """SIGTERM, raised where the main thread is, so that ``with`` blocks and ``finally`` run
    (the run folder's lease is released, the Dask cluster and the Prefect server stopped)."""


def signal_of(exc: BaseException | None) -> int | None:
    """The signal that ``exc`` was raised for, or None: KeyboardInterrupt (SIGINT), kgpipe's
    ``Terminated`` (SIGTERM), and any non-``Exception`` carrying an int ``signal`` attribute,
    as Prefect's ``TerminationSignal`` does (recognised by shape: ``kgpipe`` does not import
    Prefect)."""
    if exc is None:
        return None
    if isinstance(exc, KeyboardInterrupt):
        return int(signal.SIGINT)
    if isinstance(exc, Terminated):
        return int(signal.SIGTERM)
    sig = getattr(exc, "signal", None)
    if not isinstance(exc, Exception) and isinstance(sig, int) and not isinstance(sig, bool):
        return sig
    return None


def _handled_by_python(sig: int) -> bool:
    return callable(signal.getsignal(sig))


class _Pending:
    """The signal swallowed and not yet sent again (at most one), shared with the sender."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # the hook may run again inside itself (a __del__)
        self.sig: int | None = None
        self.open = True  # the block has not exited: the sender may still send
        self.swallowed = 0

    def take(self) -> int | None:
        with self.lock:
            sig, self.sig = self.sig, None
            return sig


def _send_later(pending: _Pending) -> None:
    time.sleep(RESEND_AFTER_S)
    with pending.lock:  # under the lock: the block's exit sees either it sent or it did not
        if not pending.open:
            return
        sig = pending.take()
        if sig is not None and _handled_by_python(sig):
            os.kill(os.getpid(), sig)


@contextmanager
def resend_swallowed_signals() -> Iterator[None]:
    """While open (in the main thread), a signal's exception swallowed in the main thread is
    followed by the same signal again (see the module's docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = sys.unraisablehook
    pending = _Pending()

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        sig = signal_of(unraisable.exc_value)
        if (
            sig is None
            or threading.current_thread() is not threading.main_thread()
            or not _handled_by_python(sig)
        ):
            previous(unraisable)
            return
        with pending.lock:
            if not pending.open:  # a stale hook, put back by another's restore: report it
                previous(unraisable)
                return
            if signal_of(sys.exc_info()[1]) is not None:
                return  # already ending for a signal: this one would interrupt the clean-up
            pending.swallowed += 1
            if pending.sig is None:
                pending.sig = sig
                # not threading.Thread: its start takes a lock the main thread may hold here
                _thread.start_new_thread(_send_later, (pending,))
        if pending.swallowed > QUIET_RESENDS:
            previous(unraisable)

    sys.unraisablehook = hook
    ended_by_signal = False
    try:
        yield
    except BaseException as exc:
        ended_by_signal = signal_of(exc) is not None
        raise
    finally:
        with pending.lock:
            pending.open = False
            sig = pending.take()
        if sys.unraisablehook is hook:
            sys.unraisablehook = previous
        if sig is not None and not ended_by_signal and _handled_by_python(sig):
            signal.raise_signal(sig)  # swallowed just before the end: the handler runs here
