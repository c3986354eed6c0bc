"""Finished runs from the CLI: labels as people type them, checkpoints, known answers left out,
nearest neighbours."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_support import run_cli as _run
from cli_support import vocab_labels as _labels

from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import parse_config
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import KgpipeError
from kgpipe.models.model import KGEModel
from kgpipe.models.spec import ModelSpec
from kgpipe.pipeline import train
from kgpipe.runs.neighbours import nearest_entities
from kgpipe.storage import Store

NS = "http://example.org/ns#"
OTHER = "http://other.org/vocab/"


def _train(root: Path, name: str, data: dict, **sections: dict) -> Path:
    raw = {
        "run": {"root": str(root), "name": name, "seed": 0},
        "data": data,
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 3, "batch_size": 256, "lr": 0.1, "optimizer": "adagrad"},
        "evaluation": {"every": 1, "test": True},
        "checkpoint": {"background": False},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    train(parse_config(raw))
    return root / name


@pytest.fixture(scope="module")
def umls_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run on umls: 3 epochs, validated and checkpointed after each."""
    return _train(tmp_path_factory.mktemp("finished"), "umls", {"dataset": "umls"})


@pytest.fixture(scope="module")
def nt_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run on an N-Triples graph: its labels are full IRIs, and ``term1`` ends two
    relations (``ns#term1`` and ``vocab/term1``)."""
    tmp = tmp_path_factory.mktemp("nt")
    rnd = random.Random(0)
    rels = [f"{NS}term{j}" for j in range(7)] + [f"{OTHER}term1"]
    lines = sorted(
        {f"<{NS}e{rnd.randrange(30)}> <{rnd.choice(rels)}> <{NS}e{rnd.randrange(30)}> .\n"
         for _ in range(400)}
    )  # fmt: skip
    for rel in rels:  # every relation in train
        lines.append(f"<{NS}e0> <{rel}> <{NS}e1> .\n")
    (tmp / "train.nt").write_text("".join(lines[:-40] + lines[-len(rels) :]))
    (tmp / "valid.nt").write_text("".join(lines[-40 - len(rels) : -20 - len(rels)]))
    (tmp / "test.nt").write_text("".join(lines[-20 - len(rels) : -len(rels)]))
    data = {k: str(tmp / f"{k}.nt") for k in ("train", "valid", "test")}
    return _train(tmp / "runs", "nt", data, training={"epochs": 1})


# -- labels as people type them ---------------------------------------------------------------------
def test_find_label_by_suffix_prefixed_name_or_whole() -> None:
    vocab = Vocabulary(
        entities=(f"{NS}term6", f"{NS}term7", f"{OTHER}term7", "_:b1", "alice", "urn:isbn:123"),
        relations=("knows",),
    )

    def found(text: str, prefixes: dict[str, str] | None = None) -> str:
        return vocab.entities[vocab.find_entity(text, prefixes)]

    assert found("term6") == found(f"<{NS}term6>") == found(f"{NS}term6") == f"{NS}term6"
    assert found("ns:term6") == found("ns#term6") == f"{NS}term6"  # the namespace's last segment
    assert found("ex:term6", {"ex": NS}) == f"{NS}term6"
    with pytest.raises(
        KgpipeError, match=r"unknown entity 'ns:term6' \(= 'http://x\.org/ns#term6'\)"
    ):
        found("ns:term6", {"ns": "http://x.org/ns#"})  # declared: not the ns# of another IRI
    assert found("vocab:term7") == f"{OTHER}term7"
    assert found("_:b1") == "_:b1" and found("alice") == "alice" and found("123") == "urn:isbn:123"
    vocab.find_relation("knows")

    def error(text: str) -> str:
        with pytest.raises(KgpipeError) as info:
            vocab.find_entity(text)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert error("term7") == (
        f"entity 'term7' is ambiguous: 2 labels end with it, '{NS}term7' and '{OTHER}term7'; "
        "give more of the label"
    )
    assert error("term8").startswith(f"unknown entity 'term8'; did you mean '{NS}term7', ")
    assert error("alic") == "unknown entity 'alic'; did you mean 'alice'?"
    assert "--prefix ex=NAMESPACE" in error("ex:term6") and f"'{NS}term6'" in error("ex:term6")
    assert error("owl:term6").startswith(
        "unknown entity 'owl:term6' (= 'http://www.w3.org/2002/07/owl#term6'); did you mean"
    )
    # nothing close: the six labels are listed (a vocabulary of at most 12 is)
    listed = f"the graph's entities are '{NS}term6', '{NS}term7', "
    assert error("zzz").startswith(f"unknown entity 'zzz'; {listed}")
    assert error("").startswith(f"unknown entity ''; {listed}")
    assert error("zzz").endswith("'alice' and 'urn:isbn:123'")


def test_predict_takes_iri_suffixes_and_prefixed_names(
    nt_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def tails(*extra: str) -> list[str]:
        code, out, err = _run(["predict", str(nt_run), "--json", "--top", "3", *extra], capsys)
        assert code == 0, err
        return [r["tail"] for r in json.loads(out)]

    whole = tails("--head", f"<{NS}e0>", "--relation", f"{NS}term6")
    assert len(whole) == 3 and all(t.startswith(NS) for t in whole)
    assert tails("--head", "e0", "--relation", "term6") == whole
    assert tails("--head", "ns:e0", "--relation", "ns:term6") == whole
    assert tails("--head", "e0", "--relation", "ex:term6", "--prefix", f"ex={NS}") == whole

    code, _, err = _run(["predict", str(nt_run), "--head", "e0", "--relation", "term1"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "ambiguous" in err and f"{NS}term1" in err and f"{OTHER}term1" in err
    code, _, err = _run(["predict", str(nt_run), "--head", "e0", "--relation", "term9"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "unknown relation 'term9'; did you mean" in err and f"{NS}term" in err
    code, _, err = _run(["neighbours", str(nt_run), "--entity", "e0", "--json"], capsys)
    assert code == 0, err


def test_labels_that_look_like_rich_markup_are_printed_as_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A label is text: "x[/y]" (rich's closing tag) gave a MarkupError traceback, and
    "Queen [band]" printed as "Queen"."""
    rnd = random.Random(0)
    names = ["x[/y]", "Queen [band]", "[bold]loud", *(f"e{i}" for i in range(20))]
    lines = {f"{rnd.choice(names)}\tr [2]\t{rnd.choice(names)}\n" for _ in range(200)}
    lines |= {f"{n}\tr [2]\te0\n" for n in names}  # every label in train
    (tmp_path / "train.tsv").write_text("".join(sorted(lines)))
    run = _train(tmp_path / "runs", "markup", {"train": str(tmp_path / "train.tsv")},
                 evaluation={"every": 0, "test": False})  # fmt: skip
    for argv in (["neighbours", str(run), "--entity", "x[/y]", "--top", "30"],
                 ["predict", str(run), "--head", "Queen [band]", "--relation", "r [2]",
                  "--top", "30"]):  # fmt: skip
        code, out, err = _run(argv, capsys)
        shown = out  # the table is on stdout (a result: `> file`, `| grep`)
        assert code == 0 and "Traceback" not in err, err
        assert "x[/y]" in shown and "Queen [band]" in shown and "[bold]loud" in shown, shown


def test_predict_filter_known_leaves_out_the_graphs_answers(
    umls_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kgpipe.runs.read import known_triples

    ents, rels = _labels(umls_run, "entities"), _labels(umls_run, "relations")
    known = torch.cat(known_triples(Store(str(umls_run))))
    h, r = (int(x) for x in known[0, :2])
    answers = {ents[int(t)] for t in known[(known[:, 0] == h) & (known[:, 1] == r), 2]}
    base = ["predict", str(umls_run), "--head", ents[h], "--relation", rels[r], "--json"]
    code, out, err = _run([*base, "--top", "135"], capsys)
    assert code == 0, err
    assert answers <= {row["tail"] for row in json.loads(out)}
    code, out, err = _run([*base, "--top", "135", "--filter-known"], capsys)
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 135 - len(answers) and not answers & {row["tail"] for row in rows}
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))


def test_evaluate_ranks_the_triples_the_run_staged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the files at the configured paths now: relative paths (resolved in the working
    directory) made evaluate fail elsewhere ("file not found") and, from a folder with other
    files under those names, silently rank other triples."""
    rnd = random.Random(0)
    lines = sorted({f"e{rnd.randrange(40)}\tr{rnd.randrange(3)}\te{rnd.randrange(40)}\n"
                    for _ in range(600)})  # fmt: skip
    graph = tmp_path / "graph"
    (graph / "g").mkdir(parents=True)
    for name, part in (("train", lines[:-80]), ("valid", lines[-80:-40]), ("test", lines[-40:])):
        (graph / "g" / f"{name}.tsv").write_text("".join(part))
    monkeypatch.chdir(graph)
    data = {k: f"g/{k}.tsv" for k in ("train", "valid", "test")}
    run = _train(tmp_path / "runs", "rel", data)
    trained = json.loads((run / "results.json").read_text())
    (graph / "g" / "test.tsv").write_text("".join(lines[-40:-30]))  # another test split here
    for where in (graph, tmp_path):  # and nothing under those names here
        monkeypatch.chdir(where)
        code, out, err = _run(["evaluate", str(run), "--json"], capsys)
        assert code == 0, err
        got = json.loads(out)
        assert got["triples"] == trained["triples"] == 40
        assert got["mrr"] == pytest.approx(trained["mrr"], abs=1e-12)


# -- checkpoints --------------------------------------------------------------------------------------
def test_evaluate_and_export_a_checkpoint(
    umls_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = CheckpointStore(Store(str(umls_run)))
    committed = {c.epoch: c for c in checkpoints.committed()}
    assert sorted(committed) == [1, 2, 3]
    best = checkpoints.best()
    assert best is not None
    final = json.loads((umls_run / "results.json").read_text())
    for which, epoch in (("latest", 3), ("best", best.epoch), ("1", 1)):
        code, out, err = _run(
            ["evaluate", str(umls_run), "--json", "--checkpoint", which, "--split", "valid"],
            capsys,
        )
        assert code == 0, err
        got = json.loads(out)
        assert got["checkpoint_epoch"] == epoch
        assert got["mrr"] == pytest.approx(committed[epoch].valid_mrr, abs=1e-9)
    code, out, err = _run(["evaluate", str(umls_run), "--json", "--checkpoint", "latest"], capsys)
    assert json.loads(out)["mrr"] == pytest.approx(final["mrr"], abs=1e-12)  # final = latest

    out_dir = tmp_path / "ep1"
    argv = ["export", str(umls_run), "--checkpoint", "1", "--format", "npy", "--out", str(out_dir)]
    code, _, err = _run(argv, capsys)
    assert code == 0, err
    table = checkpoints.load(committed[1]).tables["entity"].numpy()
    assert np.array_equal(np.load(out_dir / "entities.npy"), table)

    for cmd in (["evaluate"], ["export", "--out", str(tmp_path / "x")]):
        code, _, err = _run([cmd[0], str(umls_run), *cmd[1:], "--checkpoint", "7"], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "no committed checkpoint of epoch 7; committed epochs: 1, 2, 3" in err
    assert not (tmp_path / "x").exists()


def test_best_needs_a_validated_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _train(
        tmp_path, "unvalidated", {"dataset": "umls"},
        training={"epochs": 1, "max_steps_per_epoch": 1},
        evaluation={"every": 0, "test": False},
    )  # fmt: skip
    code, _, err = _run(["evaluate", str(run), "--checkpoint", "best"], capsys)
    assert code == 2 and "no committed checkpoint has a validation MRR" in err, err
    assert "committed epochs: 1" in err and len(err.strip().splitlines()) == 1


# -- neighbours ---------------------------------------------------------------------------------------
def _model(name: str, p: int = 2) -> KGEModel:
    spec = ModelSpec(name=name, dim=6, num_entities=11, num_relations=2, p=p, margin=1.0)
    model = KGEModel(spec)
    gen = torch.Generator().manual_seed(len(name) + p)
    model.entity.data.normal_(generator=gen)
    return model


@pytest.mark.parametrize(
    "name,p,measure",
    [
        ("transe", 1, "L1 distance"),
        ("transe", 2, "L2 distance"),
        ("rotate", 2, "modulus distance"),
        ("distmult", 2, "dot"),
        ("complex", 2, "dot"),
    ],
)
def test_nearest_entities_match_a_brute_force(name: str, p: int, measure: str) -> None:
    model = _model(name, p)
    e = model.entity.data
    complex_rows = torch.complex(*e.chunk(2, dim=1))
    brute = {
        "cosine": torch.nn.functional.cosine_similarity(e[4:5], e),
        "L1 distance": -(e - e[4]).abs().sum(1),
        "L2 distance": -(e - e[4]).norm(dim=1),
        "modulus distance": -(complex_rows - complex_rows[4]).abs().sum(1),
        "dot": e @ e[4],
    }
    for metric, key in (("cosine", "cosine"), ("model", measure)):
        found = nearest_entities(model, 4, 5, measure=metric, block_rows=3)
        assert found.measure == key
        expected = brute[key].clone()
        expected[4] = float("-inf")
        top = torch.topk(expected, 5)
        assert found.ids == top.indices.tolist()
        sign = 1 if found.higher_is_nearer else -1
        assert found.values == pytest.approx((sign * top.values).tolist(), rel=1e-5)
    assert nearest_entities(model, 0, 50).ids == nearest_entities(model, 0, 10).ids  # all others


def test_neighbours_cli(umls_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ents = _labels(umls_run, "entities")
    code, out, err = _run(
        ["neighbours", str(umls_run), "--entity", ents[5], "--top", "4", "--json"], capsys
    )
    assert code == 0, err
    rows = json.loads(out)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4] and ents[5] not in {r["entity"] for r in rows}
    values = [r["cosine"] for r in rows]
    assert values == sorted(values, reverse=True)
    code, out, err = _run(
        ["neighbours", str(umls_run), "--entity", ents[5], "--metric", "model", "--json"], capsys
    )
    assert code == 0 and len(json.loads(out)) == 10 and "dot" in json.loads(out)[0], err
    code, out, err = _run(["neighbours", str(umls_run), "--entity", ents[5]], capsys)
    assert code == 0 and f"neighbours of {ents[5]}" in out and "cosine: higher" in out, err


def test_predict_and_neighbours_read_a_committed_checkpoint(
    umls_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An interrupted run has no model file: predict and neighbours could not read it (only
    evaluate and export took --checkpoint); they take it now, and the message says so."""
    import shutil

    ents, rels = _labels(umls_run, "entities"), _labels(umls_run, "relations")
    query = ["--head", ents[3], "--relation", rels[1], "--top", "5", "--json"]
    code, final, err = _run(["predict", str(umls_run), *query], capsys)
    assert code == 0, err
    stopped = tmp_path / "stopped"
    shutil.copytree(umls_run, stopped)
    (stopped / "model.safetensors").unlink()
    code, _, err = _run(["predict", str(stopped), *query], capsys)
    assert code == 2 and "--checkpoint latest" in err, err
    code, latest, err = _run(["predict", str(stopped), *query, "--checkpoint", "latest"], capsys)
    assert code == 0, err
    got, want = json.loads(latest), json.loads(final)  # the last epoch's model (read mapped:
    assert [g["tail"] for g in got] == [w["tail"] for w in want]  # its product may round
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], rel=1e-6)
    code, out, err = _run(["neighbours", str(stopped), "--entity", ents[3], "--json",
                           "--checkpoint", "3"], capsys)  # fmt: skip
    assert code == 0 and len(json.loads(out)) == 10, err


def test_predict_warns_for_an_entity_no_training_triple_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under data.unseen: keep (the default) an entity only in test is in the vocabulary, and
    predict answered for it from its never-trained initial row, without a word."""
    rnd = random.Random(1)
    lines = sorted({f"e{rnd.randrange(40)}\tr{rnd.randrange(3)}\te{rnd.randrange(40)}\n"
                    for _ in range(600)})  # fmt: skip
    graph = tmp_path / "graph"
    graph.mkdir()
    (graph / "train.tsv").write_text("".join(lines[:-40]))
    (graph / "valid.tsv").write_text("".join(lines[-40:-20]))
    (graph / "test.tsv").write_text("".join(lines[-20:]) + "only_in_test\tr1\te1\n")
    run = _train(tmp_path / "runs", "unseen", {k: str(graph / f"{k}.tsv") for k in
                                                 ("train", "valid", "test")})  # fmt: skip
    base = ["predict", str(run), "--relation", "r1", "--json"]
    code, out, err = _run([*base, "--head", "only_in_test"], capsys)
    assert code == 0 and json.loads(out), err
    assert "warning" in err and "'only_in_test' is in none of the run's training" in err, err
    code, out, err = _run([*base, "--head", "e1"], capsys)
    assert code == 0 and "warning" not in err, err
