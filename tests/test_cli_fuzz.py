"""Every option of every subcommand, found in the parser (commands added later are covered),
given invalid values: each is a one-line error and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_cli as _run
from cli_support import vocab_labels as _labels

from kgpipe.cli.main import build_parser
from kgpipe.config import parse_config
from kgpipe.pipeline import train


@pytest.fixture(scope="module")
def umls_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run, as small as it gets."""
    root = tmp_path_factory.mktemp("fuzz")
    raw = {
        "run": {"root": str(root), "name": "tiny", "seed": 0},
        "data": {"dataset": "umls"},
        "model": {"name": "distmult", "dim": 2},
        "training": {"epochs": 1, "max_steps_per_epoch": 2},
        "evaluation": {"every": 0, "test": False},
        "checkpoint": {"background": False},
    }
    train(parse_config(raw))
    return root / "tiny"


S3 = "s3://nonexistent-bucket-xyz/out"
BAD_VALUES = ("0", "-1", "abc", "", "{tmp}/no-such-folder/x", "{file}/under-a-file", S3)
#: (command, option) -> values that are valid there: the command must succeed
VALID_THERE = {
    ("export", "--out"): {"0", "-1", "abc", "{tmp}/no-such-folder/x"},  # new folders: written
    ("config", "key"): {""},  # every key starts with ""
    ("synth", "out"): {"0", "-1", "abc", "{tmp}/no-such-folder/x"},  # new folders: written
    **{("synth", o): {"0"} for o in ("--seed", "--noise", "--exponent", "--valid", "--test")},
}
#: findings in files outside this test's change: (command, option) -> (the values the fuzz
#: skips there, and why); remove an entry once its command rejects those values
KNOWN_FINDINGS: dict[tuple[str, str], tuple[frozenset[str], str]] = {}  # none open


def _subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, (*path, name))
            return
    if path:
        yield path, parser


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
    )


def _fuzz_cases() -> Iterator[object]:
    for path, parser in _subcommands(build_parser()):
        for action in parser._actions:
            if not _takes_value(action):
                continue
            option = action.option_strings[-1] if action.option_strings else action.dest
            yield pytest.param(path, option, id=f"{' '.join(path)} {option}")


@pytest.fixture
def no_object_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials, and an endpoint that refuses connections: nothing leaves the machine."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")


def _fillers(run: Path, tmp: Path, path: tuple[str, ...], option: str) -> dict[str, list[str]]:
    """A valid value of every positional and required option of the command ``path``: the
    valid command that the fuzzed ``option`` is added to (or replaces its filler in)."""
    ent, rel = _labels(run, "entities")[0], _labels(run, "relations")[0]
    cfg = tmp / "tiny.yaml"
    cfg.write_text(
        json.dumps({
            "run": {"root": str(tmp / "runs"), "name": "fuzz"},
            "data": {"dataset": "umls"},
            "model": {"name": "distmult", "dim": 2},
            "training": {"epochs": 1, "max_steps_per_epoch": 1},
            "evaluation": {"every": 0, "test": False},
        })
    )  # fmt: skip
    # a base of 0 epochs: a valid tune command stops at that check, the last before it writes
    # anything, so a value this fuzz takes for valid is not a search
    no_search = tmp / "no-search.yaml"
    no_search.write_text(cfg.read_text().replace('"epochs": 1', '"epochs": 0'))
    fill = {
        "train": {"--config": [str(cfg)], "--no-prefect": [], "--quiet": []},
        "tune": {"--config": [str(no_search)], "--trials": ["1"], "--quiet": []},
        "evaluate": {"run": [str(run)]},
        "export": {"run": [str(run)], "--out": [str(tmp / "out")]},
        "predict": {"run": [str(run)], "--head": [ent], "--relation": [rel]},
        "neighbours": {"run": [str(run)], "--entity": [ent]},
        "config": {"--defaults": []} if option == "key" else {"--config": [str(cfg)]},
        "synth": {
            "out": [str(tmp / "synth")],
            "--entities": ["40"],
            "--relations": ["3"],
            "--edges": ["300"],
            "--quiet": [],
        },
    }
    return fill.get(path[0], {"run": [str(run)]})


#: options that exclude each other: fuzzing one drops the fillers of the others
EXCLUSIVE = (
    {"--head", "--tail"},
    {"--defaults", "--config", "--schema"},
    {"--config", "--resume"},  # tune
)


def _argv(
    path: tuple[str, ...], parser: argparse.ArgumentParser, fill: dict[str, list[str]],
    option: str | None = None, value: str = "",
) -> list[str]:  # fmt: skip
    """The command ``path`` with its fillers, and ``option`` given ``value``."""
    positionals: list[str] = []
    options: list[str] = []
    dropped = set().union(*(group for group in EXCLUSIVE if option in group)) - {option}
    for action in parser._actions:
        name = action.option_strings[-1] if action.option_strings else action.dest
        if name == option:
            given = [value]
        elif name in dropped:
            continue
        elif name in fill:
            given = fill[name]
        elif action.required and _takes_value(action):
            given = ["x"]  # a command added later: some value, so that the fuzzed one decides
        else:
            continue
        if action.option_strings:
            options += [action.option_strings[-1], *given]
        else:
            positionals += given
    return [*path, *options, "--", *positionals] if positionals else [*path, *options]


def _problems(code: int, out: str, err: str) -> list[str]:
    problems = []
    if code != 2:
        problems.append(f"exit status {code}, not 2")
    if "Traceback" in out + err:
        problems.append("a traceback")
    lines = err.strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    usage = lines[:-1]
    is_usage = (
        bool(usage)
        and usage[0].startswith("usage:")
        and all(line.startswith(" ") for line in usage[1:])
    )
    if len(errors) != 1 or not lines or "error:" not in lines[-1] or (usage and not is_usage):
        problems.append(f"not one error line: {err!r}")
    return problems


@pytest.mark.usefixtures("no_object_store")
@pytest.mark.parametrize("path,option", list(_fuzz_cases()))
def test_invalid_option_values_are_one_line_errors(
    path: tuple[str, ...],
    option: str,
    umls_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # whatever a value names relative to here stays in tmp_path
    (tmp_path / "a-file").write_text("")
    parser = dict(_subcommands(build_parser()))[path]
    fill = _fillers(umls_run, tmp_path, path, option)
    skipped, _ = KNOWN_FINDINGS.get((path[0], option), (frozenset(), ""))
    failures = []
    for template in BAD_VALUES:
        if template in skipped:
            continue
        value = template.format(tmp=tmp_path, file=tmp_path / "a-file")
        argv = _argv(path, parser, fill, option, value)
        try:
            code, out, err = _run(argv, capsys)
        except Exception as exc:  # a crash is what this test looks for
            failures.append(f"{argv}: raised {type(exc).__name__}: {exc}")
            continue
        if template in VALID_THERE.get((path[0], option), set()):
            if code != 0:
                failures.append(f"{argv}: a valid value, exit status {code}: {err!r}")
            continue
        failures += [f"{argv}: {p}" for p in _problems(code, out, err)]
    assert not failures, "\n".join(failures)


def test_the_fuzz_fillers_make_valid_commands(
    umls_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Without the fuzzed value each filled command succeeds: the fuzz's errors are the values'."""
    monkeypatch.chdir(tmp_path)
    for path, parser in _subcommands(build_parser()):
        if path[0] in ("train", "tune"):
            continue  # a real run, a real search (the CLI tests run them)
        argv = _argv(path, parser, _fillers(umls_run, tmp_path, path, ""))
        code, _, err = _run(argv, capsys)
        assert code == 0, (argv, err)
