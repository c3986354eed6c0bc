"""The kgpipe CLI end to end: run folder contract, evaluate/export/predict, user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from candidate_files import write_candidate_files
from cli_support import run_cli

from kgpipe.cli import main

REPO = Path(__file__).resolve().parents[1]

SMALL = {
    "run": {"seed": 0},
    "data": {"dataset": "umls"},
    "model": {"name": "complex", "dim": 16, "reciprocal": True},
    "training": {
        "mode": "1vsall",
        "loss": "cross_entropy",
        "epochs": 2,
        "batch_size": 512,
        "optimizer": "adagrad",
        "lr": 0.1,
    },
    "evaluation": {"every": 1},
}


def _config(tmp_path: Path, data: dict | None = None) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data or SMALL))
    return path


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    cfg = _config(tmp)
    root = tmp / "runs"
    assert (
        main(["train", "-c", str(cfg), "--set", f"run.root={root}", "--set", "run.name=r1", "-q"])
        == 0
    )
    return root / "r1"


def test_run_folder_contract(trained_run: Path) -> None:
    names = {str(p.relative_to(trained_run)) for p in trained_run.rglob("*") if p.is_file()}
    for required in (
        "config.yaml",
        "data.json",
        "vocab/entities.tsv",
        "vocab/relations.tsv",
        "metrics.jsonl",
        "results.json",
        "model.safetensors",
        "embeddings/entities.parquet",
        "embeddings/relations.parquet",
    ):
        assert required in names
    assert not any(".tmp-" in n for n in names)
    lines = [json.loads(x) for x in (trained_run / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2]
    for x in lines:
        assert {"epoch", "loss", "triples_per_s", "seconds", "valid_mrr"} <= set(x)
    results = json.loads((trained_run / "results.json").read_text())
    for k in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
        assert k in results and k in results["head"] and k in results["tail"]
    assert results["protocol"]["ranking"] == "filtered"
    assert results["protocol"]["ties"].startswith("realistic")
    ents = (trained_run / "vocab/entities.tsv").read_text().splitlines()
    assert len(ents) == 135 and ents[0].startswith("0\t")
    resolved = yaml.safe_load((trained_run / "config.yaml").read_text())
    assert resolved["run"]["name"] == "r1" and resolved["model"]["dim"] == 16


def test_exported_embeddings_score_like_the_model(trained_run: Path) -> None:
    """Anyone can score triples from the export alone, following the documented layout."""
    ent = pq.read_table(trained_run / "embeddings/entities.parquet")
    rel = pq.read_table(trained_run / "embeddings/relations.parquet")
    assert ent.schema.field("embedding").type.value_type == "float"
    assert b"kgpipe" in ent.schema.metadata
    E = np.array(ent.column("embedding").to_pylist(), dtype=np.float32)
    R = np.array(rel.column("embedding").to_pylist(), dtype=np.float32)
    assert R.shape[0] == 2 * 46  # reciprocal: inverse rows follow
    assert rel.column("label").to_pylist()[46].endswith("^-1")
    # ComplEx: [real | imaginary]; score = Re(sum h r conj(t))
    h = E[3, :8] + 1j * E[3, 8:]
    r = R[5, :8] + 1j * R[5, 8:]
    t = E[7, :8] + 1j * E[7, 8:]
    manual = float(np.real(np.sum(h * r * np.conj(t))))
    from kgpipe.export import load_model
    from kgpipe.storage import Store

    model = load_model(Store(str(trained_run)))
    expected = float(model.score_triples(torch.tensor([[3, 5, 7]]))[0])
    assert manual == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_evaluate_reproduces_results(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(trained_run), "--json", "--batch-size", "7"]) == 0
    got = json.loads(capsys.readouterr().out)
    saved = json.loads((trained_run / "results.json").read_text())
    assert got["mrr"] == pytest.approx(saved["mrr"], abs=1e-12)
    assert main(["evaluate", str(trained_run), "--split", "valid", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["triples"] == 652


def test_evaluate_with_per_query_candidates(
    trained_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--candidates K` ranks against K candidates per query (the OGB-style protocol), the
    same numbers at any batch size; `--candidates all` goes back to every entity."""
    got = []
    for batch in ("7", "512"):
        argv = ["evaluate", str(trained_run), "--json", "--candidates", "20", "--batch-size", batch]
        assert main(argv) == 0
        got.append(json.loads(capsys.readouterr().out))
    assert got[0]["mrr"] == got[1]["mrr"]
    assert got[0]["protocol"]["candidates"] == "per-query-20"
    assert got[0]["mr"] <= 21.0
    saved = json.loads((trained_run / "results.json").read_text())
    assert got[0]["mrr"] > saved["mrr"]  # 20 competitors at most instead of 134
    assert main(["evaluate", str(trained_run), "--json", "--candidates", "all"]) == 0
    assert json.loads(capsys.readouterr().out)["mrr"] == pytest.approx(saved["mrr"], abs=1e-12)
    assert main(["evaluate", str(trained_run), "--candidates", "20"]) == 0
    shown = capsys.readouterr()  # the table on stdout: a result, for `> file` and `| grep`
    assert "ranked against 20 candidates per query" in shown.out
    with pytest.raises(SystemExit):
        main(["evaluate", str(trained_run), "--candidates", "0"])


