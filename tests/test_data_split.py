"""``data.split``: valid/test split off one train file (seeded, every valid/test entity and
relation in train), its config checks, what staging records, and a run trained on it; and the
warning of a run without validation data."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kgpipe.config import DataConfig, hashed_view, parse_config
from kgpipe.config.sections import SplitConfig
from kgpipe.data.dataset import TripleDataset, load_dataset
from kgpipe.data.split import keep_rows, split_triples
from kgpipe.errors import ConfigError
from kgpipe.pipeline import train
from kgpipe.runs.stage import NO_VALIDATION, prepare_run


def graph(n: int = 600, entities: int = 60, relations: int = 5, seed: int = 0) -> np.ndarray:
    """Distinct random triples, with a few entities and one relation used only once."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, [entities, relations, entities], size=(n, 3))
    rows = np.concatenate([rows, [[entities, relations, entities + 1]]])  # all three once
    return np.unique(rows, axis=0)[rng.permutation(len(np.unique(rows, axis=0)))]


def as_set(rows: np.ndarray) -> set[tuple[int, ...]]:
    return set(map(tuple, rows.tolist()))


def assert_standard_protocol(train: np.ndarray, *held_out: np.ndarray) -> None:
    entities = set(train[:, 0].tolist()) | set(train[:, 2].tolist())
    relations = set(train[:, 1].tolist())
    for part in held_out:
        for h, r, t in part.tolist():  # brute force, triple by triple
            assert h in entities and t in entities and r in relations, (h, r, t)


# ---------------------------------------------------------------------------------------------
# the split itself


def test_split_respects_fractions_and_the_protocol() -> None:
    rows = graph()
    n = len(rows)
    parts = split_triples(rows, valid=0.1, test=0.05, seed=3)
    assert (parts.wanted_valid, parts.wanted_test) == (round(0.1 * n), round(0.05 * n))
    assert abs(len(parts.valid) - 0.1 * n) <= 1 and abs(len(parts.test) - 0.05 * n) <= 1
    # a partition of the rows: nothing lost, nothing in two parts
    every = np.concatenate([parts.train, parts.valid, parts.test])
    assert sorted(every.tolist()) == list(range(n))
    assert_standard_protocol(rows[parts.train], rows[parts.valid], rows[parts.test])
    # train keeps every entity and relation
    assert set(rows[parts.train][:, [0, 2]].ravel().tolist()) == set(
        rows[:, [0, 2]].ravel().tolist()
    )
    assert set(rows[parts.train][:, 1].tolist()) == set(rows[:, 1].tolist())


def test_split_is_deterministic_per_seed() -> None:
    rows = graph()
    a = split_triples(rows, valid=0.1, test=0.1, seed=0)
    b = split_triples(rows.copy(), valid=0.1, test=0.1, seed=0)
    c = split_triples(rows, valid=0.1, test=0.1, seed=1)
    for part in ("train", "valid", "test"):
        assert np.array_equal(getattr(a, part), getattr(b, part))
    assert not np.array_equal(a.valid, c.valid)
    assert as_set(rows[a.test]) != as_set(rows[c.test])


def test_split_takes_what_it_can_from_a_sparse_graph() -> None:
    """A star: leaves 4..10 occur once and cannot leave train; 1, 2 and 3 twice or more."""
    rows = np.array([[0, 0, i] for i in range(1, 11)] + [[1, 0, 2], [2, 0, 3]])
    parts = split_triples(rows, valid=0.3, test=0.3, seed=0)
    assert (parts.wanted_valid, parts.wanted_test) == (4, 4)
    assert 0 < len(parts.valid) + len(parts.test) <= 3
    assert_standard_protocol(rows[parts.train], rows[parts.valid], rows[parts.test])


def test_self_loops_count_twice() -> None:
    rows = np.array([[0, 0, 0], [0, 0, 1], [1, 0, 1]])
    parts = split_triples(rows, valid=0.4, test=0.0, seed=0)
    assert_standard_protocol(rows[parts.train], rows[parts.valid])
    assert len(parts.valid) == 1


# ---------------------------------------------------------------------------------------------
# through load_dataset


def write_graph(path: Path, rows: np.ndarray, *, duplicates: int = 0) -> str:
    lines = [f"e{h}\tr{r}\te{t}" for h, r, t in rows.tolist()]
    lines += lines[:duplicates]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def labelled(ds: TripleDataset, split: str) -> set[tuple[str, str, str]]:
    v = ds.vocab
    return {
        (v.entities[h], v.relations[r], v.entities[t]) for h, r, t in getattr(ds, split).tolist()
    }


