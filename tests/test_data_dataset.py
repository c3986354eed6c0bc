"""Loading whole data sets: ids, vocabulary files, duplicates, unseen triples, benchmarks."""

from __future__ import annotations

import gzip
import logging
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

from kgpipe.config import DataConfig
from kgpipe.data.benchmarks import BENCHMARKS, BUNDLED, resolve_benchmark
from kgpipe.data.dataset import SplitReport, TripleDataset, load_dataset
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import DataError, KgpipeError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def shared() -> Path:
    if not (SHARED / "SHA256SUMS").exists():
        pytest.skip(f"{SHARED} not available")
    return SHARED


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def labelled(ds: TripleDataset, split: str) -> list[tuple[str, str, str]]:
    v = ds.vocab
    return [
        (v.entities[h], v.relations[r], v.entities[t]) for h, r, t in getattr(ds, split).tolist()
    ]


TRAIN = ["b\tr2\tc", "a\tr1\tb", "c\tr1\ta", "d\tr2\ta"]


# ---------------------------------------------------------------------------------------------
# ids and vocabulary


def test_ids_sorted_and_independent_of_line_order(tmp_path: Path) -> None:
    train = write(tmp_path / "train.tsv", TRAIN)
    ds = load_dataset(DataConfig(train=train))
    assert ds.vocab.entities == ("a", "b", "c", "d")
    assert ds.vocab.relations == ("r1", "r2")
    assert (ds.num_entities, ds.num_relations) == (4, 2)
    assert ds.train.dtype == torch.int64
    assert ds.train.tolist() == [[1, 1, 2], [0, 0, 1], [2, 0, 0], [3, 1, 0]]  # file order
    assert ds.valid.shape == (0, 3) and ds.test.shape == (0, 3)
    assert ds.valid.dtype == torch.int64
    assert set(ds.reports) == {"train"}

    lines = list(TRAIN)
    random.Random(1).shuffle(lines)
    ds2 = load_dataset(DataConfig(train=write(tmp_path / "shuffled.tsv", lines)))
    assert ds2.vocab == ds.vocab
    assert sorted(map(tuple, ds2.train.tolist())) == sorted(map(tuple, ds.train.tolist()))
    assert ds2.fingerprint != ds.fingerprint  # the files differ


def test_unseen_labels_get_following_ids(tmp_path: Path) -> None:
    train = write(tmp_path / "train.tsv", TRAIN)
    valid = write(tmp_path / "valid.tsv", ["a\tr1\tz", "y\tr3\tb", "a\tr2\tb"])
    test = write(tmp_path / "test.tsv", ["x\tr1\ta", "a\tr0\tb"])
    ds = load_dataset(DataConfig(train=train, valid=valid, test=test))
    assert ds.vocab.entities == ("a", "b", "c", "d", "x", "y", "z")
    assert ds.vocab.relations == ("r1", "r2", "r0", "r3")
    assert labelled(ds, "valid") == [("a", "r1", "z"), ("y", "r3", "b"), ("a", "r2", "b")]
    assert ds.reports["valid"].unseen == 2
    assert ds.reports["test"].unseen == 2
    assert ds.reports["valid"].unseen_action == "keep"
    assert ds.reports["train"].unseen_action == "n/a"


def test_vocabulary_lookup_and_hint() -> None:
    vocab = Vocabulary(entities=("alice", "bob"), relations=("knows",))
    assert vocab.entity_id("bob") == 1
    assert vocab.relation_id("knows") == 0
    with pytest.raises(KgpipeError) as info:
        vocab.entity_id("alic")
    assert str(info.value) == "unknown entity 'alic'; did you mean 'alice'?"
    with pytest.raises(KgpipeError) as info:
        vocab.relation_id("zzz")
    assert str(info.value) == "unknown relation 'zzz'; the graph's only relation is 'knows'"
    with pytest.raises(KgpipeError) as info:
        vocab.entity_id("zzz")  # nothing close: a vocabulary this small is listed
    assert str(info.value) == "unknown entity 'zzz'; the graph's entities are 'alice' and 'bob'"
    many = Vocabulary(entities=tuple(f"e{i}" for i in range(13)), relations=("knows",))
    with pytest.raises(KgpipeError) as info:
        many.entity_id("zzz")  # 13 labels: too many to list
    assert str(info.value) == "unknown entity 'zzz'"
    long = Vocabulary(
        entities=tuple(f"http://example.org/{i:040d}" for i in range(12)), relations=("k",)
    )
    with pytest.raises(KgpipeError) as info:
        long.entity_id("zzz")  # 12 labels, but a list of them would be over 400 characters
    assert str(info.value) == "unknown entity 'zzz'"


