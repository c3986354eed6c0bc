"""Ctrl-C and SIGTERM are never lost, even when their exception is swallowed.

A signal handler raises in whatever Python code the main thread runs when the signal lands. If
that code was called from C that cannot pass an exception on (a ``__del__``, a weakref callback,
an ``isinstance`` check inside an extension), Python prints "Exception ignored in ..." with a
traceback and carries on: the interrupt is gone and the command runs to its end. (Seen in CI: a
SIGTERM that landed in such a place while the Prefect flow trained; Prefect's own SIGTERM handler
raised, the exception was swallowed, and ``kgpipe train`` finished its 60 epochs with exit 0.)

``resend_swallowed_signals()`` installs a ``sys.unraisablehook`` that recognises such an
exception and sends the same signal to the process again, quietly. It sends it from another
thread, a moment later: sent from the hook itself, the handler would raise inside the hook, where
it is swallowed again. Other unraisable exceptions go to the hook that was there before.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kgpipe.cli.output import Terminated

__all__ = ["resend_swallowed_signals", "signal_of"]

RESEND_AFTER_S = 0.05  # time for the main thread to leave the code that swallowed it


def signal_of(exc: BaseException | None) -> int | None:
    """The signal that ``exc`` was raised for, or None: KeyboardInterrupt (SIGINT), kgpipe's
    ``Terminated`` (SIGTERM), and any non-``Exception`` carrying an int ``signal`` attribute,
    as Prefect's ``TerminationSignal`` does (named by shape: the library never imports Prefect)."""
    if isinstance(exc, KeyboardInterrupt):
        return int(signal.SIGINT)
    if isinstance(exc, Terminated):
        return int(signal.SIGTERM)
    sig = getattr(exc, "signal", None)
    if exc is not None and not isinstance(exc, Exception) and isinstance(sig, int):
        return sig
    return None


def _resend(sig: int) -> None:
    timer = threading.Timer(RESEND_AFTER_S, os.kill, (os.getpid(), sig))
    timer.daemon = True
    timer.start()


@contextmanager
def resend_swallowed_signals() -> Iterator[None]:
    """While open, a signal's exception swallowed in the main thread is followed by the same
    signal again (see the module's docstring)."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        sig = signal_of(unraisable.exc_value)
        if sig is not None and threading.current_thread() is threading.main_thread():
            _resend(sig)
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
