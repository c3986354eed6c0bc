"""A sharded run's model file, written from its shards a block at a time, and models read as
memory maps: the driver never assembles the whole entity table, and every number stays what
the whole table in memory gives."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import kgpipe.checkpoint
import kgpipe.model_file
from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import parse_config
from kgpipe.errors import RunError
from kgpipe.evaluation import FilterIndex, evaluate
from kgpipe.export import load_model, save_model
from kgpipe.model_file import map_checkpoint, map_model, map_stored
from kgpipe.models.model import KGEModel
from kgpipe.models.spec import ModelSpec
from kgpipe.pipeline import train
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.read import evaluate_run, known_triples, load_run
from kgpipe.storage import Store


def _config(tmp_path: Path, name: str, **extra: Any) -> Any:
    return parse_config(
        {
            "run": {"seed": 3, "root": str(tmp_path), "name": name},
            "data": {"dataset": "umls"},
            "model": {"name": "complex", "dim": 16},
            "training": {"epochs": 2, "batch_size": 512, "negatives": 32, "chunk_size": 64},
            "checkpoint": {"keep_last": 5},
            **extra,
        }
    )


def _mapped_file(t: torch.Tensor) -> str | None:
    """The file whose memory map holds ``t``'s data (from ``/proc/self/maps``), if any."""
    address = t.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= address < hi:
            return rest[4].strip() if len(rest) == 5 else None
    return None


def _no_whole_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way this process could assemble the whole entity table fail."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the driver assembled the whole entity table")

    monkeypatch.setattr(kgpipe.checkpoint, "assemble_shards", refuse)
    monkeypatch.setattr(CheckpointStore, "load", refuse)
    monkeypatch.setattr(CheckpointStore, "load_tables", refuse)
    monkeypatch.setattr(RunFolder, "new_model", refuse)


def test_a_sharded_run_finishes_from_its_shards_and_tests_as_the_whole_table_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model file is written from the shards, block by block (blocks smaller than the
    table here), and tested through a memory map; the file equals the assembled checkpoint to
    the bit and the test metrics equal those of the whole model in memory, exactly."""
    monkeypatch.setattr(kgpipe.model_file, "BLOCK_BYTES", 16 * 4 * 10)  # 10 rows a block
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 3}
    with monkeypatch.context() as patched:
        _no_whole_table(patched)
        train(_config(tmp_path, "run", distributed=gang))
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    store = Store(str(run))
    checkpoints = CheckpointStore(store)
    latest = checkpoints.committed()[-1]
    whole = checkpoints.load_tables(latest).tables
    written = load_file(run / "model.safetensors")
    for key in ("entity", "relation"):
        assert torch.equal(written[key], whole[key]), key
    model = load_model(store)  # the whole table in memory
    index = FilterIndex.from_triples(known_triples(store), model.spec.num_relations)
    test = known_triples(store)[2]
    want = evaluate(model, test, index)
    for key in ("mrr", "mr", "hits@1", "hits@10"):
        assert results[key] == want[key], key
    assert results["head"] == want["head"] and results["tail"] == want["tail"]

    with (
        monkeypatch.context() as patched
    ):  # read back, neither from the final file nor a checkpoint
        _no_whole_table(patched)
        again = evaluate_run(str(run))
        from_checkpoint = evaluate_run(str(run), checkpoint="latest")
        loaded = load_run(str(run))
    assert again["mrr"] == results["mrr"]
    assert from_checkpoint["mrr"] == results["mrr"]
    assert from_checkpoint["checkpoint_epoch"] == latest.epoch
    assert _mapped_file(loaded.model.entity) == str(run / "model.safetensors")
    assert torch.equal(loaded.model.entity.data, whole["entity"])


def test_a_checkpoint_maps_as_a_model_file_for_any_block_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of one row, of a few rows and of the whole table write the same tables."""
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 4}
    train(_config(tmp_path, "run", distributed=gang, evaluation={"test": False}))
    checkpoints = CheckpointStore(Store(str(tmp_path / "run")))
    first = checkpoints.committed()[0]
    whole = checkpoints.load_tables(first).tables
    spec = load_model(Store(str(tmp_path / "run"))).spec
    for rows in (1, 7, 10_000):
        monkeypatch.setattr(kgpipe.model_file, "BLOCK_BYTES", rows * spec.dim * 4)
        model = map_checkpoint(checkpoints, first, spec)
        assert torch.equal(model.entity.data, whole["entity"]), rows
        assert torch.equal(model.relation.data, whole["relation"]), rows


