"""The display of ``kgpipe tune``: on a terminal one bar over the trials (or over the time
budget) with a line above it per finished trial; elsewhere a line per finished trial."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressBar,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from kgpipe.errors import RunError

if TYPE_CHECKING:
    from kgpipe.tune import StudyEvent, StudyFolder

__all__ = [
    "TuneProgress",
    "clock",
    "finished_trials",
    "header_text",
    "print_summary",
    "short_names",
    "states_text",
    "study_so_far",
    "study_spent",
    "trials_text",
    "value_text",
]

_STATE = {"complete": "complete", "pruned": "pruned", "fail": "failed", "running": "running"}


# -- the progress display ---------------------------------------------------------------------


def short_names(keys: Iterable[str]) -> dict[str, str]:
    """``training.lr`` -> ``lr``, ``model.dropout.entity`` -> ``dropout.entity``: the key
    without its section, unless two keys would then read the same (those stay whole)."""
    keys = list(dict.fromkeys(keys))
    short = {k: k.split(".", 1)[-1] for k in keys}
    seen: dict[str, int] = {}
    for s in short.values():
        seen[s] = seen.get(s, 0) + 1
    return {k: (s if seen[s] == 1 else k) for k, s in short.items()}


def value_text(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(max(0.0, seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class _TimeBar(BarColumn):
    """A bar over the time budget (full at the timeout), drawn from the clock."""

    def __init__(self, started: float, timeout_s: float) -> None:
        super().__init__()
        self.started, self.timeout_s = started, timeout_s

    def render(self, task: Task) -> ProgressBar:
        bar = super().render(task)
        bar.total = self.timeout_s
        bar.completed = min(self.timeout_s, time.monotonic() - self.started)
        return bar


class _TimeLeft(ProgressColumn):
    """``elapsed 0:12:03  left 1:47:57`` of the time budget (``time is up`` past it: no trial
    starts, the running ones finish)."""

    def __init__(self, started: float, timeout_s: float) -> None:
        super().__init__()
        self.started, self.timeout_s = started, timeout_s

    def render(self, task: Task) -> Text:
        elapsed = time.monotonic() - self.started
        left = self.timeout_s - elapsed
        left_text = f"left {clock(left)}" if left > 0 else "time is up"
        return Text(f"elapsed {clock(elapsed)}  {left_text}", style="progress.remaining")


class TuneProgress:
    """What a search shows while it runs (the ``on_event`` of the library's search).

    On a terminal: one bar over the trials (finished of the budget; over the time budget when
    there is only a timeout), with the running trials and the best valid MRR so far, and a line
    above it per finished trial. Elsewhere (a log file, CI): the line per finished trial."""

    def __init__(
        self,
        console: Console,
        *,
        keys: Sequence[str],
        trials: int | None,
        timeout_s: float | None,
        finished: int = 0,
        best: tuple[float, int] | None = None,
    ) -> None:
        self.console = console
        self.live = console.is_terminal
        self.names = short_names(keys)
        self.trials, self.timeout_s = trials, timeout_s
        self.finished = finished
        self.best = best  # (valid MRR, trial) of the complete trials
        self.running: set[int] = set()
        self.started = time.monotonic()
        self.progress: Progress | None = None
        self.task: Any = None

    def start(self) -> None:
        """Draw the bar (a terminal only)."""
        if not self.live or self.progress is not None:
            return
        self.started = time.monotonic()
        columns: list[str | ProgressColumn]
        if self.trials is not None:
            columns = [TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn()]
        else:
            columns = [
                TextColumn("[bold]{task.fields[done]} trials"),
                _TimeBar(self.started, self.timeout_s or 1.0),
            ]
        columns += [TextColumn("{task.fields[running]}"), TextColumn("{task.fields[best]}")]
        if self.timeout_s is not None:
            columns.append(_TimeLeft(self.started, self.timeout_s))
        else:
            columns.append(TimeElapsedColumn())
        self.progress = Progress(*columns, console=self.console, transient=False)
        self.task = self.progress.add_task(
            "tune", total=self.trials, completed=self.finished, done="", running="", best=""
        )
        self._update()
        self.progress.start()

    def _update(self) -> None:
        if self.progress is None:
            return
        best = self.best and f"best valid MRR {self.best[0]:.4f} (trial {self.best[1]})"
        self.progress.update(
            self.task,
            completed=self.finished,
            done=str(self.finished),
            running=f"{len(self.running)} running" if self.running else "",
            best=best or "",
        )

    def line(self, event: StudyEvent) -> str:
        """``trial 7 pruned  valid MRR 0.6411  6 epochs  0.9 s  lr=0.0002 dim=32``."""
        outcome = event.outcome
        assert outcome is not None
        mrr = "-" if outcome.value is None else f"{outcome.value:.4f}"
        values = " ".join(
            f"{self.names.get(k, k)}={value_text(v)}" for k, v in event.values.items()
        )
        text = (
            f"trial {event.number} {_STATE.get(outcome.state, outcome.state)}  valid MRR {mrr}  "
            f"{outcome.epochs} epochs  {outcome.seconds:.1f} s  {values}"
        ).rstrip()
        if outcome.error:
            text += f"  ({outcome.error.strip().splitlines()[0][:200]})"
        return text

    def __call__(self, event: StudyEvent) -> None:
        if event.kind == "started":
            self.running.add(event.number)
        elif event.outcome is not None:
            self.running.discard(event.number)
            self.finished = max(self.finished, event.finished)
            o = event.outcome
            better = o.value is not None and (self.best is None or o.value > self.best[0])
            if o.state == "complete" and better:
                self.best = (float(o.value or 0.0), event.number)
            self.console.log(escape(self.line(event)), highlight=False)
        self._update()

    def close(self) -> None:
        """End the display (after the search, or when it stops)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# -- the header and the summary ---------------------------------------------------------------


def states_text(counts: dict[str, int]) -> str:
    order = ("complete", "pruned", "fail", "running", "waiting")
    keys = [k for k in order if counts.get(k)] + sorted(k for k in counts if k not in order)
    return ", ".join(f"{counts[k]} {_STATE.get(k, k)}" for k in keys)


def trials_text(n: int) -> str:
    return f"{n} trial" + ("" if n == 1 else "s")


def header_text(folder: StudyFolder, states: dict[str, int] | None) -> str:
    s = folder.settings
    budget = []
    if s.trials is not None:
        budget.append(trials_text(s.trials))
    if s.timeout_s is not None:
        budget.append(f"at most {clock(s.timeout_s)}")
    workers = f"{s.workers} worker" + ("s" if s.workers != 1 else "")
    params = len(folder.space.keys())
    from kgpipe.tune import trial_length_text

    trials = trial_length_text(folder.base)
    text = f"study {folder.path}: {' or '.join(budget)} on {workers}, {params} parameters, {trials}"
    if states is not None:
        text = f"resuming {text}; so far {states_text(states) or 'no trials'}"
    return text


def print_summary(console: Console, folder: StudyFolder, results: dict[str, Any]) -> None:
    say = lambda text: console.print(escape(text), highlight=False, soft_wrap=True)  # noqa: E731
    counts: dict[str, int] = results.get("trials", {})
    total = sum(counts.values())
    say(
        f"study: {folder.path}  ({trials_text(total)}: {states_text(counts) or 'none'}; "
        f"{results.get('seconds', 0.0):.1f} s)"
    )
    best = results.get("best")
    if not best:
        raise RunError(
            f"no trial of the study completed, so there is no best config; the trials and "
            f"their errors are in {folder.file('trials.csv')}"
        )
    values = "  ".join(f"{k}={value_text(v)}" for k, v in best.get("values", {}).items())
    epoch = f" at epoch {best['epoch']}" if best.get("epoch") is not None else ""
    say(f"best: trial {best['trial']}, valid MRR {best['valid_mrr']:.4f}{epoch}  {values}")
    test = best.get("test")
    if test:
        say(
            f"test MRR {test['mrr']:.4f}, Hits@10 {test['hits@10']:.4f} "
            f"(filtered, {test.get('triples', '?')} triples)"
        )
    config = str(best.get("config") or folder.file("best.yaml"))
    say(f"train it: kgpipe train -c {shlex.quote(config)}")


def study_so_far(folder: StudyFolder) -> tuple[dict[str, int], tuple[float, int] | None]:
    """The trials of a study by state, and its best (valid MRR, trial)."""
    from kgpipe.tune.results import best_trial
    from kgpipe.tune.settings import check_storage
    from kgpipe.tune.study import load_optuna_study

    check_storage(folder.storage)  # one line when it cannot be opened
    study = load_optuna_study(folder)
    states: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        state = str(t.state.name).lower()
        states[state] = states.get(state, 0) + 1
    found = best_trial(study)
    best = None if found is None else (found[1], int(found[0].number))
    return states, best


def finished_trials(states: dict[str, int]) -> int:
    return sum(n for state, n in states.items() if state in ("complete", "pruned", "fail"))


def study_spent(
    folder: StudyFolder, states: dict[str, int], best: tuple[float, int] | None
) -> bool:
    """Whether a resumed study has nothing left to run and its findings are written for the
    trials it has (``best``: :func:`study_so_far`'s). A search stopped after its last trial,
    while it tested the winner, has not written them: its results.json is an older one's."""
    trials = folder.settings.trials
    if trials is None or finished_trials(states) < trials or states.get("running"):
        return False
    try:
        results = json.loads(folder.file("results.json").read_text())
        counted = finished_trials(results["trials"])
        won = results["best"]["trial"] if results.get("best") else None
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return counted == finished_trials(states) and won == (best[1] if best else None)