def test_load_dataset_splits_one_file(tmp_path: Path) -> None:
    rows = graph()
    path = write_graph(tmp_path / "g.tsv", rows, duplicates=7)
    cfg = DataConfig(train=path, split=SplitConfig(valid=0.05, test=0.1))
    ds = load_dataset(cfg)
    n = len(rows)
    assert abs(len(ds.valid) - 0.05 * n) <= 1 and abs(len(ds.test) - 0.1 * n) <= 1
    parts = [labelled(ds, s) for s in ("train", "valid", "test")]
    assert sum(map(len, parts)) == n == len(set.union(*parts))  # no triple lost or doubled
    assert set.union(*parts) == {(f"e{h}", f"r{r}", f"e{t}") for h, r, t in rows.tolist()}
    assert_standard_protocol(ds.train.numpy(), ds.valid.numpy(), ds.test.numpy())
    assert ds.num_entities == len(set(rows[:, [0, 2]].ravel().tolist()))  # none only in valid
    # reports and the record of the split
    train_rep, valid_rep = ds.reports["train"], ds.reports["valid"]
    assert train_rep.duplicates == 7
    assert train_rep.lines == train_rep.triples + train_rep.duplicates + train_rep.split_off
    assert train_rep.split_off == len(ds.valid) + len(ds.test)
    assert (valid_rep.source, valid_rep.split_from, valid_rep.triples) == (
        path,
        "train",
        len(ds.valid),
    )
    assert ds.split == {
        "source": path,
        "seed": 0,
        "fractions": {"valid": 0.05, "test": 0.1},
        "requested": {"valid": round(0.05 * n), "test": round(0.1 * n)},
        "triples": {"train": len(ds.train), "valid": len(ds.valid), "test": len(ds.test)},
    }
    summary = ds.summary()
    assert (
        f"valid: {len(ds.valid)} triples (split off train by data.split: 5.0%, seed 0)" in summary
    )
    assert f"{train_rep.split_off} moved to valid/test by data.split" in summary
    # deterministic; another seed another split, and another fingerprint
    again = load_dataset(cfg)
    assert labelled(again, "valid") == parts[1] and again.fingerprint == ds.fingerprint
    other = load_dataset(DataConfig(train=path, split=SplitConfig(valid=0.05, test=0.1, seed=1)))
    assert labelled(other, "valid") != parts[1] and other.fingerprint != ds.fingerprint


def test_only_a_valid_fraction(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g.tsv", graph())
    ds = load_dataset(DataConfig(train=path, split=SplitConfig(valid=0.1)))
    assert len(ds.valid) > 0 and len(ds.test) == 0
    assert set(ds.reports) == {"train", "valid"}
    assert ds.split is not None and ds.split["fractions"] == {"valid": 0.1}


def test_a_shortfall_is_said(tmp_path: Path) -> None:
    rows = np.array([[0, 0, i] for i in range(1, 21)])
    ds = load_dataset(
        DataConfig(train=write_graph(tmp_path / "star.tsv", rows), split=SplitConfig(test=0.2))
    )
    assert len(ds.test) == 0 and len(ds.train) == 20
    assert "data.split took only 0 of 4 test triples" in ds.summary()


# ---------------------------------------------------------------------------------------------
# config


BASE: dict[str, Any] = {"train": "g.tsv"}


SPLIT_OFF = "data.split makes the valid/test splits out of data.train: unset "


@pytest.mark.parametrize(
    ("data", "path", "problem"),
    [
        ({**BASE, "valid": "v.tsv", "split": {"valid": 0.1}},
         "data", SPLIT_OFF + "data.valid, or remove data.split"),
        ({**BASE, "test": "t.tsv", "dataset": "umls", "split": {"test": 0.1}},
         "data", SPLIT_OFF + "data.dataset and data.test, or remove data.split"),
        ({"dataset": "umls", "split": {"test": 0.1}},
         "data", "data.split needs data.train (the one file to split)"),
        ({**BASE, "split": {"valid": 0.5}},
         "data.split.valid", "Input should be less than 0.5 (got 0.5)"),
        ({**BASE, "split": {"test": -0.1}},
         "data.split.test", "Input should be greater than or equal to 0 (got -0.1)"),
        ({**BASE, "split": {}},
         "data.split", "data.split needs a valid or a test fraction above 0"),
        ({**BASE, "split": {"valid": 0.1, "train": 0.8}}, "data.split.train", "unknown key"),
    ],
)  # fmt: skip
def test_split_config_errors(data: dict[str, Any], path: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"data": data})
    (line,) = str(info.value).splitlines()  # one error, one line
    assert line.startswith("config: ") and f" {path}: " in line and problem in line


def test_no_split_leaves_the_config_hash_alone() -> None:
    assert "split" not in hashed_view(parse_config({"data": BASE}))["data"]
    with_split = hashed_view(parse_config({"data": {**BASE, "split": {"valid": 0.1}}}))
    assert with_split["data"]["split"] == {"valid": 0.1, "test": 0.0, "seed": 0}


# ---------------------------------------------------------------------------------------------
# staging: data.json and the warning of a run without validation


def stage(tmp_path: Path, data: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], list[str]]:
    said: list[str] = []
    config = parse_config({"run": {"root": str(tmp_path / "runs"), "name": "r"}, "data": data})
    prepare_run(config, log=said.append, **kw)
    return json.loads((tmp_path / "runs" / "r" / "data.json").read_text()), said