def test_a_mapped_model_scores_as_the_loaded_one_and_never_writes_its_file(
    tmp_path: Path,
) -> None:
    spec = ModelSpec(name="transe", dim=8, num_entities=50, num_relations=4, p=1)
    model = KGEModel(spec)
    torch.manual_seed(0)
    with torch.no_grad():
        model.entity.normal_()
        model.relation.normal_()
    store = Store(str(tmp_path))
    save_model(model, store)
    before = (tmp_path / "model.safetensors").read_bytes()
    mapped = map_model(str(tmp_path / "model.safetensors"))
    h, r = torch.arange(4), torch.tensor([0, 1, 2, 3])
    assert torch.equal(mapped.score_all_tails(h, r), model.score_all_tails(h, r))
    with torch.no_grad():
        mapped.entity[0] = 0.0  # copy-on-write: this process's copy only
    assert (tmp_path / "model.safetensors").read_bytes() == before
    remote = Store("memory://kgpipe-test-map-model/run")  # not a local disk: mapped from a download
    save_model(model, remote)
    again = map_stored(remote)
    assert _mapped_file(again.entity) is not None  # the download's name is gone, its map is not
    assert torch.equal(again.entity, model.entity) and torch.equal(again.relation, model.relation)


@pytest.mark.parametrize("damage", ["truncated", "foreign", "header"])
def test_an_unreadable_model_file_is_named_in_one_line(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "model.safetensors"
    spec = ModelSpec(name="distmult", dim=4, num_entities=30, num_relations=2)
    save_model(KGEModel(spec), Store(str(tmp_path)))
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) - 200])
    elif damage == "foreign":
        save_file({"x": torch.zeros(3)}, str(path))
    else:
        path.write_bytes(struct.pack("<Q", 10**9) + data[8:])
    with pytest.raises(RunError, match=r"model\.safetensors: not a readable kgpipe model file"):
        map_model(str(path))


@pytest.mark.parametrize("damage", ["one row", "wrong shape", "unknown spec key"])
def test_a_model_file_whose_tables_do_not_fit_its_spec_is_refused(
    tmp_path: Path, damage: str
) -> None:
    """load_model copied the tables into the spec's: a (1, dim) entity table was broadcast to
    every row (every score the same), others were tracebacks."""
    spec = ModelSpec(name="distmult", dim=4, num_entities=5, num_relations=2)
    meta = {"kgpipe_model": spec.to_json()}
    tables = {"entity": torch.ones(5, 4), "relation": torch.ones(2, 4)}
    if damage == "one row":
        tables["entity"] = torch.ones(1, 4)
    elif damage == "wrong shape":
        tables["entity"] = torch.ones(3, 4)
    else:
        meta = {"kgpipe_model": json.dumps({**json.loads(spec.to_json()), "new": 1})}
    save_file(tables, str(tmp_path / "model.safetensors"), metadata=meta)
    with pytest.raises(RunError, match=r"model\.safetensors: (its tables do not fit|not a read)"):
        load_model(Store(str(tmp_path)))


def test_shards_that_do_not_make_the_model_are_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """A row held twice and another missing, rows of the wrong width, a relation table of the
    wrong shape: one :class:`CheckpointError` each, naming what does not fit."""
    from safetensors import safe_open

    from kgpipe.errors import CheckpointError
    from kgpipe.model_file import _blocks, _check_parts

    spec = ModelSpec(name="distmult", dim=3, num_entities=6, num_relations=2, reciprocal=False)
    rows = torch.arange(18, dtype=torch.float32).view(6, 3)
    twice = [(torch.tensor([0, 1, 2]), rows[:3]), (torch.tensor([2, 4, 5]), rows[3:])]
    with pytest.raises(CheckpointError, match=r"do not hold entities 0\.\.5 once each"):
        list(_blocks(twice, 6, 3, "ckpt"))
    whole = [(torch.tensor([0, 2, 4]), rows[:3]), (torch.tensor([1, 3, 5]), rows[3:])]
    blocks = list(_blocks(whole, 6, 3, "ckpt"))
    assert torch.equal(torch.cat(blocks), rows[[0, 3, 1, 4, 2, 5]])
    save_file(
        {"a": torch.zeros(3, 3), "b": torch.zeros(3, 4), "c": torch.zeros(3, 3).double()},
        str(tmp_path / "f.safetensors"),
    )
    relation = torch.zeros(2, 3)
    with safe_open(str(tmp_path / "f.safetensors"), framework="pt") as f:
        ids = torch.tensor([0, 1, 2])
        good = [(ids, f.get_slice("a")), (torch.tensor([3, 4, 5]), f.get_slice("a"))]
        _check_parts(spec, good, relation, "ckpt")
        for bad in ("b", "c"):
            with pytest.raises(CheckpointError, match="a shard's entity rows"):
                _check_parts(spec, [(ids, f.get_slice(bad)), good[1]], relation, "ckpt")
        with pytest.raises(CheckpointError, match="its relation table"):
            _check_parts(spec, good, torch.zeros(4, 3), "ckpt")
        with pytest.raises(CheckpointError, match="the shards hold 3 entity rows"):
            _check_parts(spec, good[:1], relation, "ckpt")


