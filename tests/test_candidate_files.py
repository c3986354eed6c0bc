"""Per-query candidates read from the graph's own files (``data.candidates``, OGB's
``head_neg``/``tail_neg``): staged for the triples staging keeps, ranked as a brute-force loop
over the same candidates ranks them, and named in ``results.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from candidate_files import umls_entities, umls_lines, write_candidate_files
from test_evaluation import _case

from kgpipe.config import DataConfig, parse_config
from kgpipe.data.dataset import load_dataset
from kgpipe.errors import ConfigError, DataError
from kgpipe.evaluation import FilterIndex, evaluate
from kgpipe.models.model import KGEModel
from kgpipe.pipeline import train
from kgpipe.query_candidates import FileCandidates
from kgpipe.runs.read import evaluate_run

TRAIN = ["a\tr\tb", "b\tr\tc", "c\ts\td", "d\ts\ta", "e\tr\ta"]
# line 3 repeats line 1; line 4 holds an entity train does not have (x)
VALID = ["a\ts\tc", "b\ts\td", "a\ts\tc", "x\tr\ta", "e\ts\tb"]


def _files(tmp_path: Path, rows: dict[str, list[str]], valid: list[str] = VALID) -> DataConfig:
    (tmp_path / "train.tsv").write_text("\n".join(TRAIN) + "\n")
    (tmp_path / "valid.tsv").write_text("\n".join(valid) + "\n")
    for side, lines in rows.items():
        (tmp_path / f"{side}.tsv").write_text("".join(x + "\n" for x in lines))
    return DataConfig(
        train=str(tmp_path / "train.tsv"),
        valid=str(tmp_path / "valid.tsv"),
        unseen="drop",
        candidates={
            "valid": {"head": str(tmp_path / "head.tsv"), "tail": str(tmp_path / "tail.tsv")}
        },
    )


def test_staged_rows_follow_the_triples_staging_keeps(tmp_path: Path) -> None:
    """A row per line of the split; the duplicate's and the dropped unseen triple's rows go."""
    head = ["a\tb", "b\tc", "c\td", "d\te", "e\ta"]
    tail = ["b\tb", "c\tc", "d\td", "e\te", "a\ta"]
    ds = load_dataset(_files(tmp_path, {"head": head, "tail": tail}))
    assert ds.reports["valid"].triples == 3  # lines 1, 2 and 5
    found = ds.candidates["valid"]
    ids = ds.vocab.entity_index
    want = [head[i].split("\t") for i in (0, 1, 4)]
    assert found.head.tolist() == [[ids[x] for x in row] for row in want]
    assert found.tail.tolist() == [[ids[x] for x in tail[i].split("\t")] for i in (0, 1, 4)]
    assert found.k == 2 and found.sources["head"]["rows"] == 5
    # the candidate files are part of the input: another file, another fingerprint
    (tmp_path / "head.tsv").write_text("".join(x + "\n" for x in reversed(head)))
    assert load_dataset(_files(tmp_path, {})).fingerprint != ds.fingerprint


def test_npy_arrays_of_entity_numbers(tmp_path: Path) -> None:
    """OGB's own arrays: integers that are the graph's labels."""
    train = ["0\tr\t1", "1\tr\t2", "2\tr\t3", "12\tr\t0"]
    (tmp_path / "train.tsv").write_text("\n".join(train) + "\n")
    (tmp_path / "valid.tsv").write_text("0\tr\t2\n3\tr\t12\n")
    neg = np.array([[1, 2, 12], [0, 0, 3]], dtype=np.int64)
    np.save(tmp_path / "h.npy", neg)
    np.save(tmp_path / "t.npy", neg[::-1].copy())
    cfg = DataConfig(
        train=str(tmp_path / "train.tsv"),
        valid=str(tmp_path / "valid.tsv"),
        candidates={"valid": {"head": str(tmp_path / "h.npy"), "tail": str(tmp_path / "t.npy")}},
    )
    ds = load_dataset(cfg)
    ids = ds.vocab.entity_index
    found = ds.candidates["valid"]
    assert found.head.tolist() == [[ids[str(x)] for x in row] for row in neg.tolist()]
    assert found.tail.tolist() == [[ids[str(x)] for x in row] for row in neg[::-1].tolist()]
    np.save(tmp_path / "t.npy", np.array([[1, 2, 99], [0, 0, 3]]))
    with pytest.raises(DataError, match=r"t\.npy.*row 1, candidate 3: '99' is not an entity"):
        load_dataset(cfg)


@pytest.mark.parametrize("labels", [["0", "1", "2", "3", "12"], ["0", "1", "2", "3", "012"]])
def test_npy_numbers_map_by_their_decimal_form(tmp_path: Path, labels: list[str]) -> None:
    """A lookup table where every label is a number's own decimal form; by the text otherwise
    ("012" is not the number 12)."""
    train = [f"{labels[i]}\tr\t{labels[(i + 1) % 5]}" for i in range(5)]
    (tmp_path / "train.tsv").write_text("\n".join(train) + "\n")
    (tmp_path / "valid.tsv").write_text(f"{labels[0]}\tr\t{labels[2]}\n")
    np.save(tmp_path / "h.npy", np.array([[3, 0, 1]], dtype=np.int32))
    np.save(tmp_path / "t.npy", np.array([[2, 12, 1]], dtype=np.int32))
    cfg = DataConfig(
        train=str(tmp_path / "train.tsv"),
        valid=str(tmp_path / "valid.tsv"),
        candidates={"valid": {"head": str(tmp_path / "h.npy"), "tail": str(tmp_path / "t.npy")}},
    )
    if labels[-1] == "012":
        with pytest.raises(DataError, match=r"t\.npy: row 1, candidate 2: '12' is not an entity"):
            load_dataset(cfg)
        return
    ds = load_dataset(cfg)
    ids = ds.vocab.entity_index
    assert ds.candidates["valid"].tail.tolist() == [[ids["2"], ids["12"], ids["1"]]]
    assert ds.candidates["valid"].head.tolist() == [[ids["3"], ids["0"], ids["1"]]]


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (["a\tb", "b\tnope", "c\td", "d\te", "e\ta"], r"head\.tsv: line 2, candidate 2: 'nope'"),
        (["a\tb", "b\tc", "c\tnope", "d\te", "e\ta"], r"line 3, candidate 2: 'nope'"),
        (["a\tb", "b\tc", "c\td", "d\te"], r"head\.tsv: 4 rows of candidates, and .*5 triples"),
        (["a\tb", "b\tc\td", "c\td", "d\te", "e\ta"], r"head\.tsv: line 2: 3 labels, .* has 2"),
        (["a\tb", "", "c\td", "d\te", "e\ta"], r"head\.tsv: line 2, candidate 1: empty"),
        (["a\tb", "b\tc", "c\td", "d\te", "e\ta", "a\tb"], r"6 rows of candidates"),
    ],
    ids=["unknown", "unknown-in-a-dropped-row", "short", "wide", "blank", "long"],
)
def test_bad_files_name_the_file_and_the_line(
    tmp_path: Path, head: list[str], message: str
) -> None:
    tail = ["b\tb", "c\tc", "d\td", "e\te", "a\ta"]
    with pytest.raises(DataError, match=message):
        load_dataset(_files(tmp_path, {"head": head, "tail": tail}))


def test_bad_bytes_and_arrays_are_clear_errors(tmp_path: Path) -> None:
    tail = ["b\tb", "c\tc", "d\td", "e\te", "a\ta"]
    cfg = _files(tmp_path, {"head": ["a\tb"] * 5, "tail": tail})
    (tmp_path / "head.tsv").write_bytes(b"a\tb\nb\tc\nc\t\xffd\nd\te\ne\ta\n")
    with pytest.raises(DataError, match=r"head\.tsv: line 3: not UTF-8 \(byte 3 of the line\)"):
        load_dataset(cfg)

    def npz(path: Path) -> None:
        with open(path, "wb") as f:  # a name would get ".npz" appended
            np.savez(f, a=np.zeros((5, 2)))

    for name, save, message in [
        ("z.npy", npz, "an .npz archive"),
        ("e.npy", lambda p: np.save(p, np.zeros((5, 0), dtype=np.int64)), "k >= 1"),
        ("f.npy", lambda p: np.save(p, np.zeros((5, 2))), "float64 array"),
    ]:
        save(tmp_path / name)
        given = {"valid": {"head": str(tmp_path / name), "tail": str(tmp_path / "tail.tsv")}}
        with pytest.raises(DataError, match=message):
            load_dataset(DataConfig(**{**cfg.model_dump(), "candidates": given}))


def test_the_unseen_entities_train_drops_are_not_candidates(tmp_path: Path) -> None:
    head = ["a\tb", "b\tc", "c\td", "d\te", "e\tx"]  # x: only in a dropped valid triple
    tail = ["b\tb", "c\tc", "d\td", "e\te", "a\ta"]
    with pytest.raises(DataError, match="line 5, candidate 2: 'x' is not an entity"):
        load_dataset(_files(tmp_path, {"head": head, "tail": tail}))


def _brute_force(
    model: KGEModel, test: torch.Tensor, known: list[torch.Tensor], fc: FileCandidates
) -> list[float]:
    """Each (query, candidate) scored on its own, in Python loops."""
    true = {tuple(x) for k in known for x in k.tolist()}
    assert not model.spec.reciprocal
    ranks: list[float] = []
    for side in ("tail", "head"):
        rows = fc.tail if side == "tail" else fc.head
        for (h, r, t), cands in zip(test.tolist(), rows.tolist(), strict=True):

            def score(e: int, h: int = h, r: int = r, t: int = t, side: str = side) -> float:
                q = [h, r, e] if side == "tail" else [e, r, t]
                return float(model.score_triples(torch.tensor([q]))[0])

            s_true = score(t if side == "tail" else h)
            counted = [
                score(e)
                for e in cands
                if not fc.filtered or ((h, r, e) if side == "tail" else (e, r, t)) not in true
            ]
            ranks.append(
                1 + sum(s > s_true for s in counted) + sum(s == s_true for s in counted) / 2
            )
    return ranks


@pytest.mark.parametrize("name", ["complex", "transe", "rotate"])
@pytest.mark.parametrize("filtered", [False, True])
def test_ranks_match_brute_force(name: str, filtered: bool) -> None:
    """With the answers themselves and known triples among the candidates."""
    model, test, known = _case(name, False, True)
    ne = model.spec.num_entities
    gen = torch.Generator().manual_seed(4)
    head = torch.randint(0, ne, (len(test), 11), generator=gen)
    tail = torch.randint(0, ne, (len(test), 11), generator=gen)
    head[:, 0], tail[:, 1] = test[:, 0], test[:, 2]  # the answer is a candidate too
    fc = FileCandidates("test", head.numpy(), tail.numpy(), filtered=filtered)
    index = FilterIndex.from_triples(known, model.spec.num_relations)
    ref = _brute_force(model, test, known, fc)
    assert any(x != int(x) for x in ref)  # ties, half ranks
    for bs in (1, 4, 1000):
        got = evaluate(model, test, index, batch_size=bs, candidates=fc)
        assert got["candidates"] == "files-11"
        assert got["mrr"] == pytest.approx(sum(1 / x for x in ref) / len(ref), abs=1e-12)
        assert got["mr"] == pytest.approx(sum(ref) / len(ref), abs=1e-12)


def test_a_run_validates_and_tests_against_the_files(tmp_path: Path) -> None:
    """results.json names the files and the unfiltered protocol; its metrics are those the
    run's model gets against the staged rows, and `evaluate` can rank all entities instead."""
    section = write_candidate_files(tmp_path, k=20)
    cfg: dict[str, Any] = {
        "run": {"root": str(tmp_path), "name": "run", "seed": 1},
        "data": {"dataset": "umls", "candidates": section},
        "model": {"name": "distmult", "dim": 16},
        "training": {"epochs": 2, "batch_size": 512, "negatives": 8},
        "evaluation": {"every": 1},
    }
    result = train(parse_config(cfg))
    assert result.results is not None
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    protocol = res["protocol"]
    assert protocol["candidates"] == "files-20"
    assert protocol["filter"] == [] and "unfiltered" in protocol["ranking"]
    assert protocol["candidate_sets"]["files"] == section["test"]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["valid_candidates"] for m in metrics] == ["files-20", "files-20"]
    staged = np.load(tmp_path / "run" / "data" / "candidates" / "test-tail.npy")
    assert staged.shape == (len(umls_lines("test")), 20)  # UMLS's test has no duplicate
    entities = umls_entities()
    with open(section["test"]["tail"]) as f:
        assert staged[0].tolist() == [entities.index(x) for x in f.readline().split()]
    again = evaluate_run(str(tmp_path / "run"))  # re-reads the files
    assert again["mrr"] == pytest.approx(res["mrr"], rel=1e-12)
    assert again["protocol"]["candidates"] == "files-20"
    full = evaluate_run(str(tmp_path / "run"), candidates="all")
    assert full["protocol"]["candidates"] == "all entities" and full["mrr"] < res["mrr"]
    # the run's staged candidates are ranked, not the files as they are now
    for side in ("head", "tail"):
        Path(section["test"][side]).unlink()
    assert evaluate_run(str(tmp_path / "run"))["mrr"] == pytest.approx(res["mrr"], rel=1e-12)