def test_staging_records_the_split(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g.tsv", graph())
    info, said = stage(tmp_path, {"train": path, "split": {"valid": 0.05, "test": 0.05}})
    split = info["split"]
    assert split["fractions"] == {"valid": 0.05, "test": 0.05} and split["seed"] == 0
    assert split["triples"]["valid"] == info["splits"]["valid"]["triples"] > 0
    assert info["splits"]["valid"]["split_from"] == "train"
    assert (
        info["splits"]["train"]["split_off"] == split["triples"]["valid"] + split["triples"]["test"]
    )
    assert any("split off train by data.split" in line for line in said)
    assert not any("no validation data" in line for line in said)


def test_a_run_without_validation_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_graph(tmp_path / "g.tsv", graph())
    info, said = stage(tmp_path, {"train": path})
    assert info["split"] is None
    assert f"WARNING: {NO_VALIDATION}" in said
    warned: list[str] = []
    stage(tmp_path / "w", {"train": path, "split": {"test": 0.1}}, warn=warned.append)
    assert warned == [NO_VALIDATION]
    config = parse_config(
        {"run": {"root": str(tmp_path / "q"), "name": "r"}, "data": {"train": path}}
    )
    with caplog.at_level(logging.WARNING, logger="kgpipe.runs"):
        prepare_run(config)  # no log, no warn: the logger
    assert NO_VALIDATION in caplog.text


def test_a_test_split_whose_every_triple_is_dropped_says_so(tmp_path: Path) -> None:
    """With data.unseen: drop, a test file of only unseen entities ended the run with no test
    metrics and no results.json, the log saying only `test: 0 triples`."""
    train = tmp_path / "train.tsv"
    train.write_text("a\tr\tb\nb\tr\tc\nc\tr\ta\n")
    test = tmp_path / "test.tsv"
    test.write_text("x\tr\ty\na\tq\tb\n")
    data = {"train": str(train), "valid": str(train), "test": str(test), "unseen": "drop"}
    _, said = stage(tmp_path, data)
    assert (
        f"WARNING: no test triples left: all 2 read from {test} have entities or relations not "
        "in train (dropped, data.unseen: drop), so there will be no test metrics"
    ) in said
    _, said = stage(tmp_path / "kept", {**data, "unseen": "keep"})
    assert not any("no test triples" in line for line in said)


# ---------------------------------------------------------------------------------------------
# end to end


def test_a_run_on_one_file_with_a_split_validates_and_tests(tmp_path: Path) -> None:
    rows = graph(n=400, entities=30, relations=3)
    lines = [f"e{h},r{r},e{t}" for h, r, t in rows.tolist()]
    random.Random(0).shuffle(lines)
    path = tmp_path / "graph.csv"
    path.write_text("head,relation,tail\n" + "\n".join(lines) + "\n", encoding="utf-8")
    said: list[str] = []
    config = parse_config({
        "run": {"root": str(tmp_path / "runs"), "name": "split", "seed": 0},
        "data": {"train": str(path), "split": {"valid": 0.1, "test": 0.1}},
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 2, "batch_size": 64, "negatives": 4, "chunk_size": 16},
        "evaluation": {"every": 1},
    })  # fmt: skip
    result = train(config, log=said.append)
    assert all("valid_mrr" in h.extra for h in result.history)
    assert result.results is not None
    info = json.loads((tmp_path / "runs" / "split" / "data.json").read_text())
    assert result.results["triples"] == info["split"]["triples"]["test"] > 0
    assert info["splits"]["train"]["header"] is True
    assert 0.0 < result.results["mrr"] <= 1.0
    assert not any("no validation data" in line for line in said)


def test_the_split_is_the_one_earlier_versions_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shuffle order is now drawn as int32 (half the memory of permutation(n)'s int64):
    the same order, so a graph splits as before (values from the int64 code, f54f223)."""
    g = np.random.default_rng(11)
    rows = np.stack(
        [g.integers(0, 40, 500), g.integers(0, 5, 500), g.integers(0, 40, 500)], 1
    ).astype(np.int32)
    parts = split_triples(rows, valid=0.1, test=0.1, seed=4)
    assert parts.valid[:8].tolist() == [3, 5, 10, 11, 34, 37, 38, 41]
    assert parts.test[:8].tolist() == [42, 44, 51, 71, 76, 80, 84, 89]
    assert parts.train_count == len(parts.train) == 500 - len(parts.valid) - len(parts.test)
    import kgpipe.data.split as split

    monkeypatch.setattr(split, "_CHUNK", 4)  # chunks of 64 rows: counted and moved in 8
    assert split_triples(rows, valid=0.1, test=0.1, seed=4).valid.tolist() == parts.valid.tolist()
    train = keep_rows(rows.copy(), parts.in_train)
    assert np.array_equal(train, rows[parts.train])
