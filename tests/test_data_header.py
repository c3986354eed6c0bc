"""``data.header: auto`` (the default): a CSV/TSV header row is found, skipped and reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kgpipe.config import DataConfig, parse_config
from kgpipe.data.dataset import load_dataset
from kgpipe.data.formats.base import LabeledTriples
from kgpipe.data.formats.header import detect_header, normalize
from kgpipe.errors import DataError
from kgpipe.runs.stage import prepare_run

# a small graph whose relations repeat and whose entities occur more than once
ROWS = [
    ("alice", "knows", "bob"),
    ("bob", "knows", "carol"),
    ("carol", "likes", "alice"),
    ("dave", "likes", "bob"),
    ("erin", "knows", "dave"),
    ("carol", "knows", "erin"),
]


def write(path: Path, rows: list[tuple[str, str, str]], sep: str = ",") -> str:
    path.write_text("".join(sep.join(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def stage(tmp_path: Path, data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Stage a run on ``data``; its data.json and what staging logged."""
    said: list[str] = []
    config = parse_config({"run": {"root": str(tmp_path / "runs"), "name": "r"}, "data": data})
    prepare_run(config, log=said.append)
    return json.loads((tmp_path / "runs" / "r" / "data.json").read_text()), said


def test_the_default_is_auto() -> None:
    assert DataConfig(train="x.csv").header == "auto"


