"""`kgpipe tune`: a search from the command line, its summary, its findings, resume and Ctrl-C,
its errors (one line), and its progress display."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from rich.console import Console

from kgpipe.cli.main import main
from kgpipe.cli.tune import TuneProgress, short_names
from kgpipe.tune import StudyEvent
from kgpipe.tune.trial import TrialOutcome

REPO = Path(__file__).resolve().parents[1]
BASE = str(REPO / "configs" / "umls-complex.yaml")
SPACE = "training.lr: {loguniform: [1.0e-3, 0.3]}\nmodel.init: {choices: [xavier, normal]}\n"
SMALL = ["--set", "model.dim=16", "--set", "training.epochs=4", "--set", "evaluation.every=2"]
TRIAL_LINE = re.compile(r"trial (\d+) (complete|pruned|failed)  valid MRR ")


def _search(tmp: Path, name: str, *extra: str) -> list[str]:
    """A small search of ComplEx on UMLS over 2 parameters (learning rate, initialisation)."""
    space = tmp / "space.yaml"
    space.write_text(SPACE)
    return [
        "tune", "-c", BASE, "-s", str(space), *SMALL, "--set", f"run.root={tmp / 'runs'}",
        "--workers", "1", "--root", str(tmp / "studies"), "--name", name, *extra,
    ]  # fmt: skip


def _cli(argv: list[str]) -> tuple[int, str]:
    """``kgpipe ARGV`` in this process, outside a test (a module fixture): status, stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """A finished 3-trial search: its folder, exit status and what it printed."""
    tmp = tmp_path_factory.mktemp("tune")
    code, err = _cli(
        _search(tmp, "s", "--trials", "3", "--keep-trials", "all", "--prune-warmup", "0")
    )
    return tmp / "studies" / "s", code, err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err
    assert len([line for line in lines if "error:" in line]) == 1, err
    assert "error:" in lines[-1], err
    return lines[-1]


# -- a search ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_search_prints_a_line_per_trial_and_the_summary(study: tuple[Path, int, str]) -> None:
    folder, code, err = study
    assert code == 0, err
    assert "Traceback" not in err
    assert [m.group(1) for m in TRIAL_LINE.finditer(err)] == ["0", "1", "2"], err
    assert "\ntrial 0 trains the base config\n" in err  # all its values are in the space
    assert "lr=" in err and "init=" in err  # the values, without their section
    assert f"study: {folder}  (3 trials: 3 complete" in err
    assert re.search(r"best: trial \d, valid MRR 0\.\d{4} at epoch \d  training\.lr=", err), err
    assert re.search(r"test MRR 0\.\d{4}, Hits@10 0\.\d{4} \(filtered, 661 triples\)", err), err
    assert f"train it: kgpipe train -c {folder / 'best.yaml'}" in err
    results = json.loads((folder / "results.json").read_text())
    assert results["trials"] == {"complete": 3}
    assert set(results["best"]["values"]) == {"training.lr", "model.init"}
    assert results["best"]["test"]["mrr"] > 0
    assert (folder / "best.yaml").read_text().startswith("# best trial ")
    assert len((folder / "trials.csv").read_text().strip().splitlines()) == 1 + 3
    # --keep-trials all: every trial keeps its model and checkpoints
    settings = json.loads((folder / "study.json").read_text())["settings"]
    assert (settings["keep_trials"], settings["prune_warmup"]) == ("all", 0)
    for n in range(3):
        assert (folder / "trials" / f"trial-{n:04d}" / "checkpoints").is_dir()


