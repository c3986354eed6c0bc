"""``kgpipe synth`` and :mod:`kgpipe.data.synth`: deterministic, chunk-independent, leak-free
splits, heavy-tailed degrees, a planted structure a model learns, and whole-or-nothing output."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from cli_support import run_cli
from conftest import S3Server

from kgpipe.config import DataConfig, parse_config
from kgpipe.data.dataset import load_dataset
from kgpipe.data.synth import (
    BLOCK_EDGES,
    SynthSpec,
    generate_edges,
    split_codes,
    write_synth,
)
from kgpipe.errors import ConfigError, DataError
from kgpipe.pipeline import train

#: crosses a block boundary, so that chunking and the last short block are exercised
SMALL = SynthSpec(entities=500, relations=7, edges=BLOCK_EDGES + 4_465, seed=3, test=0.05)
FILES = ("train.tsv", "valid.tsv", "test.tsv", "synth.json")


def _bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in FILES}


def _rows(path: Path) -> list[tuple[str, str, str]]:
    return [(h, r, t) for h, r, t in (x.split("\t") for x in path.read_text().splitlines())]


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_ones(tmp_path: Path) -> None:
    write_synth(SMALL, str(tmp_path / "a"))
    write_synth(SMALL, str(tmp_path / "b"))
    write_synth(replace(SMALL, seed=4), str(tmp_path / "c"))
    assert _bytes(tmp_path / "a") == _bytes(tmp_path / "b")
    assert (tmp_path / "a/train.tsv").read_bytes() != (tmp_path / "c/train.tsv").read_bytes()


def test_chunk_size_does_not_change_the_output(tmp_path: Path) -> None:
    for chunk in (1_000, 7_000):
        write_synth(SMALL, str(tmp_path / f"tsv{chunk}"), chunk_edges=chunk)
        write_synth(SMALL, str(tmp_path / f"pq{chunk}"), chunk_edges=chunk, fmt="parquet")
    assert _bytes(tmp_path / "tsv1000") == _bytes(tmp_path / "tsv7000")
    for split in ("train", "valid", "test"):  # Parquet: the same rows (row groups follow chunks)
        tables = [pq.read_table(tmp_path / f"pq{c}/{split}.parquet") for c in (1_000, 7_000)]
        assert tables[0].equals(tables[1])
        assert tables[0].column_names == ["head", "relation", "tail"]
    tsv = _rows(tmp_path / "tsv1000/train.tsv")
    parquet = pq.read_table(tmp_path / "pq1000/train.parquet").to_pylist()
    assert [(r["head"], r["relation"], r["tail"]) for r in parquet] == tsv


def test_exactly_the_edges_asked_for_and_labels_in_range(tmp_path: Path) -> None:
    result = write_synth(SMALL, str(tmp_path))
    rows = {s: _rows(tmp_path / f"{s}.tsv") for s in ("train", "valid", "test")}
    assert sum(map(len, rows.values())) == SMALL.edges
    assert {s: len(r) for s, r in rows.items()} == result.triples
    record = json.loads((tmp_path / "synth.json").read_text())
    assert record["triples"] == result.triples and record["edges"] == SMALL.edges
    assert record["seed"] == SMALL.seed and record["clusters"] == round(math.sqrt(500))
    assert 0.03 * SMALL.edges < len(rows["test"]) < 0.07 * SMALL.edges
    every = [x for r in rows.values() for x in r]
    assert {h for h, _, _ in every} | {t for _, _, t in every} <= {f"e{i}" for i in range(500)}
    assert {r for _, r, _ in every} == {f"r{i}" for i in range(7)}


def test_no_triple_is_in_two_splits(tmp_path: Path) -> None:
    write_synth(SMALL, str(tmp_path))
    rows = {s: _rows(tmp_path / f"{s}.tsv") for s in ("train", "valid", "test")}
    assert len(set(rows["train"])) < len(rows["train"])  # duplicates are drawn: a real test
    sets = [set(r) for r in rows.values()]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    # the split is a function of the triple (and the seed)
    h, r, t = (np.array([5, 5, 9]), np.array([1, 1, 2]), np.array([7, 7, 3]))
    codes = split_codes(h, r, t, SynthSpec(entities=10, relations=3, edges=3, test=0.3))
    assert codes[0] == codes[1]


def _top_share(spec: SynthSpec) -> float:
    h, _, t = next(generate_edges(spec, chunk_edges=spec.edges))
    degree = np.sort(np.bincount(np.concatenate([h, t]), minlength=spec.entities))[::-1]
    return float(degree[: spec.entities // 100].sum() / degree.sum())


def test_degrees_are_heavy_tailed() -> None:
    spec = SynthSpec(entities=5_000, relations=10, edges=100_000, seed=1)
    assert _top_share(spec) > 0.2  # the top 1 % of entities: over a fifth of the endpoints
    assert _top_share(replace(spec, exponent=0.0)) < 0.03  # uniform


def _popularity_mrr(graph: Path, entities: int) -> float:
    """Filtered MRR, both sides, of ranking every entity by its degree in train: what a model
    reaches without the planted structure."""
    train_rows, test_rows = (
        _rows(graph / "train.tsv"),
        list(dict.fromkeys(_rows(graph / "test.tsv"))),
    )
    degree = Counter([h for h, _, _ in train_rows] + [t for _, _, t in train_rows])
    score = {f"e{i}": degree[f"e{i}"] for i in range(entities)}
    ascending = np.sort(np.array(list(score.values())))
    answers: dict[tuple[str, str, str], set[str]] = {}
    for h, r, t in {*train_rows, *test_rows}:
        answers.setdefault(("tail", h, r), set()).add(t)
        answers.setdefault(("head", r, t), set()).add(h)
    reciprocal = []
    for h, r, t in test_rows:
        for true, query in ((t, ("tail", h, r)), (h, ("head", r, t))):
            higher = entities - int(np.searchsorted(ascending, score[true], side="right"))
            filtered = sum(score[e] > score[true] for e in answers[query])
            reciprocal.append(1.0 / (1 + higher - filtered))
    return float(np.mean(reciprocal))


def test_the_planted_structure_is_learnable(tmp_path: Path) -> None:
    """ComplEx, 3 epochs on 40,000 edges: test MRR twice that of ranking by popularity (and
    many times random ranking's). A flatter power law than the default (0.8), so that
    popularity alone explains less."""
    spec = SynthSpec(
        entities=2_000, relations=10, edges=40_000, seed=0, exponent=0.8, valid=0.0, test=0.02
    )
    graph = write_synth(spec, str(tmp_path / "graph"))
    raw = {
        "run": {"root": str(tmp_path / "runs"), "name": "synth", "seed": 0},
        "data": {**graph.files, "header": False},  # what `kgpipe synth` prints
        "model": {
            "name": "complex",
            "dim": 32,
            "init": "normal",
            "init_scale": 0.001,
            "reciprocal": True,
        },
        "training": {
            "mode": "1vsall",
            "loss": "cross_entropy",
            "epochs": 3,
            "batch_size": 512,
            "optimizer": "adagrad",
            "lr": 0.1,
            "threads": 1,
        },
        "evaluation": {"every": 0},
        "checkpoint": {"background": False},
    }
    results = train(parse_config(raw)).results
    assert results is not None
    popularity = _popularity_mrr(tmp_path / "graph", spec.entities)
    random_mrr = sum(1 / k for k in range(1, spec.entities + 1)) / spec.entities
    assert results["mrr"] > 2 * popularity > 10 * random_mrr, (results, popularity)


def test_parquet_and_tsv_read_as_the_same_graph(tmp_path: Path) -> None:
    spec = SynthSpec(entities=300, relations=4, edges=5_000, seed=2, test=0.05)
    graphs = [write_synth(spec, str(tmp_path / f), fmt=f) for f in ("tsv", "parquet")]
    loaded = [load_dataset(DataConfig(**g.files, header=False)) for g in graphs]
    assert loaded[0].vocab.num_entities == loaded[1].vocab.num_entities
    for split in ("train", "valid", "test"):
        assert getattr(loaded[0], split).equal(getattr(loaded[1], split))


@pytest.mark.parametrize("fmt", ["tsv", "parquet"])
def test_an_interrupted_write_leaves_no_complete_looking_file(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is left, and nothing is said after the interruption: an aborted Parquet
    writer tried to write its footer to the closed file when collected (a traceback each)."""
    import gc
    import sys

    def stop(done: int, total: int) -> None:
        if done > 2_000:
            raise KeyboardInterrupt

    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(KeyboardInterrupt):
        write_synth(SMALL, str(tmp_path), chunk_edges=1_000, progress=stop, fmt=fmt)
    gc.collect()
    assert unraisable == []
    assert list(tmp_path.iterdir()) == []  # no split file, no temporary file, no marker


def test_an_existing_graph_is_refused_unless_overwrite(tmp_path: Path) -> None:
    spec = SynthSpec(entities=50, relations=3, edges=500)
    write_synth(spec, str(tmp_path), fmt="parquet")
    with pytest.raises(DataError, match=r"holds synth\.json, train\.parquet"):
        write_synth(spec, str(tmp_path))
    write_synth(spec, str(tmp_path), overwrite=True)  # the other format's files are removed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"entities": 0}, "entities must be"),
        ({"clusters": 51}, "clusters must be an integer from 1 to the entities"),
        ({"clusters": 2.5}, "clusters must be an integer"),
        ({"noise": 1.5}, "noise must be"),
        ({"valid": 0.5}, "valid must be"),
        ({"seed": -1}, "seed must be"),
        ({"exponent": -0.1}, "exponent must be"),
    ],
)
def test_invalid_parameters_are_config_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SynthSpec(**{"entities": 50, "relations": 3, "edges": 10, **change})  # type: ignore[arg-type]