def test_csv_header_row_is_detected_by_default(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", [("head", "relation", "tail"), *ROWS])
    ds = load_dataset(DataConfig(train=train))
    assert ds.vocab.relations == ("knows", "likes")
    assert "head" not in ds.vocab.entities and "tail" not in ds.vocab.entities
    assert len(ds.train) == len(ROWS)
    rep = ds.reports["train"]
    assert (rep.header, rep.header_detected, rep.lines) == (True, "auto", len(ROWS))
    assert "header row detected and skipped (data.header: auto)" in ds.summary()

    info, said = stage(tmp_path, {"train": train})
    assert info["splits"]["train"]["header"] is True
    assert info["splits"]["train"]["header_detected"] == "auto"
    assert any("header row detected and skipped" in line for line in said)


@pytest.mark.parametrize(
    "names",
    [
        ("subject", "predicate", "object"),
        ("Subject_ID", "Predicate", "Object_ID"),
        ("s", "p", "o"),
        ("source", "relation_type", "target"),
        ("from", "rel", "to"),
        ("?s", "?p", "?o"),  # a SPARQL result (a Wikidata Query Service download)
        ("$subject", "$predicate", "$object"),
        (":START_ID", ":TYPE", ":END_ID"),  # Neo4j's import files
    ],
)
def test_common_column_names_are_a_header(tmp_path: Path, names: tuple[str, str, str]) -> None:
    train = write(tmp_path / "train.tsv", [names, *ROWS], sep="\t")
    ds = load_dataset(DataConfig(train=train))
    assert ds.reports["train"].header
    assert names[1] not in ds.vocab.relations


def test_made_up_names_found_nowhere_else_are_a_header(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", [("x", "y", "z"), *ROWS])
    ds = load_dataset(DataConfig(train=train))
    assert ds.reports["train"].header
    assert ds.vocab.relations == ("knows", "likes")


def test_headerless_csv_is_read_from_its_first_line(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", ROWS)
    ds = load_dataset(DataConfig(train=train))
    rep = ds.reports["train"]
    assert (rep.header, rep.header_detected, rep.triples) == (False, "auto", len(ROWS))
    assert "no header row (data.header: auto)" in ds.summary()


@pytest.mark.parametrize(
    "first",
    [
        ("1", "2", "3"),  # numbers
        ("http://x.org/a", "http://x.org/p", "http://x.org/b"),  # IRIs: no column names
        ("/m/0abc", "/people/person", "/m/0xyz"),  # Freebase ids
        ("frank", "knows", "gina"),  # a relation that occurs again
        ("frank", "hates", "alice"),  # an entity that occurs again
        ("frank", "frank", "frank"),  # not three names
    ],
)
def test_a_first_data_line_is_not_a_header(tmp_path: Path, first: tuple[str, str, str]) -> None:
    train = write(tmp_path / "train.csv", [first, *ROWS])
    ds = load_dataset(DataConfig(train=train))
    assert not ds.reports["train"].header
    assert len(ds.train) == len(ROWS) + 1


def test_unique_values_say_nothing_where_relations_do_not_repeat(tmp_path: Path) -> None:
    """Every relation once: a first line of values found nowhere else is ordinary here."""
    rows = [("a", "r1", "b"), ("c", "r2", "d"), ("e", "r3", "f"), ("g", "r4", "h")]
    ds = load_dataset(DataConfig(train=write(tmp_path / "train.csv", rows)))
    assert not ds.reports["train"].header and len(ds.train) == 4


def test_explicit_header_false_keeps_the_old_behaviour(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", [("head", "relation", "tail"), *ROWS])
    ds = load_dataset(DataConfig(train=train, header=False))
    assert "relation" in ds.vocab.relations
    assert len(ds.train) == len(ROWS) + 1
    rep = ds.reports["train"]
    assert (rep.header, rep.header_detected) == (False, "config")
    assert ds.summary().endswith(f"from {train}")  # no header note
    info, _ = stage(tmp_path, {"train": train, "header": False})
    assert info["splits"]["train"]["header"] is False
    assert info["splits"]["train"]["header_detected"] == "config"


def test_explicit_header_true(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", [("frank", "knows", "alice"), *ROWS])
    ds = load_dataset(DataConfig(train=train, header=True))
    rep = ds.reports["train"]
    assert (rep.header, rep.header_detected, rep.triples) == (True, "config", len(ROWS))


def test_column_names_imply_a_header(tmp_path: Path) -> None:
    rows = [("w", "src", "rel", "dst"), *[("1", h, r, t) for h, r, t in ROWS]]
    path = tmp_path / "train.csv"
    path.write_text("".join(",".join(r) + "\n" for r in rows), encoding="utf-8")
    ds = load_dataset(DataConfig(train=str(path), columns=("src", "rel", "dst")))
    rep = ds.reports["train"]
    assert (rep.header, rep.header_detected, rep.triples) == (True, "columns", len(ROWS))


def test_valid_and_test_files_are_decided_against_train(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", ROWS)
    valid = write(
        tmp_path / "valid.csv",
        [("u", "v", "w"), ("alice", "likes", "erin"), ("bob", "likes", "dave")],
    )
    test = write(tmp_path / "test.csv", [("dave", "knows", "alice"), ("erin", "likes", "bob")])
    ds = load_dataset(DataConfig(train=train, valid=valid, test=test))
    assert [ds.reports[s].header for s in ("train", "valid", "test")] == [False, True, False]
    assert len(ds.valid) == 2 and len(ds.test) == 2
    assert "v" not in ds.vocab.relations


def test_a_header_only_file_is_an_error(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", [("head", "relation", "tail")])
    with pytest.raises(DataError, match="the file has only a header row"):
        load_dataset(DataConfig(train=train))


def test_parquet_and_benchmarks_are_unaffected(tmp_path: Path) -> None:
    table = pa.table({k: [r[i] for r in ROWS] for i, k in enumerate(("head", "relation", "tail"))})
    pq.write_table(table, tmp_path / "g.parquet")
    ds = load_dataset(DataConfig(train=str(tmp_path / "g.parquet")))
    rep = ds.reports["train"]
    assert (rep.header, rep.header_detected, rep.triples) == (False, "n/a", len(ROWS))
    umls = load_dataset(DataConfig(dataset="umls"))
    assert {r.header_detected for r in umls.reports.values()} == {"benchmark"}
    assert (len(umls.train), len(umls.valid), len(umls.test)) == (5216, 652, 661)


def test_detect_header_and_normalize() -> None:
    def lt(*rows: tuple[str, str, str]) -> LabeledTriples:
        heads, relations, tails = (list(col) for col in zip(*rows, strict=True))
        return LabeledTriples(heads, relations, tails, list(range(1, len(rows) + 1)))

    assert normalize("Subject_ID") == "subject" and normalize("relation-type") == "relationtype"
    assert normalize("id") == "id" and normalize("Label") == "label"
    assert detect_header(lt(("head", "relation", "tail")))
    assert not detect_header(lt(("nan", "relation", "tail")))  # a number
    assert not detect_header(lt(("x", "y", "z"), ("a", "r", "b")))  # too few rows to tell
