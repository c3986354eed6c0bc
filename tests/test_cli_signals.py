"""A Ctrl-C or SIGTERM whose exception is swallowed (it landed in a ``__del__``, or in Python code
an extension called) still ends the command: the signal is sent again (kgpipe/cli/signals.py).
CI once saw ``kgpipe train`` shrug off a SIGTERM that way and exit 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kgpipe.cli.signals import Terminated, signal_of

REPO = Path(__file__).resolve().parents[1]

# `kgpipe ls` whose work makes an object that sends the signal from its own __del__: the handler
# raises there, where Python can only print "Exception ignored" and go on
SCRIPT = """
import os, signal, sys, time
import kgpipe.cli.ls
from kgpipe.cli.main import main

class SignalledWhileDeleted:
    def __init__(self, sig):
        self.sig = sig

    def __del__(self):
        os.kill(os.getpid(), self.sig)
        sum(range(1000))  # the handler runs here, inside __del__

def then_work(sig):  # the command goes on working after the swallow
    SignalledWhileDeleted(sig)
    for _ in range(20):
        time.sleep(0.1)
    print("ran to the end", file=sys.stderr)

def then_end(sig):  # the command ends right after it
    print("ran to the end", file=sys.stderr)
    SignalledWhileDeleted(sig)

def in_clean_up(sig):  # ending for that signal already: a second one lands in the clean-up
    try:
        os.kill(os.getpid(), sig)
        time.sleep(5)
    finally:
        SignalledWhileDeleted(sig)
        time.sleep(0.3)
        print("cleaned up", file=sys.stderr)

class SleepsWhileDeleted:
    def __del__(self):
        time.sleep(0.2)  # every signal (and every resend) lands here

def keeps_swallowing(sig):  # the main thread spends its time where exceptions are swallowed
    import threading
    threading.Timer(0.1, os.kill, (os.getpid(), sig)).start()
    for _ in range(15):
        SleepsWhileDeleted()
    print("ran to the end", file=sys.stderr)

def run(args, console):
    {case}({sig})
    return 0

kgpipe.cli.ls.run = run
{patch}
sys.exit(main(["ls"]))
"""


def _run(tmp_path: Path, case: str, sig: int, patch: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT).format(case=case, sig=sig, patch=patch)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        # as a terminal runs it: a suite started in the background (CI) ignores SIGINT, and so
        # would the command, which would then not even raise KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize(
    "sig,status,said", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")]
)
@pytest.mark.parametrize("case", ["then_work", "then_end"])
def test_a_signal_swallowed_where_it_landed_still_ends_the_command_quietly(
    tmp_path: Path, case: str, sig: int, status: int, said: str
) -> None:
    done = _run(tmp_path, case, int(sig))
    assert done.returncode == status, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    assert ("ran to the end" in done.stderr) == (case == "then_end"), done.stderr
    assert done.stderr.strip().splitlines()[-1] == said


def test_a_second_signal_swallowed_in_the_clean_up_does_not_interrupt_it(tmp_path: Path) -> None:
    done = _run(tmp_path, "in_clean_up", int(signal.SIGINT))
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-2:] == ["cleaned up", "interrupted"], done.stderr


def test_a_signal_swallowed_again_and_again_is_reported_and_still_ends_the_command(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, "keeps_swallowing", int(signal.SIGTERM))
    assert done.returncode == 143, done.stderr[-3000:]
    # the first swallows quietly sent again; after QUIET_RESENDS, reported as well
    assert "Exception ignored in: <function SleepsWhileDeleted.__del__" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "terminated"


def test_without_the_resend_the_swallowed_signal_is_lost(tmp_path: Path) -> None:
    """The control: what the command did before (the tests above would fail without the fix)."""
    off = (
        "import contextlib; "
        "sys.modules['kgpipe.cli.main'].resend_swallowed_signals = contextlib.nullcontext"
    )
    done = _run(tmp_path, "then_work", int(signal.SIGTERM), patch=off)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception ignored in: <function SignalledWhileDeleted.__del__" in done.stderr
    assert "ran to the end" in done.stderr


class _PrefectLikeTermination(BaseException):  # the shape of prefect's TerminationSignal
    def __init__(self, signal: int) -> None:
        self.signal = signal


def test_the_signal_of_an_exception() -> None:
    assert signal_of(KeyboardInterrupt()) == signal.SIGINT
    assert signal_of(Terminated()) == signal.SIGTERM
    assert signal_of(_PrefectLikeTermination(15)) == 15
    assert signal_of(ValueError("signal")) is None
    error = OSError()
    error.signal = 15  # type: ignore[attr-defined]  # an Exception: never a signal's
    assert signal_of(error) is None
    assert signal_of(_PrefectLikeTermination(True)) is None  # a flag, not a signal number
    assert signal_of(GeneratorExit()) is None and signal_of(None) is None
