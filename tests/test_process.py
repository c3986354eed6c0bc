"""Process set-up: the thread governor sizes torch's threads to the cores others leave free."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kgpipe.process import ThreadGovernor, available_cores, cpu_sample


class _Machine:
    """A stand-in for /proc/stat: others use ``others`` cores, this process ``own``."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.others = 0.0
        self.own = 1.0
        self.busy = self.self_time = 0.0
        self.last = self.t0

    def __call__(self) -> tuple[float, float]:
        now = time.monotonic()
        dt, self.last = now - self.last, now
        self.busy += (self.others + self.own) * dt
        self.self_time += self.own * dt
        return self.busy, self.self_time


def _settle(gov: ThreadGovernor, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        gov.tick()
        time.sleep(0.005)


@pytest.fixture
def threads() -> object:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_follow_what_others_leave_free(
    threads: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = _Machine()
    gov = ThreadGovernor(interval_s=0.05, sample=machine)
    monkeypatch.setattr(gov, "cores", 8)
    gov.cap = gov.threads = 8
    gov.start()
    _settle(gov, 0.15)
    assert gov.threads == 8  # alone: every core
    machine.others = 3.0
    _settle(gov, 0.2)
    assert gov.threads == 5 and torch.get_num_threads() == 5
    machine.others = 0.5  # a light neighbour: 7.5 free cores round to 7, not to 8
    _settle(gov, 0.2)
    assert gov.threads == 7
    machine.others = 20.0  # oversubscribed: never below one thread
    _settle(gov, 0.2)
    assert gov.threads == 1
    machine.others = 0.0
    _settle(gov, 0.2)
    assert gov.threads == 8 and gov.changes == 4


def test_without_a_measurement_the_cap_stays(threads: object) -> None:
    gov = ThreadGovernor(2, interval_s=0.01, sample=lambda: None).start()
    _settle(gov, 0.05)
    assert gov.threads == min(2, available_cores()) and gov.changes == 0


def test_the_cap_is_torchs_own_default(threads: object) -> None:
    """OMP_NUM_THREADS (or the physical cores) bound what the governor uses, as they bound
    torch itself."""
    out = subprocess.run(
        [sys.executable, "-c", "from kgpipe.process import ThreadGovernor; "
         "print(ThreadGovernor().start().threads)"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "1"


@pytest.mark.skipif(cpu_sample() is None, reason="needs /proc/stat")
def test_a_busy_neighbour_takes_a_thread_and_gives_it_back(threads: object) -> None:
    """On the real machine: a busy single-threaded process next to us takes one of our cores,
    and gives it back when it ends. Measured against what the governor uses before, so that
    the suite passes on a machine doing other work too (it assumed an idle one: it failed
    while CI ran beside it); on a machine with no core to spare the effect cannot show."""
    gov = ThreadGovernor(interval_s=0.3).start()
    if gov.cap < 2 or gov.cap < available_cores():
        pytest.skip("needs torch to use every core by default, and 2 of them")
    _settle(gov, 1.5)
    before = gov.threads
    if before < 2:
        pytest.skip("the machine is busy already: no thread to give up (fake load tests above)")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _settle(gov, 2.0)
        during = gov.threads
        assert during < before
    finally:
        busy.kill()
        busy.wait()
    _settle(gov, 1.5)
    assert gov.threads > during


_UNGUARDED = """
from kgpipe.config import load_config
from kgpipe.pipeline import train
train(load_config("configs/umls-complex.yaml", ["training.epochs=1", "distributed.workers=2",
                  "run.root={root}", "run.name=r"]))
"""


def test_a_script_that_trains_on_dask_workers_at_its_top_level_is_refused(
    tmp_path: Path,
) -> None:
    """Dask's workers import the main script again: one that trained at its top level, not
    under `if __name__ == "__main__":`, trained again in every worker, which failed on the run
    folder the first process held (an error about another writer, 109 lines of tracebacks).
    It is now refused in the first process, before anything is written; the same call under
    the guard, or from a function the guard calls, is not (checked by the script's syntax)."""
    from kgpipe.process import _unguarded_call_in_main

    script = tmp_path / "train_it.py"
    script.write_text(_UNGUARDED.format(root=tmp_path / "runs"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=Path(__file__).parents[1], timeout=300)  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        f"kgpipe.errors.KgpipeError: {script}, line 4: training on the local Dask cluster starts "
        "new processes, which import this script again and would run this call again: put it "
        'under `if __name__ == "__main__":`'
    )
    assert not (tmp_path / "runs").exists()
    guarded = tmp_path / "guarded.py"
    guarded.write_text(
        "from kgpipe.process import _unguarded_call_in_main as found\n"
        "def go():\n    return found()\n"
        "if __name__ == '__main__':\n    print(go(), found())\n"
        "print(found())\n"
    )
    out = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.stdout.splitlines() == ["None None", f"('{guarded}', 6)"], out.stderr
    assert _unguarded_call_in_main() is None  # pytest's own main module is guarded
    for guard in (
        'if "__main__" == __name__:\n    print(found())\n',
        'if __name__ == "__main__" and True:\n    print(found())\n',
        'import sys\nif __name__ != "__main__":\n    sys.exit()\nprint(found())\n',
    ):
        other = tmp_path / "other.py"
        other.write_text("from kgpipe.process import _unguarded_call_in_main as found\n" + guard)
        out = subprocess.run([sys.executable, str(other)], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert out.stdout.splitlines() == ["None"], (guard, out.stderr)  # not refused


def test_a_new_process_importing_the_script_is_refused(tmp_path: Path) -> None:
    """The second line of defence, in the new process: the script's top level runs as
    `__mp_main__` there."""
    import runpy

    from kgpipe.errors import KgpipeError

    script = tmp_path / "s.py"
    script.write_text(
        "from kgpipe.process import check_not_reimported\ncheck_not_reimported('x')\n"
    )
    with pytest.raises(KgpipeError, match="x was called while a new process"):
        runpy.run_path(str(script), run_name="__mp_main__")
    runpy.run_path(str(script), run_name="__main__")  # the script itself runs
