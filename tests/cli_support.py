"""What the CLI tests share: a command run in this process, a run folder's vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from kgpipe.cli.main import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``kgpipe ARGV`` in this process: exit status (argparse's SystemExit included), stdout,
    stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def vocab_labels(run: Path, kind: str) -> list[str]:
    """The labels of ``vocab/{kind}.tsv`` (entities or relations) in id order."""
    return [x.split("\t", 1)[1] for x in (run / f"vocab/{kind}.tsv").read_text().splitlines()]