def test_the_cli_writes_and_prints_the_training_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["synth", str(tmp_path / "g"), "--entities", "60", "--relations", "3", "--edges",
            "2000", "--valid", "0.05", "--test", "0.05"]  # fmt: skip
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "wrote 2,000 edges (train " in err and "edges/s)" in err
    sets = [a.removeprefix("data.") for a in out.splitlines()[0].split() if a.startswith("data.")]
    data = dict(s.split("=", 1) for s in sets)
    assert data == {
        "train": str(tmp_path / "g/train.tsv"),
        "valid": str(tmp_path / "g/valid.tsv"),
        "test": str(tmp_path / "g/test.tsv"),
        "header": "false",
    }
    assert Counter(out.splitlines()[3:]) == Counter(f"  {k}: {v}" for k, v in data.items())
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and err.startswith("error:") and "--overwrite" in err
    assert run_cli([*argv, "--overwrite", "-q"], capsys) == (0, "", "")
    # a split too small to hold an edge is not in the command (kgpipe refuses an empty file)
    tiny = ["synth", str(tmp_path / "t"), "--entities", "20", "--relations", "2", "--edges", "30"]
    code, out, err = run_cli(tiny, capsys)
    assert code == 0 and "note: valid is empty" in err, err
    assert "data.valid=" not in out and "data.test=" not in out and "data.train=" in out


def test_writes_to_s3(s3_server: S3Server) -> None:
    import s3fs

    opts = s3_server.storage_options()
    spec = SynthSpec(entities=100, relations=3, edges=3_000, seed=5)
    result = write_synth(spec, "s3://kgpipe/synth/g", storage_options=opts, chunk_edges=1_000)
    assert result.files["train"] == "s3://kgpipe/synth/g/train.tsv"
    fs = s3fs.S3FileSystem(**opts, skip_instance_cache=True)
    listed = sorted(p.rsplit("/", 1)[1] for p in fs.find("kgpipe/synth/g"))
    assert listed == sorted(FILES)
    lines = sum(len(fs.cat(f"kgpipe/synth/g/{f}").splitlines()) for f in FILES[:3])
    assert lines == spec.edges
    assert json.loads(fs.cat("kgpipe/synth/g/synth.json"))["triples"] == result.triples

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_synth(spec, "s3://kgpipe/synth/cut", storage_options=opts, progress=stop)
    assert not fs.exists("kgpipe/synth/cut/synth.json")
    assert not fs.exists("kgpipe/synth/cut/train.tsv")