def test_an_embedding_table_past_2_31_floats_is_written_in_chunks_of_one_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A list column's offsets are int32: at 2**31 floats (11.6M entities at dim 200) they
    wrapped to negative values and the export failed after training. The column is written in
    chunks instead, here at 7 floats a chunk: the same table and type as in one piece."""
    import io

    import numpy as np
    import pyarrow.parquet as pq

    import kgpipe.export as export

    emb = np.arange(30, dtype=np.float32).reshape(10, 3)
    labels = [f"e{i}" for i in range(10)]
    whole = pq.ParquetFile(io.BytesIO(export.table_parquet(np.arange(10), labels, emb, {}))).read()
    monkeypatch.setattr(export, "_LIST_VALUES_MAX", 7)  # 2 rows a chunk
    data = export.table_parquet(np.arange(10), labels, emb, {})
    chunked = pq.ParquetFile(io.BytesIO(data)).read()
    assert chunked.equals(whole) and chunked.schema == whole.schema
    assert chunked.column("embedding").to_pylist() == emb.tolist()
    empty = export.table_parquet(np.arange(0), [], emb[:0], {})
    assert pq.ParquetFile(io.BytesIO(empty)).read().num_rows == 0


def test_an_export_replaces_an_earlier_export_and_nothing_of_the_users(tmp_path: Path) -> None:
    """An export removes what an earlier export of another format or layout left (read with
    the new one, it gave stale rows), and only that: in a folder without an export, or next
    to one, the user's own files of the same names stay."""
    from kgpipe.data.vocab import Vocabulary
    from kgpipe.export import export_embeddings

    spec = ModelSpec(name="distmult", dim=4, num_entities=3, num_relations=1)
    model, vocab = KGEModel(spec), Vocabulary(entities=("a", "b", "c"), relations=("r",))
    mine = tmp_path / "mine"
    (mine / "entities").mkdir(parents=True)
    (mine / "entities.tsv").write_text("the user's own\n")
    (mine / "entities" / "notes.txt").write_text("the user's own\n")
    (mine / "model.json").write_text('{"name": "the user\'s own"}')
    export_embeddings(model, vocab, str(mine), fmt="parquet")  # no earlier export: all stay
    assert (mine / "entities.tsv").read_text() == "the user's own\n"
    export_embeddings(model, vocab, str(mine), fmt="npy")
    (mine / "entities" / "part-000003.parquet").write_bytes(b"an earlier sharded export's")
    export_embeddings(model, vocab, str(mine), fmt="parquet")
    assert not (mine / "entities.npy").exists() and not (mine / "entities.tsv").exists()
    assert not (mine / "entities" / "part-000003.parquet").exists()
    assert (mine / "entities" / "notes.txt").read_text() == "the user's own\n"
    assert (mine / "entities.parquet").exists() and (mine / "model.json").exists()


def test_inverse_relation_rows_are_marked_where_labels_collide(tmp_path: Path) -> None:
    """A graph with relations ``x`` and ``x^-1``: a reciprocal export has two rows labelled
    ``x^-1``; the ``inverse`` column says which is the learned inverse of ``x``."""
    import pyarrow.parquet as pq

    from kgpipe.data.vocab import Vocabulary
    from kgpipe.export import export_embeddings

    spec = ModelSpec(name="distmult", dim=4, num_entities=2, num_relations=2, reciprocal=True)
    vocab = Vocabulary(entities=("a", "b"), relations=("x", "x^-1"))
    export_embeddings(KGEModel(spec), vocab, str(tmp_path), fmt="parquet")
    rel = pq.read_table(tmp_path / "relations.parquet").to_pydict()
    assert rel["label"] == ["x", "x^-1", "x^-1", "x^-1^-1"]
    assert rel["inverse"] == [False, False, True, True]
    assert "inverse" not in pq.read_table(tmp_path / "entities.parquet").column_names