def test_export_formats(trained_run: Path, tmp_path: Path) -> None:
    assert (
        main(["export", str(trained_run), "--format", "npy", "--out", str(tmp_path / "npy")]) == 0
    )
    arr = np.load(tmp_path / "npy/entities.npy")
    assert arr.shape == (135, 16) and arr.dtype == np.float32
    assert (tmp_path / "npy/entities.tsv").read_text().count("\n") == 135
    assert json.loads((tmp_path / "npy/model.json").read_text())["model"]["name"] == "complex"
    out = "memory://kgpipe-test/export"
    assert main(["export", str(trained_run), "--format", "parquet", "--out", out]) == 0
    import fsspec

    with fsspec.open(out + "/relations.parquet", "rb") as f:
        assert pq.read_table(f).num_rows == 92


def test_predict(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labels = (trained_run / "vocab/entities.tsv").read_text().splitlines()
    head = labels[0].split("\t")[1]
    rel = (trained_run / "vocab/relations.tsv").read_text().splitlines()[0].split("\t")[1]
    assert (
        main(
            ["predict", str(trained_run), "--head", head, "--relation", rel, "--top", "5", "--json"]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 5 and [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    scores = [r["score"] for r in rows]
    assert scores == sorted(scores, reverse=True)
    assert main(["predict", str(trained_run), "--tail", head, "--relation", rel, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 10
    assert main(["predict", str(trained_run), "--head", "no-such-entity", "--relation", rel]) == 2
    assert "unknown entity" in capsys.readouterr().err


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kgpipe.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


BAD_DATA = {
    "wrong_columns": (b"a\tr\tb\nc\tr\n", "line 2", "expected 3"),
    "empty_field": (b"a\tr\tb\nc\t\td\n", "line 2", "empty"),
    "undecodable": (b"a\tr\tb\nc\tr\t\xff\xfe\n", "line 2", "UTF-8"),
    "empty_file": (b"", "train.tsv", "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_data_is_a_clear_error_and_writes_nothing(tmp_path: Path, case: str) -> None:
    data, where, what = BAD_DATA[case]
    (tmp_path / "train.tsv").write_bytes(data)
    cfg = _config(tmp_path, {"data": {"train": str(tmp_path / "train.tsv")}})
    root = tmp_path / "runs"
    proc = _run_cli("train", "-c", str(cfg), "--set", f"run.root={root}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "train.tsv" in proc.stderr and where in proc.stderr and what in proc.stderr
    assert not root.exists()


BAD_CONFIGS = {
    # file bytes -> what the one-line message must say after the file's name
    "binary": (bytes(range(256)) * 4, "line 2: not a text (UTF-8) file"),
    "unclosed_list": (b"model:\n  name: [complex\n", "line 3, column 1: not valid YAML"),
    "tab": (b"model:\n\tname: complex\n", "line 2, column 1: not valid YAML: found character"),
    "mapping_in_value": (b"model: name: complex\n", "line 1, column 12: not valid YAML"),
    "nul_byte": (
        b"model:\n  name: com\x00plex\n",
        "line 2, column 12: not valid YAML: the character '\\x00' is not allowed",
    ),
    "a_list": (b"- model\n- data\n", "the top level must be a mapping"),
    "a_scalar": (b"complex\n", "the top level must be a mapping"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_broken_config_file_is_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    data, message = BAD_CONFIGS[case]
    path = tmp_path / "my config.yaml"
    path.write_bytes(data)
    proc = _run_cli("train", "-c", str(path), "--no-prefect", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "<unicode string>" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), proc.stderr
    assert message in lines[0], proc.stderr


@pytest.mark.parametrize(
    "argv,message",
    [
        (["-c", "/bin/true"], "/bin/true, line 1: not a text (UTF-8) file"),
        (["-c", "{tmp}"], "is a directory, not a config file"),
        (["-c", "{tmp}/missing.yaml"], "missing.yaml: config file not found"),
        (
            ["-c", "configs/umls-complex.yaml", "--set", "model.dim=[1"],
            "--set 'model.dim=[1': the value, line 1, column 3: not valid YAML",
        ),
    ],
)
def test_config_paths_and_set_values_that_cannot_be_read(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = _run_cli("train", *args, "--no-prefect", cwd=REPO)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.nmae=complex", "model.nmae: unknown key"),
        ("training.epochs=-1", "training.epochs: Input should be greater than or equal to 0"),
        ("model.name=transr", "model.name"),
        ("model.dim=7", "model.dim must be even"),
        ("training.mode=kvsall training.loss=margin", "kvsall needs training.loss cross_entropy"),
        ("distributed.workers=0", "distributed.workers"),
        ("distributed.sync=async", "distributed.sync"),
        ("training.precision=fp16", "training.precision"),
        ("training.schedule=plateau evaluation.every=0", "plateau needs evaluation.every > 0"),
        ("training.plateau.factor=2", "training.plateau.factor"),
        ("evaluation.patience=2 checkpoint.keep_best=false", "keep_best=false with evaluation"),
        (
            "training.schedule=plateau evaluation.patience=3",
            "evaluation.patience (3) must exceed training.plateau.patience + 1 (3)",
        ),
    ],
)
def test_bad_config_names_the_path(tmp_path: Path, override: str, message: str) -> None:
    cfg = _config(tmp_path)
    sets = [arg for item in override.split() for arg in ("--set", item)]
    proc = _run_cli("train", "-c", str(cfg), *sets, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_existing_run_is_not_overwritten(trained_run: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    code = main(
        [
            "train",
            "-c",
            str(cfg),
            "--set",
            f"run.root={trained_run.parent}",
            "--set",
            "run.name=r1",
            "-q",
        ]
    )
    assert code == 2


def test_missing_run_folder(tmp_path: Path) -> None:
    proc = _run_cli("evaluate", str(tmp_path / "nope"), cwd=tmp_path)
    assert proc.returncode == 2 and "not a kgpipe run folder" in proc.stderr


def test_shipped_configs_are_valid() -> None:
    from kgpipe.config import load_config

    found = [*(REPO / "configs").rglob("*.yaml"), *(REPO / "bench").rglob("*.yaml")]
    configs = sorted(p for p in found if "spaces" not in p.parts)  # search spaces: test_tune
    assert len(configs) > 1
    for path in configs:
        load_config(str(path))


SHIPPED = sorted(
    str(p.relative_to(REPO))
    for p in [*(REPO / "configs").glob("*.yaml"), *(REPO / "bench" / "configs").glob("*.yaml")]
)


@pytest.mark.parametrize("config", SHIPPED, ids=lambda n: n)
def test_shipped_config_smoke(config: str, tmp_path: Path, datasets_root: Path) -> None:
    """Every shipped config (and every benchmark config) trains for two steps and writes its
    run folder."""
    code = main([
        "train", "-c", str(REPO / config), "-q",
        "--set", f"run.root={tmp_path}", "--set", "run.name=smoke",
        "--set", f"data.root={datasets_root}" if "umls" not in config else "data.root=null",
        "--set", "training.epochs=1", "--set", "training.max_steps_per_epoch=2",
        "--set", "evaluation.every=0", "--set", "evaluation.patience=null",
        "--set", "evaluation.test=false",
    ])  # fmt: skip
    assert code == 0
    metrics = json.loads((tmp_path / "smoke" / "metrics.jsonl").read_text())
    assert metrics["steps"] == 2 and metrics["loss"] > 0
    assert (tmp_path / "smoke" / "embeddings" / "entities.parquet").exists()


def test_overwrite_with_bad_data_keeps_the_existing_run(tmp_path: Path) -> None:
    """--overwrite replaces a run only once the new input is known to be good."""
    root = tmp_path / "runs"
    existing = root / "keep"
    (existing / "data" / "shards").mkdir(parents=True)
    (existing / "config.yaml").write_text("run: {name: keep}\n")
    # staged (data.json is written last; a folder without it is staged again, not refused)
    (existing / "data.json").write_text("{}\n")
    (existing / "data" / "shards" / "manifest.json").write_text("{}\n")
    (tmp_path / "train.tsv").write_bytes(b"a\tr\tb\nc\tr\n")
    cfg = _config(tmp_path, {"data": {"train": str(tmp_path / "train.tsv")}})
    proc = _run_cli("train", "-c", str(cfg), "--set", f"run.root={root}",
                    "--set", "run.name=keep", "--overwrite", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "line 2" in proc.stderr
    assert (existing / "config.yaml").read_text() == "run: {name: keep}\n"
    proc = _run_cli("train", "-c", str(cfg), "--set", f"run.root={root}",
                    "--set", "run.name=keep", cwd=tmp_path)  # fmt: skip
    assert proc.returncode != 0 and "--resume" in proc.stderr and "Traceback" not in proc.stderr


def test_local_prefect_defaults_are_patient_and_keep_user_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The temporary Prefect API gets 120 s to start (Prefect's 20 s failed a first start on 2
    busy cores) and no telemetry; values the user set are kept."""
    from flows.cli import local_prefect_defaults

    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", raising=False)
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    local_prefect_defaults()
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "120"
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"


def test_the_parser_imports_no_heavy_library() -> None:
    """`kgpipe --help` and a usage error answer at once: building the parser (every
    subcommand's arguments) imports neither torch nor Dask; a subcommand imports them when it
    runs. (Before, `kgpipe --help` took about 4-5 s here, 2.2 s of it importing torch.)"""
    heavy = ("torch", "distributed", "dask", "pyarrow", "numpy", "pydantic", "optuna", "prefect")
    code = (
        "import sys; from kgpipe.cli.main import build_parser; build_parser(); "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_parsers_choices_are_the_librarys() -> None:
    """The choices the parser lists without importing the library are the library's own."""
    from kgpipe.cli.main import build_parser
    from kgpipe.data.synth import OUTPUT_FORMATS
    from kgpipe.runs.neighbours import MEASURES

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert commands is not None

    def choices(command: str, dest: str) -> tuple[str, ...]:
        action = next(a for a in commands[command]._actions if a.dest == dest)
        return tuple(action.choices or ())

    assert choices("neighbours", "metric") == tuple(MEASURES)
    assert choices("synth", "format") == tuple(OUTPUT_FORMATS)


def test_ls_prints_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    from kgpipe.cli.ls import registries

    assert main(["ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    for key, registry in registries():
        assert list(listed[key]) == list(registry.names()), key
        assert all(listed[key].values()), key  # every entry has its one-line description
    assert {"model.name", "training.loss", "data.format", "distributed.cluster"} <= set(listed)
    assert {"none", "prefect"} <= set(listed["kgpipe train --orchestrator"])
    assert main(["ls"]) == 0
    text = capsys.readouterr().out
    assert "model.name" in text and "complex" in text and "kvsall" in text


def test_resume_of_a_run_that_is_not_there_says_a_new_run_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--resume with a mistyped run name trained a whole new run without a word."""
    sets = ["--set", f"run.root={tmp_path}", "--set", "run.name=nope", "--set", "training.epochs=1",
            "--set", "model.dim=8"]  # fmt: skip
    code, _, err = run_cli(["train", "-c", "configs/umls-complex.yaml", *sets, "--resume",
                            "--no-prefect", "-q"], capsys)  # fmt: skip
    assert code == 0
    said = " ".join(err.split())
    assert f"warning: no run at {tmp_path / 'nope'} to resume: a new run starts" in said
    code, _, err = run_cli(["train", "-c", "configs/umls-complex.yaml", *sets, "--resume",
                            "--no-prefect", "-q"], capsys)  # fmt: skip
    assert code == 0 and "warning" not in err  # it is there now: resumed (finished)


def test_resume_and_overwrite_exclude_each_other(tmp_path: Path) -> None:
    proc = _run_cli("train", "-c", str(_config(tmp_path)), "--resume", "--overwrite", cwd=tmp_path)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


# in this module, not tests/test_candidate_files.py: `kgpipe train` run in this process leaves
# Prefect's console handler on the root logger, bound to pytest's captured stderr; the modules
# that run before this one (tests/test_checkpoint.py) check stderr for tracebacks
def test_the_cli_names_the_files_and_the_unfiltered_ranking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section = write_candidate_files(tmp_path, k=7, splits=("test",))
    (tmp_path / "c.yaml").write_text(
        json.dumps(
            {
                "run": {"root": str(tmp_path), "name": "run"},
                "data": {"dataset": "umls", "candidates": section},
                "model": {"name": "distmult", "dim": 8},
                "training": {"epochs": 1, "batch_size": 512, "negatives": 4},
            }
        )
    )
    code, out, err = run_cli(["train", "-c", str(tmp_path / "c.yaml"), "-q"], capsys)
    assert code == 0, err
    assert "triples, unfiltered)" in out + err
    assert "ranked against 7 candidates per query (from data.candidates files)" in out + err
    code, out, err = run_cli(["evaluate", str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert "unfiltered" in out + err and "from data.candidates files" in out + err
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| metric (test, unfiltered against files-7 candidates, not all entities) |" in report


def test_a_run_stopped_while_staging_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped while staging, a run has its config.yaml and no data: evaluate and predict said
    `vocab/entities.tsv: file not found`, and the interrupted command offered to go on `from its
    last checkpoint`, of which there was none."""
    import argparse

    from kgpipe.cli.train import _stopped_hint
    from kgpipe.config import load_config

    config = load_config("configs/umls-complex.yaml", [f"run.root={tmp_path}", "run.name=half"])
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.yaml").write_text((Path("configs/umls-complex.yaml")).read_text())
    args = argparse.Namespace(config="configs/umls-complex.yaml", set=[], no_prefect=True)
    assert _stopped_hint(args, config).startswith("stopped before training began; to start again")
    (tmp_path / "half" / "data.json").write_text("{}")  # staged, no checkpoint yet
    hint = _stopped_hint(args, config)
    assert hint.startswith("stopped before its first checkpoint; to train it from the start")
    (tmp_path / "half" / "data.json").unlink()
    code, _, err = run_cli(["evaluate", str(tmp_path / "half")], capsys)
    assert code != 0
    assert "its staging did not finish (the run stopped before it trained)" in " ".join(err.split())
