"""A pre-flight check's parsed graph is staged without reading the files again, unless they
changed in between (or the check did not keep it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import kgpipe.runs.stage as stage
from kgpipe.config import parse_config
from kgpipe.runs.parsed import file_versions, take_parsed

LINES = [f"e{i}\tr{i % 3}\te{(i * 7 + 1) % 40}" for i in range(200)]


def _graph(tmp_path: Path) -> dict[str, str]:
    paths = {}
    for split, rows in (("train", LINES), ("valid", LINES[:5]), ("test", LINES[5:10])):
        path = tmp_path / f"{split}.tsv"
        path.write_text("\n".join(rows) + "\n")
        paths[split] = str(path)
    return paths


def _config(tmp_path: Path, data: dict[str, str], name: str) -> Any:
    return parse_config({"run": {"root": str(tmp_path / "runs"), "name": name}, "data": data})


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The train files ``load_dataset`` reads, in order."""
    seen: list[str] = []
    real = stage.load_dataset

    def counted(data: Any, **kwargs: Any) -> Any:
        seen.append(str(data.train))
        return real(data, **kwargs)

    monkeypatch.setattr(stage, "load_dataset", counted)
    return seen


def _staged(tmp_path: Path, name: str) -> dict[str, Any]:
    info = json.loads((tmp_path / "runs" / name / "data.json").read_text())
    manifest = (tmp_path / "runs" / name / "data" / "shards" / "manifest.json").read_text()
    return {"fingerprint": info["fingerprint"], "splits": info["splits"], "shards": manifest}


def test_a_kept_graph_is_staged_without_a_second_read(tmp_path: Path, reads: list[str]) -> None:
    data = _graph(tmp_path)
    config = stage.preflight(_config(tmp_path, data, "kept"), keep=True)
    stage.prepare_run(config)
    assert len(reads) == 1
    assert take_parsed(config.data) is None  # taken once
    stage.prepare_run(stage.preflight(_config(tmp_path, data, "again")))  # not kept: two reads
    assert len(reads) == 3
    assert _staged(tmp_path, "kept") == _staged(tmp_path, "again")


def test_a_file_changed_after_the_check_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    data = _graph(tmp_path)
    config = stage.preflight(_config(tmp_path, data, "r"), keep=True)
    train = Path(data["train"])
    train.write_text("\n".join([*LINES, "e1\tr0\te2"]) + "\n")
    later = os.stat(train).st_mtime_ns + 5_000_000_000
    os.utime(train, ns=(later, later))  # a coarse clock could leave the same time
    stage.prepare_run(config)
    assert len(reads) == 2
    info = json.loads((tmp_path / "runs" / "r" / "data.json").read_text())
    assert info["splits"]["train"]["lines"] == len(LINES) + 1


def test_another_data_config_does_not_take_it(tmp_path: Path, reads: list[str]) -> None:
    data = _graph(tmp_path)
    stage.preflight(_config(tmp_path, data, "r"), keep=True)
    other = _config(tmp_path, {**data, "unseen": "drop"}, "o")
    assert take_parsed(other.data) is None
    assert file_versions(other.data) is not None