def test_the_config_refuses_mixed_protocols(tmp_path: Path) -> None:
    files = {"valid": {"head": "h.tsv", "tail": "t.tsv"}}
    base: dict[str, Any] = {"data": {"dataset": "umls", "candidates": files}}
    cases = [
        ({"evaluation": {"candidates": 5}}, "exclude each other"),
        ({"evaluation": {"sampled": 5, "every": 1}}, "exclude each other"),
        (
            {"data": {"train": "x.tsv", "split": {"valid": 0.1}, "candidates": files}},
            "data.split makes those splits",
        ),
        ({"data": {"dataset": "umls", "candidates": {}}}, "needs files for valid, test or both"),
    ]
    for sections, message in cases:
        with pytest.raises(ConfigError, match=message):
            parse_config({**base, **sections})


@pytest.mark.parametrize("unseen", ["keep", "drop"])
def test_candidate_rows_of_a_spilled_split_equal_those_staged_in_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, unseen: str
) -> None:
    """Under ``data.memory_budget`` a split's ids are spilled and deduplicated a group at a time;
    its candidate rows must follow the same kept lines as staging in memory keeps."""
    from test_spill import _graph, _spilling

    files = _graph(tmp_path)  # 300 valid lines over 90 entities
    valid = Path(files["valid"]).read_text().splitlines()
    # 20 repeated lines and 10 of an entity train lacks, spread through the file
    valid += valid[:20] + [f"new{i}\tr0\te{i}" for i in range(10)]
    valid = [valid[i] for i in np.random.default_rng(4).permutation(len(valid))]
    Path(files["valid"]).write_text("\n".join(valid) + "\n")
    labels = [f"e{i}" for i in range(90)]
    rng = np.random.default_rng(5)
    section: dict[str, Any] = {"valid": {}}
    for side in ("head", "tail"):
        path = tmp_path / f"valid-{side}.tsv"
        rows = rng.integers(0, 90, (len(valid), 7))
        path.write_text("".join("\t".join(labels[i] for i in row) + "\n" for row in rows))
        section["valid"][side] = str(path)
    plain = load_dataset(DataConfig(**files, unseen=unseen, candidates=section))
    seen: list[str] = []
    _spilling(monkeypatch, seen)
    budgeted = load_dataset(
        DataConfig(**files, unseen=unseen, candidates=section, memory_budget="16MiB")
    )
    assert "valid.tsv" in seen  # the split was spilled
    report = plain.reports["valid"]
    assert report.duplicates == 20 and report.triples == (310 if unseen == "keep" else 300)
    assert torch.equal(plain.valid, budgeted.valid)
    a, b = plain.candidates["valid"], budgeted.candidates["valid"]
    assert a.head.shape[0] == plain.valid.shape[0]
    assert np.array_equal(a.head, b.head) and np.array_equal(a.tail, b.tail)
    assert plain.fingerprint == budgeted.fingerprint