def test_vocabulary_round_trip(tmp_path: Path) -> None:
    labels = ("plain", "tab\there", "new\nline", "back\\slash", "cr\rlf\r\n", "\\t literal", "")
    vocab = Vocabulary(entities=labels, relations=("r\t1", "ünï 位"))
    vocab.write(str(tmp_path / "vocab"))
    text = (tmp_path / "vocab" / "entities.tsv").read_text(encoding="utf-8")
    assert text.splitlines()[1] == "1\ttab\\there"
    assert len(text.split("\n")) == len(labels) + 1
    assert Vocabulary.read(str(tmp_path / "vocab")) == vocab


def test_vocabulary_round_trip_memory_url() -> None:
    root = f"memory://kgpipe-test-{uuid.uuid4().hex}"
    vocab = Vocabulary(entities=("a", "b\tc"), relations=("r",))
    try:
        vocab.write(f"{root}/run/vocab/")
        assert Vocabulary.read(f"{root}/run/vocab") == vocab
    finally:
        fsspec.filesystem("memory").rm(root, recursive=True)


@pytest.mark.parametrize(
    ("content", "problem", "line"),
    [
        ("0\ta\n2\tb\n", "ids must be 0..n-1 in order: expected 1, found 2", 2),
        ("0\ta\nb\n", "expected 'id<TAB>label'", 2),
        ("x\ta\n", "id 'x' is not an integer", 1),
        ("0\ta\n1\ta\n", "duplicate label 'a' (also id 0)", 2),
        ("0\ta\\q\n", "invalid escape sequence '\\\\q'", 1),
    ],
)
def test_vocabulary_read_validates(tmp_path: Path, content: str, problem: str, line: int) -> None:
    (tmp_path / "entities.tsv").write_text(content, encoding="utf-8")
    (tmp_path / "relations.tsv").write_text("0\tr\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        Vocabulary.read(str(tmp_path))
    assert info.value.problem == problem
    assert info.value.line == line
    assert info.value.source == f"{tmp_path}/entities.tsv"


def test_vocabulary_read_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        Vocabulary.read(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# duplicates and unseen


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("part", [1 << 22, 7, 64])
def test_deduplication_in_parts_keeps_every_first_occurrence(
    monkeypatch: pytest.MonkeyPatch, part: int, dtype: str
) -> None:
    """Rows are deduplicated a part of the heads at a time (parts of 7 and 64 rows here): the
    first occurrences are those of one sort over every row, whatever the parts."""
    import numpy as np

    import kgpipe.data.dedup as dataset

    monkeypatch.setattr(dataset, "_DEDUP_PART", part)
    rng = np.random.default_rng(0)
    rows = np.stack(
        [rng.integers(0, 40, 3_000), rng.integers(0, 3, 3_000), rng.integers(0, 40, 3_000)], 1
    ).astype(dtype)
    first = dataset.first_occurrences(rows, 40, 3)
    seen: dict[tuple[int, ...], int] = {}
    for i, row in enumerate(map(tuple, rows.tolist())):
        seen.setdefault(row, i)
    assert first.tolist() == sorted(seen.values())
    assert len(first) < 3_000  # the draw repeats rows


def test_deduplication_widens_int32_ids_before_it_forms_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 2^20 entities and 4,096 relations a row's key is h * 2^32 + r * 2^20 + t: formed in
    int32 it would wrap to the same key for rows that differ only in the head, and one of them
    would be dropped as a duplicate."""
    import numpy as np

    import kgpipe.data.dedup as dataset

    monkeypatch.setattr(dataset, "_DEDUP_PART", 500)
    rng = np.random.default_rng(1)
    n = 4_000  # 8 parts: heads 5 and 13 share one
    rows = np.stack(
        [rng.integers(0, 1 << 20, n), rng.integers(0, 4_096, n), rng.integers(0, 1 << 20, n)], 1
    ).astype(np.int32)
    rows[n // 2 :] = rows[: n // 2]  # every row twice
    rows[10], rows[20] = (5, 3, 9), (13, 3, 9)
    first = dataset.first_occurrences(rows, 1 << 20, 4_096)
    seen: dict[tuple[int, ...], int] = {}
    for i, row in enumerate(map(tuple, rows.tolist())):
        seen.setdefault(row, i)
    assert first.tolist() == sorted(seen.values())
    assert 10 in first and 20 in first


def test_duplicates_removed_and_counted(tmp_path: Path) -> None:
    train = write(tmp_path / "train.tsv", ["a\tr\tb", "b\tr\tc", "a\tr\tb", "c\tr\ta", "b\tr\tc"])
    valid = write(tmp_path / "valid.tsv", ["a\tr\tc", "a\tr\tc", "a\tr\tc"])
    ds = load_dataset(DataConfig(train=train, valid=valid))
    assert labelled(ds, "train") == [("a", "r", "b"), ("b", "r", "c"), ("c", "r", "a")]
    assert ds.reports["train"] == SplitReport(
        source=train,
        lines=5,
        triples=3,
        duplicates=2,
        unseen=0,
        unseen_action="n/a",
        sha256=ds.reports["train"].sha256,
    )
    assert (ds.reports["valid"].triples, ds.reports["valid"].duplicates) == (1, 2)
    assert "2 duplicates removed" in ds.summary()


@pytest.fixture
def unseen_files(tmp_path: Path) -> dict[str, str]:
    return {
        "train": write(tmp_path / "train.tsv", ["a\tr\tb", "b\tr\tc"]),
        "valid": write(
            tmp_path / "valid.tsv",
            ["a\tr\tc", "# comment", "a\tr\tx", "a\tr\tx", "a\tq\tb", "c\tr\ta"],
        ),
        "test": write(tmp_path / "test.tsv", ["c\tr\tb"]),
    }


def test_unseen_keep(unseen_files: dict[str, str]) -> None:
    ds = load_dataset(DataConfig(**unseen_files, unseen="keep"))
    assert ds.vocab.entities == ("a", "b", "c", "x")
    assert ds.vocab.relations == ("r", "q")
    rep = ds.reports["valid"]
    assert (rep.lines, rep.triples, rep.duplicates, rep.unseen) == (5, 4, 1, 2)
    assert "valid: 4 triples (1 duplicates removed, 2 with unseen entities/relations kept)" in (
        ds.summary()
    )


def test_unseen_drop(unseen_files: dict[str, str]) -> None:
    ds = load_dataset(DataConfig(**unseen_files, unseen="drop"))
    assert ds.vocab.entities == ("a", "b", "c")
    assert ds.vocab.relations == ("r",)
    assert labelled(ds, "valid") == [("a", "r", "c"), ("c", "r", "a")]
    rep = ds.reports["valid"]
    assert (rep.lines, rep.triples, rep.duplicates, rep.unseen) == (5, 2, 1, 2)
    assert rep.unseen_action == "drop"
    assert "2 with unseen entities/relations dropped" in ds.summary()
    assert int(ds.valid.max()) < ds.num_entities


def test_unseen_error(unseen_files: dict[str, str]) -> None:
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(**unseen_files, unseen="error"))
    err = info.value
    assert err.source == unseen_files["valid"]
    assert err.line == 3
    assert err.excerpt == "a\tr\tx"
    assert err.problem == (
        "2 triples use an entity or relation not in train (first: entity 'x'); "
        "set data.unseen to 'keep' or 'drop' to accept them"
    )
    assert str(err).startswith(f"{unseen_files['valid']}, line 3: 2 triples use")


def test_unseen_error_passes_when_all_seen(unseen_files: dict[str, str]) -> None:
    ds = load_dataset(
        DataConfig(train=unseen_files["train"], test=unseen_files["test"], unseen="error")
    )
    assert ds.reports["test"].unseen == 0


# ---------------------------------------------------------------------------------------------
# formats through load_dataset


def test_load_csv_with_header_and_compression(tmp_path: Path) -> None:
    train = tmp_path / "train.csv.gz"
    train.write_bytes(gzip.compress(b"s,p,o\r\na,r,b\r\nb,r,c\r\n"))
    ds = load_dataset(DataConfig(train=str(train), header=True, columns=("s", "p", "o")))
    assert labelled(ds, "train") == [("a", "r", "b"), ("b", "r", "c")]


@pytest.mark.parametrize("blank", ["\t", "\t\t", "\t\t\t", " \t ", "   "])
@pytest.mark.parametrize("reader", ["columnar", "line parser"])
def test_a_line_of_only_whitespace_is_blank_however_many_delimiters_it_has(
    tmp_path: Path,
    blank: str,
    reader: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two tabs split into three (empty) fields: such a line (an empty row of a spreadsheet's
    export) was "empty head field" while one or three tabs were skipped as blank."""
    import kgpipe.data.reading as reading

    train = tmp_path / "train.tsv"
    train.write_text(f"a\tr\tb\n{blank}\nb\tr\tc\n\tr\ta\n", encoding="utf-8")
    columns: dict[str, Any] = {}
    if reader == "line parser":
        monkeypatch.setattr(reading, "_columnar_ok", lambda src, cfg: False)
    with pytest.raises(DataError) as info:  # a line with an empty field is still refused
        load_dataset(DataConfig(train=str(train), **columns))
    assert str(info.value).startswith(f"{train}, line 4: empty head field"), info.value
    train.write_text(f"a\tr\tb\n{blank}\nb\tr\tc\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="kgpipe"):
        ds = load_dataset(DataConfig(train=str(train), memory_budget="64MiB", **columns))
    assert labelled(ds, "train") == [("a", "r", "b"), ("b", "r", "c")]
    # the columnar reader skips it itself (the line parser, which it gives a file it cannot
    # take, holds the whole file: under a memory budget it says so)
    said = "read by the line parser, which holds whole files in memory" in caplog.text
    assert said is (reader == "line parser"), caplog.text
    spaced = tmp_path / "spaced.tsv"  # the same with a space as the delimiter
    spaced.write_text("a r b\n  \nb r c\n", encoding="utf-8")
    ds = load_dataset(DataConfig(train=str(spaced), delimiter=" ", **columns))
    assert labelled(ds, "train") == [("a", "r", "b"), ("b", "r", "c")]


@pytest.mark.parametrize("blank", [",,", ", ,", ",,,,", " "])
@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_row_of_only_commas_is_blank(tmp_path: Path, blank: str, suffix: str) -> None:
    """An empty spreadsheet row exported as CSV (``,,``) is a blank line, as two tabs are in
    a TSV file (it was "empty head field"), in the CSV reader and with a comma delimiter."""
    train = tmp_path / f"train{suffix}"
    train.write_text(f"a,r,b\n{blank}\nb,r,c\n", encoding="utf-8")
    ds = load_dataset(DataConfig(train=str(train), delimiter=","))
    assert labelled(ds, "train") == [("a", "r", "b"), ("b", "r", "c")]
    assert ds.reports["train"].lines == 2
    train.write_text(f"a,r,b\n{blank}\n,r,c\n", encoding="utf-8")
    with pytest.raises(DataError) as info:  # a row with one empty field is still refused
        load_dataset(DataConfig(train=str(train), delimiter=","))
    assert str(info.value).startswith(f"{train}, line 3: empty head field"), info.value
    valid = tmp_path / f"valid{suffix}"  # an unseen label is named at its line, past the row
    train.write_text("a,r,b\n", encoding="utf-8")
    valid.write_text(f"a,r,b\n{blank}\nz,r,a\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(train=str(train), valid=str(valid), delimiter=",", unseen="error"))
    assert str(info.value).startswith(f"{valid}, line 3:"), info.value


def test_load_ntriples_literals(tmp_path: Path) -> None:
    nt = tmp_path / "g.nt"
    nt.write_text(
        "<http://a> <http://p> <http://b> .\n"
        '<http://a> <http://name> "A"@en .\n'
        "_:x <http://p> <http://a> .\n",
        encoding="utf-8",
    )
    dropped = load_dataset(DataConfig(train=str(nt)))
    assert dropped.reports["train"].literals_dropped == 1
    assert dropped.reports["train"].lines == 3
    assert dropped.vocab.entities == ("_:x", "http://a", "http://b")
    assert "1 literal statements dropped" in dropped.summary()
    kept = load_dataset(DataConfig(train=str(nt), literals="keep"))
    assert kept.vocab.entities == ('"A"@en', "_:x", "http://a", "http://b")
    assert kept.reports["train"].literals_dropped == 0


def test_load_only_literals_is_an_error(tmp_path: Path) -> None:
    nt = tmp_path / "g.nt"
    nt.write_text('<http://a> <http://name> "A" .\n', encoding="utf-8")
    with pytest.raises(DataError, match="all 1 statements have a literal object"):
        load_dataset(DataConfig(train=str(nt)))


def test_fingerprint_tracks_content(tmp_path: Path) -> None:
    train = write(tmp_path / "train.tsv", TRAIN)
    first = load_dataset(DataConfig(train=train)).fingerprint
    assert load_dataset(DataConfig(train=train)).fingerprint == first
    assert len(first) == 64
    gz = tmp_path / "train.tsv.gz"
    gz.write_bytes(gzip.compress(Path(train).read_bytes()))
    assert load_dataset(DataConfig(train=str(gz))).fingerprint == first  # same content
    write(tmp_path / "train.tsv", [*TRAIN, "a\tr1\td"])
    assert load_dataset(DataConfig(train=train)).fingerprint != first


# ---------------------------------------------------------------------------------------------
# benchmarks


def test_benchmark_table_matches_sha256sums() -> None:
    sums = (shared() / "SHA256SUMS").read_text().split("\n")
    table = {}
    for line in filter(None, sums):
        digest, path = line.split()
        _, name, file = path.split("/")
        table.setdefault(name, {})[file.removesuffix(".txt")] = digest
    assert table == BENCHMARKS
    assert frozenset({"umls"}) == BUNDLED


def test_resolve_benchmark() -> None:
    urls = resolve_benchmark("UMLS", None)
    assert set(urls) == {"train", "valid", "test"}
    assert urls["train"].endswith("datasets/umls/train.txt.gz")
    assert Path(urls["valid"]).is_file()
    assert resolve_benchmark("wn18rr", "s3://bucket/kg/") == {
        "train": "s3://bucket/kg/wn18rr/train.txt",
        "valid": "s3://bucket/kg/wn18rr/valid.txt",
        "test": "s3://bucket/kg/wn18rr/test.txt",
    }
    with pytest.raises(KgpipeError) as info:
        resolve_benchmark("fb15k-237", None)
    assert "not bundled with kgpipe (bundled: umls)" in str(info.value)
    assert "set data.root" in str(info.value)
    with pytest.raises(KgpipeError) as info:
        resolve_benchmark("freebase", "/data")
    assert str(info.value) == (
        "unknown benchmark data set 'freebase'; known: fb15k-237, kinship, nations, umls, wn18rr"
    )


def test_bundled_umls() -> None:
    ds = load_dataset(DataConfig(dataset="umls"))
    assert (ds.num_entities, ds.num_relations) == (135, 46)
    assert [len(ds.train), len(ds.valid), len(ds.test)] == [5216, 652, 661]
    assert ds.reports["train"].sha256 == BENCHMARKS["umls"]["train"]
    assert ds.train.is_contiguous() and ds.train.shape == (5216, 3)
    assert "135 entities, 46 relations" in ds.summary()


def test_bundled_umls_is_the_published_copy() -> None:
    root = shared()
    bundled = resolve_benchmark("umls", None)
    for split, url in bundled.items():
        assert (
            gzip.decompress(Path(url).read_bytes()) == (root / "umls" / f"{split}.txt").read_bytes()
        )
    a = load_dataset(DataConfig(dataset="umls"))
    b = load_dataset(DataConfig(dataset="umls", root=str(root)))
    assert a.fingerprint == b.fingerprint
    assert a.vocab == b.vocab
    assert torch.equal(a.train, b.train) and torch.equal(a.test, b.test)


def test_benchmark_split_override(tmp_path: Path) -> None:
    valid = write(tmp_path / "valid.tsv", ["acquired_abnormality\tlocation_of\talga"])
    ds = load_dataset(DataConfig(dataset="umls", valid=valid))
    assert ds.reports["valid"].source == valid
    assert len(ds.valid) == 1 and len(ds.test) == 661


def test_benchmark_checksum_mismatch(tmp_path: Path) -> None:
    src = shared() / "nations"
    shutil.copytree(src, tmp_path / "nations")
    bad = tmp_path / "nations" / "train.txt"
    data = bad.read_bytes()
    bad.write_bytes(data.replace(b"\n", b"\r\n", 1))  # one changed line ending
    assert load_dataset(DataConfig(dataset="nations", root=str(src.parent))).num_entities == 14
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(dataset="nations", root=str(tmp_path)))
    err = info.value
    assert err.source == str(bad)
    expected = BENCHMARKS["nations"]["train"]
    assert err.problem.startswith(f"checksum mismatch: expected {expected}, got ")
    assert err.problem.endswith("the file is not the published nations train split")


def test_benchmark_missing_under_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped benchmark configs read ../shared/datasets: a new user elsewhere got "file
    not found" and no word of where the data comes from, or what the relative path meant."""
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(dataset="kinship", root=str(tmp_path)))
    said = str(info.value)
    assert said.startswith(f"{tmp_path}/kinship/train.txt: file not found: data.dataset kinship")
    assert "kgpipe bundles only umls" in said and "set data.root to the folder above" in said
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(dataset="kinship", root="../data"))
    absolute = tmp_path.parent / "data" / "kinship" / "train.txt"
    assert f"file not found ({absolute}: relative paths are read from the current" in str(
        info.value
    )


def test_fb15k237() -> None:
    ds = load_dataset(DataConfig(dataset="fb15k-237", root=str(shared())))
    assert (ds.num_entities, ds.num_relations) == (14_541, 237)
    assert [len(ds.train), len(ds.valid), len(ds.test)] == [272_115, 17_535, 20_466]
    assert ds.reports["train"].duplicates == 0
    # CRLF line endings: no label keeps the CR.
    assert not any(label.endswith("\r") for label in ds.vocab.entities)
