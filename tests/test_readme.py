"""Every command of the README's "Using it" block runs as shown (exit 0, no traceback).

Scaled down where it would take minutes: the demo config's epochs (100 -> 4, validating every
2; the README's extension to 150 epochs -> 6). `s3://bucket` is the test's SeaweedFS bucket,
and `runs/rdf` a small N-Triples graph with IRIs trained first.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import S3Server

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The `kgpipe ...` commands of the README's "Using it" block (continuations joined,
    comments dropped)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Using it", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = re.sub(r"\s{2,}#.*$", "", raw).rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if pending:
            line = f"{pending} {line.strip()}"
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        commands.append(line.strip())
    return commands


def test_the_readme_block_is_read_whole() -> None:
    commands = readme_commands()
    assert all(c.startswith("kgpipe ") for c in commands), commands
    assert any("--resume --set training.epochs=150" in c for c in commands)
    assert len(commands) >= 15


def _rdf_graph(folder: Path) -> Path:
    ns = "http://example.org/ns#"
    people = [f"p{i}" for i in range(12)]
    lines = []
    for i, a in enumerate(people):
        for b in (people[(i + 1) % 12], people[(i + 3) % 12]):
            lines.append(f"<{ns}{a}> <{ns}knows> <{ns}{b}> .")
        lines.append(f"<{ns}{a}> <{ns}livesIn> <{ns}city{i % 3}> .")
    lines.append(f"<{ns}alice> <{ns}knows> <{ns}p0> .")
    lines.append(f"<{ns}p1> <{ns}knows> <{ns}alice> .")
    path = folder / "graph.nt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_readme_command_runs(tmp_path: Path, s3_server: S3Server) -> None:
    (tmp_path / "configs").mkdir()
    config = yaml.safe_load((REPO / "configs" / "umls-complex.yaml").read_text())
    config.setdefault("training", {})["epochs"] = 4
    config.setdefault("evaluation", {})["every"] = 2
    (tmp_path / "configs" / "umls-complex.yaml").write_text(yaml.safe_dump(config))
    rdf = {
        "run": {"name": "rdf", "root": "runs"},
        "data": {"train": str(_rdf_graph(tmp_path))},
        "model": {"name": "transe", "dim": 8},
        "training": {"epochs": 2, "batch_size": 16, "negatives": 4},
        "evaluation": {"test": False},
    }
    (tmp_path / "rdf.yaml").write_text(yaml.safe_dump(rdf))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": s3_server.key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret,
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "PYTHONUNBUFFERED": "1",
    }
    kgpipe = [sys.executable, "-m", "kgpipe.cli"]

    def run(argv: list[str]) -> None:
        proc = subprocess.run(
            [*kgpipe, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Traceback" not in out, f"kgpipe {shlex.join(argv)}:\n{out}"

    run(["train", "-c", "rdf.yaml", "--no-prefect", "-q"])
    for command in readme_commands():
        command = command.replace("training.epochs=150", "training.epochs=6")
        command = command.replace("s3://bucket/", "s3://kgpipe/readme/")
        command = command.replace("--trials 12", "--trials 3")
        run(shlex.split(command)[1:])
    assert (tmp_path / "runs" / "my-run" / "results.json").exists()
    history = (tmp_path / "runs" / "my-run" / "metrics.jsonl").read_text().splitlines()
    assert len(history) == 6  # 4 epochs, then extended to 6
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