@pytest.mark.parametrize("suffix", ["tsv", "npy"])
def test_a_candidate_read_cut_off_midway_is_retried_from_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, suffix: str
) -> None:
    """A connection that breaks while a candidate file streams from an object store: the read
    starts again (nothing of the broken try kept) and gives what an unbroken read gives."""
    import contextlib
    import io
    import uuid

    import fsspec

    import kgpipe.data.candidates as candidates
    from kgpipe.retry import RetryPolicy

    labels = [str(i) for i in range(41)]  # an .npy file's numbers are labels' decimal forms
    rows = np.random.default_rng(0).integers(0, 40, (500, 6))
    root = f"memory://kgpipe-cand-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    files = {}
    for side in ("head", "tail"):
        url = f"{root}/{side}.{suffix}"
        if suffix == "npy":
            buf = io.BytesIO()
            np.save(buf, rows + (side == "tail"))
            fs.pipe(url, buf.getvalue())
        else:
            text = "".join("\t".join(labels[i] for i in row) + "\n" for row in rows)
            fs.pipe(url, text.encode())
        files[side] = url
    kwargs: dict[str, Any] = {
        "entities": candidates.entity_array(labels),
        "lines": 500,
        "kept": np.arange(0, 500, 2),
        "triples_source": "valid.tsv",
        "retry": RetryPolicy(retries=2, backoff_s=0.01),
    }
    whole = candidates.read_candidates(files, None, **kwargs)

    class Broken(io.RawIOBase):
        """Hands on 3,000 bytes of the file, then the connection resets."""

        def __init__(self, f: Any) -> None:
            self.f, self.left = f, 3_000

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            if self.left <= 0:
                raise ConnectionResetError("connection reset by peer")
            data = self.f.read(min(len(b), self.left))
            self.left -= len(data)
            b[: len(data)] = data
            return len(data)

        def readline(self, size: int = -1) -> bytes:
            return bytes(self.f.readline(size))

    real, calls = candidates.opened, {"n": 0}
    folders: list[int] = []  # temporary folders present as each read starts

    @contextlib.contextmanager
    def breaking(url: str, options: Any) -> Any:
        folders.append(len(list(tmp_path.iterdir())))
        with real(url, options) as f:
            calls["n"] += 1
            yield Broken(f) if calls["n"] == 1 else f  # the head side's first try breaks

    monkeypatch.setattr(candidates, "opened", breaking)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the downloads' folder
    again = candidates.read_candidates(files, None, **kwargs)
    assert calls["n"] == 3  # each file opened once, the broken one again
    assert np.array_equal(again.head, whole.head) and np.array_equal(again.tail, whole.tail)
    assert again.head.shape == (250, 6)
    assert again.sources == whole.sources  # the checksum of the whole file, once
    # an .npy file is downloaded to a temporary file to be mapped: none is left, the broken
    # try's included
    assert folders == ([1, 1, 1] if suffix == "npy" else [0, 0, 0])
    assert not list(tmp_path.iterdir())