@pytest.mark.slow
def test_the_best_config_trains(
    study: tuple[Path, int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, code, _ = study
    assert code == 0
    code, _, err = run_cli(
        ["train", "-c", str(folder / "best.yaml"), "--no-prefect", "--set", "training.epochs=1",
         "--set", f"run.root={tmp_path}", "--set", "run.name=best", "-q"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "best" / "model.safetensors").exists()


@pytest.mark.slow
def test_resume_with_more_trials_runs_only_the_difference(
    study: tuple[Path, int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, code, _ = study
    assert code == 0
    copy = tmp_path / "copy" / folder.name  # the study is named after its folder
    shutil.copytree(folder, copy)
    code, _, err = run_cli(["tune", "--resume", str(copy), "--trials", "4"], capsys)
    assert code == 0, err
    assert (
        f"resuming study {copy}: 4 trials on 1 worker, 2 parameters, trials of 4 epochs "
        "validated every 2 epochs; so far 3 complete"
    ) in err
    assert [m.group(1) for m in TRIAL_LINE.finditer(err)] == ["3"], err
    results = json.loads((copy / "results.json").read_text())
    assert sum(results["trials"].values()) == 4
    # the best trial is tested in the copy, whichever trial won (not where it first trained)
    best = results["best"]
    assert best["run"] == str(copy / "trials" / f"trial-{best['trial']:04d}") and best["test"]
    assert json.loads((copy / "study.json").read_text())["settings"]["trials"] == 4
    assert json.loads((folder / "results.json").read_text())["settings"]["trials"] == 3

    # its budget spent: the findings again, nothing run
    code, _, err = run_cli(["tune", "--resume", str(copy)], capsys)
    assert code == 0, err
    assert f"study {copy} has its 4 trials: nothing to run" in err
    assert not TRIAL_LINE.search(err) and f"train it: kgpipe train -c {copy / 'best.yaml'}" in err

    # findings older than the trials (a search stopped while it tested its winner): written
    # again, the winner tested, not printed as they were
    stale = {**results, "trials": {"complete": 1}}
    (copy / "results.json").write_text(json.dumps(stale))
    code, _, err = run_cli(["tune", "--resume", str(copy)], capsys)
    assert code == 0, err
    assert "has its 4 trials: nothing to run" not in err and "(4 trials: " in err, err
    assert json.loads((copy / "results.json").read_text())["trials"] == results["trials"]

    # --keep-trials best on a spent study: its losers are trimmed at once
    code, _, err = run_cli(["tune", "--resume", str(copy), "--keep-trials", "best"], capsys)
    assert code == 0, err
    kept = [(copy / "trials" / f"trial-{n:04d}" / "checkpoints").is_dir() for n in range(4)]
    assert kept == [n == best["trial"] for n in range(4)], (kept, err)


@pytest.mark.slow
def test_ctrl_c_keeps_the_study_and_resume_continues_the_running_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while trial 0 runs: exit 130 and the command to resume; the resumed search
    continues trial 0 (it is not sampled again)."""
    shown = TuneProgress.__call__

    def interrupt(self: TuneProgress, event: StudyEvent) -> None:
        shown(self, event)
        if event.kind == "started":
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(TuneProgress, "__call__", interrupt)
        code, _, err = run_cli(_search(tmp_path, "s", "--trials", "1", "--no-test"), capsys)
    folder = tmp_path / "studies" / "s"
    assert code == 130, err
    assert "Traceback" not in err
    assert f"continue it with `kgpipe tune --resume {folder}`" in err
    assert not (folder / "results.json").exists()

    code, _, err = run_cli(["tune", "--resume", str(folder), "-q"], capsys)
    assert code == 0, err
    assert not TRIAL_LINE.search(err)  # -q: the summary only
    assert f"study: {folder}  (1 trial: 1 complete" in err, err
    assert json.loads((folder / "results.json").read_text())["best"]["trial"] == 0


@pytest.mark.slow
def test_a_base_config_that_does_not_validate_validates_at_most_five_times_a_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``evaluation.every`` unset (0, the default: a run that validates never) is not an error
    for a search, which selects on validation: its trials validate at most 5 times (every
    ``ceil(training.epochs / 5)`` epochs), kept in the study's base config and said in its
    first line. Its second says which base values trial 0 cannot train (not in the space)."""
    argv = _search(tmp_path, "v5", "--trials", "1", "--set", "training.epochs=10")
    code, _, err = run_cli([*argv, "--set", "evaluation.every=0", "--set", "model.init=uniform"],
                           capsys)  # fmt: skip
    assert code == 0, err
    assert "1 trial on 1 worker, 2 parameters, trials of 10 epochs validated every 2 epochs" in err
    assert (
        "\ntrial 0 trains the base config, except for these base values, which the space sets "
        "or draws instead: model.init='uniform'\n"
    ) in err
    study = json.loads((tmp_path / "studies" / "v5" / "study.json").read_text())
    assert study["base"]["evaluation"]["every"] == 2
    trial = next((tmp_path / "studies" / "v5" / "trials").iterdir())
    rows = [json.loads(x) for x in (trial / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r.get("valid_mrr") is not None] == [2, 4, 6, 8, 10]


# -- errors: one line, nothing written --------------------------------------------------------


def test_a_base_config_or_a_study_to_resume_is_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(["tune", "--trials", "3"], capsys)
    assert code == 2
    assert _one_error_line(err).endswith("one of the arguments -c/--config --resume is required")
    code, _, err = run_cli(["tune", "-c", BASE, "--resume", "studies/x"], capsys)
    assert code == 2
    assert "not allowed with argument" in _one_error_line(err)


def test_an_unknown_key_in_the_space_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("training.lrr: {loguniform: [1.0e-3, 0.3]}\n")
    root = tmp_path / "studies"
    code, _, err = run_cli(
        ["tune", "-c", BASE, "-s", str(space), *SMALL, "--root", str(root)], capsys
    )
    assert code == 2
    line = _one_error_line(err)
    assert str(space) in line and "training.lrr is not a config key" in line, line
    assert not root.exists()  # nothing written


def test_a_search_whose_trials_all_fail_stops_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Data that does not read stops a new search at once, in one line, before its study
    exists (each trial read it, and failed, before); trials that all fail (each here draws
    more candidates than UMLS has entities) stop it after 5 in a row, in one line."""
    argv = _search(tmp_path, "s", "--trials", "40", "--set", f"data.root={tmp_path / 'no-data'}")
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    line = _one_error_line(err)
    assert "file not found" in line and "trials in a row" not in line, line
    assert not (tmp_path / "studies" / "s").exists()
    failing = tmp_path / "failing.yaml"
    failing.write_text(SPACE + "evaluation.candidates: {choices: [100000]}\n")
    argv = _search(tmp_path, "t", "--trials", "40")
    argv[argv.index("-s") + 1] = str(failing)
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    line = _one_error_line(err)
    assert "because 5 trials in a row failed" in line and "100000 candidates" in line, line
    assert f"kgpipe tune --resume {tmp_path / 'studies' / 't'}" in line, line


def test_a_bad_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["tune", "-c", BASE, "--timeout", "abc"], capsys)
    assert code == 2
    assert "argument --timeout: 'abc' is not a duration" in _one_error_line(err)
    assert err.startswith("usage: kgpipe tune")


def test_the_options_of_a_new_study_are_refused_on_resume(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(["tune", "--resume", "studies/x", "--pruner", "none"], capsys)
    assert code == 2
    assert "--pruner: for a new study (-c) only" in _one_error_line(err)
    code, _, err = run_cli(["tune", "--resume", "studies/x", "--prune-warmup", "0"], capsys)
    assert code == 2
    assert "--prune-warmup: for a new study (-c) only" in _one_error_line(err)
    code, _, err = run_cli(
        ["tune", "-c", "x.yaml", "--pruner", "asha", "--prune-warmup", "0"], capsys
    )
    assert code == 2
    assert "--prune-warmup: for the median rule" in _one_error_line(err)


def test_resuming_a_folder_that_is_no_study_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["tune", "--resume", str(tmp_path)], capsys)
    assert code == 2
    assert f"{tmp_path}: not a study folder" in _one_error_line(err)


def test_a_root_under_a_file_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    root = tmp_path / "a-file" / "studies"
    code, _, err = run_cli(
        ["tune", "-c", BASE, "-s", str(space), *SMALL, "--root", str(root)], capsys
    )
    assert code == 2
    assert f"{root}: cannot create the study folder (NotADirectoryError" in _one_error_line(err)


def test_a_database_that_cannot_be_opened_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    root = tmp_path / "studies"
    storage = f"sqlite:///{tmp_path}/no-such-folder/study.db"
    argv = ["tune", "-c", BASE, "-s", str(space), *SMALL, "--root", str(root), "--storage", storage]
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert f"{storage}: cannot open the study's database" in _one_error_line(err)
    assert not root.exists()  # nothing written


# -- the progress display ---------------------------------------------------------------------

KEYS = ["training.lr", "model.dim", "model.margin", "training.margin"]


def _finished(number: int, state: str, value: float | None, epochs: int, done: int) -> StudyEvent:
    outcome = TrialOutcome(
        number, state, value=value, history=[{"epoch": e} for e in range(1, epochs + 1)],
        seconds=0.94, error="ConfigError: no" if state == "fail" else None,
    )  # fmt: skip
    values: dict[str, Any] = {"training.lr": 0.00021, "model.dim": 32, "training.margin": 2.5}
    return StudyEvent("finished", number, values, outcome, None, done, 4)


def _search_events(progress: TuneProgress) -> None:
    progress.start()
    for i, (state, value) in enumerate(
        [("complete", 0.52), ("pruned", 0.6411), ("complete", 0.6204), ("fail", None)]
    ):
        progress(StudyEvent("started", i, {}, None, None, i, 4))
        progress(_finished(i, state, value, 6 if state != "fail" else 0, i + 1))
    progress.close()


def test_short_names_drop_the_section_unless_two_keys_would_read_the_same() -> None:
    assert short_names([*KEYS, "model.dropout.entity"]) == {
        "training.lr": "lr",
        "model.dim": "dim",
        "model.margin": "model.margin",
        "training.margin": "training.margin",
        "model.dropout.entity": "dropout.entity",
    }


def test_off_a_terminal_a_line_per_finished_trial() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200, log_path=False)
    _search_events(TuneProgress(console, keys=KEYS, trials=4, timeout_s=None))
    lines = [line.rstrip() for line in out.getvalue().strip().splitlines()]
    assert len(lines) == 4, lines
    assert lines[1].endswith(
        "trial 1 pruned  valid MRR 0.6411  6 epochs  0.9 s  lr=0.00021 dim=32 training.margin=2.5"
    )
    failed = "trial 3 failed  valid MRR -  0 epochs  0.9 s  lr=0.00021 dim=32 training.margin=2.5"
    assert lines[3].endswith(f"{failed}  (ConfigError: no)")
    assert "━" not in out.getvalue()


def test_on_a_terminal_one_bar_with_the_best_complete_trial() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, log_path=False)
    progress = TuneProgress(console, keys=KEYS, trials=4, timeout_s=None)
    _search_events(progress)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    finals = [line for line in text.splitlines() if "4/4" in line]
    assert finals, text
    assert "best valid MRR 0.6204 (trial 2)" in finals[-1]  # the pruned trial's 0.6411 is no result
    assert text.count("trial 1 pruned  valid MRR 0.6411") == 1
    assert progress.progress is None


def test_with_only_a_timeout_the_bar_shows_the_time_left() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, log_path=False)
    _search_events(TuneProgress(console, keys=KEYS, trials=None, timeout_s=7200))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert re.search(r"4 trials .*elapsed 0:00:0\d  left 1:59:5\d", text), text
