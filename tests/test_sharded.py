"""The sharded strategy: entity rows and their optimiser state split over a gang's ranks.

Training is checked against one process (the same global batch and seed), the shard files
against the whole table, and a sharded checkpoint against resumes on other world sizes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from candidate_files import write_candidate_files
from cli_support import run_cli, vocab_labels
from safetensors.torch import load_file

from kgpipe.checkpoint import CheckpointStore
from kgpipe.config import ModelConfig, RunConfig, parse_config
from kgpipe.distributed.sharded import LocalIndex, ShardMap, owned_positions
from kgpipe.errors import CheckpointError, ConfigError, KgpipeError
from kgpipe.export import load_model
from kgpipe.models.model import KGEModel
from kgpipe.pipeline import train
from kgpipe.runs.read import evaluate_run
from kgpipe.sharded_tensors import assemble_shards, local_rows, shard_key, split_shards
from kgpipe.storage import Store

BASE: dict[str, Any] = {
    "run": {"seed": 5},
    "data": {"dataset": "umls"},
    "evaluation": {"test": False},
}
TRAINING: dict[str, Any] = {
    "epochs": 2,
    "batch_size": 512,
    "negatives": 32,
    "chunk_size": 64,
    "lr": 0.01,
}


def _config(tmp_path: Path, name: str, **sections: Any) -> RunConfig:
    data = {**BASE, **sections, "run": {**BASE["run"], "root": str(tmp_path), "name": name}}
    return parse_config(data)


def _model(tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(tmp_path / name / "model.safetensors")


def _metrics(tmp_path: Path, name: str) -> list[dict]:
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


# -- the parts ---------------------------------------------------------------------------------
def test_shards_are_balanced_seeded_and_independent_of_the_world_size() -> None:
    a = ShardMap.build(1001, shards=8, world_size=2, seed=1)
    b = ShardMap.build(1001, shards=8, world_size=3, seed=1)
    assert torch.equal(a.shard_of, b.shard_of)  # the same shards on any world size
    sizes = torch.bincount(a.shard_of.long(), minlength=8)
    assert int(sizes.max() - sizes.min()) <= 1
    assert not torch.equal(
        a.shard_of, ShardMap.build(1001, shards=8, world_size=2, seed=2).shard_of
    )
    # not a graph cut or a range: neighbouring ids land in different shards
    assert len(set(a.shard_of[:16].tolist())) > 4
    owned = [b.owned(r) for r in range(3)]
    assert torch.equal(torch.sort(torch.cat(owned)).values, torch.arange(1001))
    for r, ids in enumerate(owned):
        assert bool((b.owner(ids) == r).all())
        # the local table: its shards one after the other, each a block of ascending ids
        shard = b.shard_of[ids]
        assert bool((shard[1:] >= shard[:-1]).all())
        mask, pos = LocalIndex(ids).locate(torch.tensor([int(ids[7]), int(ids[3]), 5000]))
        assert mask.tolist() == [True, True, False] and pos[:2].tolist() == [7, 3]
    mask, pos = owned_positions(torch.tensor([2, 5, 9]), torch.tensor([9, 4]))
    assert mask.tolist() == [True, False] and int(pos[0]) == 2


@pytest.mark.parametrize("init", ["normal", "uniform", "xavier"])
def test_a_model_holding_some_rows_is_initialised_as_the_whole_table(init: str) -> None:
    cfg = ModelConfig(name="rotate", dim=8, init=init)  # type: ignore[arg-type]
    whole = KGEModel.build(cfg, num_entities=140_001, num_relations=5, seed=9)
    rows = ShardMap.build(140_001, shards=4, world_size=2, seed=9).owned(1)
    part = KGEModel.build(cfg, num_entities=140_001, num_relations=5, seed=9, rows=rows)
    assert torch.equal(part.entity.data, whole.entity.data[rows])
    assert torch.equal(part.relation.data, whole.relation.data)
    with pytest.raises(RuntimeError, match="shard set"):
        part.score_triples(torch.tensor([[0, 0, 1]]))


@pytest.mark.parametrize("rows", [65_537, 131_073, 140_001])
def test_the_block_wise_draw_is_one_draw_of_the_whole_table(rows: int) -> None:
    """Blocks of 65,536 rows draw what one call on the table draws (a last block of fewer than
    16 values, which torch draws another way, joins the block before it)."""
    cfg = ModelConfig(name="transe", dim=8, init="normal", init_scale=0.5)
    model = KGEModel.build(cfg, num_entities=rows, num_relations=3, seed=4)
    gen = torch.Generator().manual_seed(4)
    entity = torch.empty(rows, 8).normal_(0.0, 0.5, generator=gen)
    relation = torch.empty(3, 8).normal_(0.0, 0.5, generator=gen)
    assert torch.equal(model.entity.data, entity)
    assert torch.equal(model.relation.data, relation)


def test_shard_tensors_round_trip_to_the_whole_table_and_to_any_world_size() -> None:
    n, d = 50, 3
    table, slot = torch.randn(n, d), torch.rand(n, d)
    m2 = ShardMap.build(n, shards=6, world_size=2, seed=0)
    tensors: dict[str, torch.Tensor] = {}
    for r in range(2):
        own = m2.owned(r)
        local = {"table.entity": table[own], "optim.entity.sum": slot[own]}
        tensors.update(split_shards(own, m2.shard_of[own], m2.shards_of(r), local))
    whole = assemble_shards(tensors)
    assert torch.equal(whole["table.entity"], table) and torch.equal(
        whole["optim.entity.sum"], slot
    )
    m3 = m2.with_world(3)
    for r in range(3):
        own = m3.owned(r)
        mine = {k: v for k, v in tensors.items() if int(k.split(".")[1]) in m3.shards_of(r)}
        got = local_rows(mine, own)
        assert torch.equal(got["table.entity"], table[own])
        assert torch.equal(got["optim.entity.sum"], slot[own])


def test_the_config_refuses_what_the_sharded_strategy_cannot_do(tmp_path: Path) -> None:
    sharded = {"workers": 2, "strategy": "sharded"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"distributed": {**sharded, "sync": "epoch"}}, "sync=step only"),
        ({"distributed": {**sharded, "compression": "int8"}}, "does not compress"),
        ({"distributed": {**sharded, "entity_shards": 1}}, "at least distributed.workers"),
        ({"distributed": sharded, "training": {"mode": "1vsAll", "loss": "cross_entropy"}},
         "negative_sampling"),
    ]  # fmt: skip
    for sections, message in cases:
        with pytest.raises(ConfigError, match=message):
            _config(tmp_path, "x", **sections)


# -- training on a gang --------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["transe", "complex"])
def test_sharded_step_sync_equals_single_process(tmp_path: Path, model: str) -> None:
    """2 ranks, each holding half the entity rows and their Adam state, end where one process
    ends (the same global batch and seed), and exchange less than the replicated strategy's
    dense all-reduce would."""
    sections = {
        "model": {"name": model, "dim": 32, "init": "uniform", "init_scale": 0.1},
        "training": {**TRAINING, "loss": "margin", "clip_grad_norm": 1.0},
    }
    train(_config(tmp_path, "single", **sections))
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 5}
    train(_config(tmp_path, "sharded", **sections, distributed=gang))
    single, sharded = _model(tmp_path, "single"), _model(tmp_path, "sharded")
    for key in ("entity", "relation"):
        diff = (single[key] - sharded[key]).abs().max().item()
        assert diff <= 1e-5, (key, diff)
    init = KGEModel.build(
        _config(tmp_path, "i", **sections).model, num_entities=135, num_relations=46, seed=5
    )
    assert (init.entity.data - sharded["entity"]).abs().max() > 1e-3  # training moved them
    metrics = _metrics(tmp_path, "sharded")
    assert [m["world_size"] for m in metrics] == [2, 2]
    assert all(m["bytes_sent"] > 0 for m in metrics)
    manifest = json.loads(
        (tmp_path / "sharded" / "checkpoints" / "epoch-000002" / "manifest.json").read_text()
    )
    assert manifest["strategy"] == "sharded" and manifest["entity_shards"] == 5
    assert len(manifest["files"]) == 2  # one file per rank, saying what it holds
    held = sorted((f["shards"], f["replicated"]) for f in manifest["files"].values())
    assert held == [([0, 2, 4], True), ([1, 3], False)]


@pytest.mark.parametrize(
    ("sampled", "candidates"),
    [(None, None), (40, None), (None, 30), (None, "files")],
    ids=["all", "sampled", "ogb", "files"],
)
def test_sharded_validation_equals_single_process(
    tmp_path: Path, sampled: int | None, candidates: int | str | None
) -> None:
    """Each rank ranks the queries against its own rows (all of them, those in the sample, or
    the per-query candidates it owns, drawn or read from files); the counts sum to the
    single-process ranks (updates below float32's resolution keep both models as initialised)."""
    sections: dict[str, Any] = {
        "model": {"name": "complex", "dim": 32, "init": "uniform", "init_scale": 0.1},
        "training": {**TRAINING, "lr": 1e-30},
        "evaluation": {"test": False, "every": 1, "sampled": sampled, "candidates": candidates},
    }
    if candidates == "files":
        sections["data"] = {"dataset": "umls", "candidates": write_candidate_files(tmp_path, 30)}
        sections["evaluation"]["candidates"] = None
    train(_config(tmp_path, "single", **sections))
    train(
        _config(tmp_path, "sharded", **sections, distributed={"workers": 2, "strategy": "sharded"})
    )
    one, two = _metrics(tmp_path, "single"), _metrics(tmp_path, "sharded")
    want = f"sampled-{sampled}" if sampled else f"per-query-{candidates}" if candidates else "all"
    want = "files-30" if candidates == "files" else want
    assert [r["valid_candidates"] for r in two] == [want] * len(one)
    assert [r["valid_candidates"] for r in one] == [want] * len(one)
    for key in ("valid_mrr", "valid_mr", "valid_hits@10"):
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], rel=1e-9), key


@pytest.mark.parametrize("candidates", [None, 30, "files"], ids=["all", "ogb", "files"])
def test_the_gang_ranks_the_test_split_as_one_process_does(
    tmp_path: Path, candidates: int | str | None
) -> None:
    """A sharded run's test split is ranked by its gang, each rank against its own rows of the
    chosen checkpoint (under early stopping the best validated one); the metrics are those
    of one process ranking the run's model file, and results.json says who ranked them."""
    sections: dict[str, Any] = {
        "model": {"name": "complex", "dim": 16, "init": "uniform", "init_scale": 0.1},
        "training": {**TRAINING, "epochs": 3},
        "evaluation": {"test": True, "every": 1, "patience": 5, "candidates": candidates},
    }
    if candidates == "files":
        sections["data"] = {"dataset": "umls", "candidates": write_candidate_files(tmp_path, 30)}
        sections["evaluation"]["candidates"] = None
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 5}
    result = train(_config(tmp_path, "run", **sections, distributed=gang))
    assert result.results is not None
    test = result.results
    assert (test["ranked_by"], test["ranks"]) == ("gang", 2)
    assert test == json.loads((tmp_path / "run" / "results.json").read_text())
    valid = [m["valid_mrr"] for m in _metrics(tmp_path, "run")]
    assert test["training"]["model_epoch"] == 1 + valid.index(max(valid))
    one = evaluate_run(str(tmp_path / "run"))  # the model file, ranked in this process
    want = f"per-query-{candidates}" if candidates else "all entities"
    want = "files-30" if candidates == "files" else want
    assert test["protocol"]["candidates"] == one["protocol"]["candidates"] == want
    assert test["triples"] == one["triples"] > 0
    for key in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
        assert test[key] == pytest.approx(one[key], rel=1e-9), key
        assert test["head"][key] == pytest.approx(one["head"][key], rel=1e-9), key
    # metrics of another checkpoint are not this model's: the run's end ranks the split itself
    from kgpipe.runs.finish import finish_run
    from kgpipe.runs.folder import RunFolder
    from kgpipe.runs.read import open_run

    _, cfg = open_run(str(tmp_path / "run"))
    history = _metrics(tmp_path, "run")
    other = finish_run(RunFolder.read(cfg), history=history, tested={**test, "model_epoch": 99})
    assert other is not None and (other["ranked_by"], other["ranks"]) == ("driver", 1)
    assert other["mrr"] == pytest.approx(one["mrr"], rel=1e-9)
    # under early stopping the best validated checkpoint is ranked, not the latest: let the
    # first epoch's manifest claim the best validation, and finish the run again
    manifest = tmp_path / "run" / "checkpoints" / "epoch-000001" / "manifest.json"
    claimed = {**json.loads(manifest.read_text()), "valid_mrr": 0.99}
    manifest.write_text(json.dumps(claimed))
    again = train(_config(tmp_path, "run", **sections, distributed=gang), resume=True).results
    assert again is not None and (again["ranked_by"], again["training"]["model_epoch"]) == (
        "gang",
        1,
    )
    first = evaluate_run(str(tmp_path / "run"), checkpoint=1)
    assert again["mrr"] == pytest.approx(first["mrr"], rel=1e-9) and first["mrr"] != one["mrr"]


@pytest.mark.parametrize(
    ("failures", "error"), [(1, "lost"), (2, "lost"), (1, "bug")], ids=["once", "twice", "bug"]
)
def test_a_failed_test_gang_is_tried_again_then_left_to_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int, error: str
) -> None:
    """The gang that ranks the test split fails (a worker lost, say): it is launched once more;
    when that fails too, or fails in a way a relaunch cannot help, the driver ranks the split
    itself, and the trained run still finishes."""
    import kgpipe.launch.dask as launch_dask
    from kgpipe.distributed.gang import GangError

    real, tries = launch_dask.launch_gang, []

    def launch(client: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is launch_dask.rank_test:
            tries.append(fn)
            if len(tries) <= failures and error == "bug":
                raise RuntimeError("a bug in the driver's side of the gang")
            if len(tries) <= failures:
                raise GangError("rank 1 on tcp://x: worker lost", rank=1, worker="tcp://x")
        return real(client, fn, *args, **kwargs)

    monkeypatch.setattr(launch_dask, "launch_gang", launch)
    sections = {
        "model": {"name": "distmult", "dim": 16},
        "training": TRAINING,
        "evaluation": {"test": True},
    }
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 3}
    config = _config(tmp_path, "run", **sections, distributed=gang)
    config = config.model_copy(
        update={"fault_tolerance": config.fault_tolerance.model_copy(
            update={"restart_backoff_s": 0.0}
        )}
    )  # fmt: skip
    result = train(config)
    assert result.results is not None
    assert len(tries) == (1 if error == "bug" else min(failures + 1, 2))
    by = "gang" if failures < 2 and error == "lost" else "driver"
    assert (result.results["ranked_by"], result.results["ranks"]) == (by, 2 if by == "gang" else 1)
    one = evaluate_run(str(tmp_path / "run"))
    assert result.results["mrr"] == pytest.approx(one["mrr"], rel=1e-9)


def test_a_test_gang_that_would_not_fit_leaves_the_split_to_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The gang that ranks the test split gets a memory check of its own: where one of its ranks
    would pass its worker's limit, no gang is launched and the driver ranks the split."""
    import kgpipe.launch.dask as launch_dask
    import kgpipe.launch.memory as memory

    launched: list[Any] = []
    real_launch, real_need = launch_dask.launch_gang, memory.ranking_memory

    def launch(client: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        launched.append(fn)
        return real_launch(client, fn, *args, **kwargs)

    def need(*args: Any, **kwargs: Any) -> memory.RankMemory:
        real = real_need(*args, **kwargs)
        assert 0 < real.total < 64 * 2**20 and real.optimizer == 0  # UMLS: its share, no Adam
        return memory.RankMemory(**{**vars(real), "tables": 50 * 2**30})

    monkeypatch.setattr(launch_dask, "launch_gang", launch)
    monkeypatch.setattr(memory, "ranking_memory", need)
    sections = {"model": {"name": "distmult", "dim": 16}, "training": TRAINING,
                "evaluation": {"test": True}}  # fmt: skip
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 3, "memory_limit": "3GiB"}
    with caplog.at_level("WARNING", logger="kgpipe.distributed"):
        result = train(_config(tmp_path, "run", **sections, distributed=gang))
    assert result.results is not None and result.results["ranked_by"] == "driver"
    assert launch_dask.rank_test not in launched
    assert "the gang would not fit: one rank needs about 50.00 GiB" in caplog.text


def test_a_sharded_checkpoint_resumes_on_another_world_size(tmp_path: Path) -> None:
    """Epoch 2's shards, written by 2 ranks, are read by 3 ranks (each reads its own shards) and
    by one process (which assembles the whole table); all end where 2 ranks end."""
    sections = {
        "model": {"name": "transe", "dim": 16, "init": "uniform", "init_scale": 0.1},
        "training": {**TRAINING, "epochs": 4, "loss": "margin"},
        "checkpoint": {"keep_last": 10},
    }
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 6}
    train(_config(tmp_path, "two", **sections, distributed=gang))
    for name, workers in (("three", 3), ("one", 1)):
        shutil.copytree(tmp_path / "two", tmp_path / name)
        for epoch in (3, 4):
            shutil.rmtree(tmp_path / name / "checkpoints" / f"epoch-{epoch:06d}")
        for leftover in ("model.safetensors", "results.json"):
            (tmp_path / name / leftover).unlink(missing_ok=True)
        train(
            _config(tmp_path, name, **sections, distributed={**gang, "workers": workers}),
            resume=True,
        )
        manifest = json.loads(
            (tmp_path / name / "checkpoints" / "epoch-000004" / "manifest.json").read_text()
        )
        assert manifest["world_size"] == workers
        # resumed: epochs 1-2 are the 2-rank gang's, epochs 3-4 this run's
        assert [m.get("world_size", 1) for m in _metrics(tmp_path, name)] == [
            2,
            2,
            workers,
            workers,
        ]
        a, b = _model(tmp_path, "two"), _model(tmp_path, name)
        for key in ("entity", "relation"):
            assert (a[key] - b[key]).abs().max().item() <= 1e-5, (name, key)


def _checkpoint_tensors(folder: Path, epoch: int) -> dict[str, torch.Tensor]:
    """Every tensor of a committed sharded checkpoint, by name (the shard files merged)."""
    ckpt = folder / "checkpoints" / f"epoch-{epoch:06d}"
    out: dict[str, torch.Tensor] = {}
    for name in json.loads((ckpt / "manifest.json").read_text())["files"]:
        out.update(load_file(ckpt / name))
    return out


def test_a_background_commit_writes_its_epoch_while_the_next_one_trains(tmp_path: Path) -> None:
    """With checkpoint.background (the default), each rank copies its shards at the epoch's end
    and a thread writes and commits them: rank 1's writes take 2 s (a slow store), and it
    starts the next epoch before its file is written. Every checkpoint holds exactly what a
    foreground commit of the same run writes (the state of its epoch, not a later one)."""
    from rank_callbacks import SlowShardWrites

    sections = {
        "model": {"name": "transe", "dim": 16, "init": "uniform", "init_scale": 0.1},
        "training": {**TRAINING, "epochs": 3, "loss": "margin"},
    }
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 4}
    log = tmp_path / "rank1.log"
    train(
        _config(tmp_path, "bg", **sections, checkpoint={"keep_last": 10}, distributed=gang),
        rank_callbacks=[SlowShardWrites(rank=1, seconds=2, log=log)],
    )
    foreground = {"keep_last": 10, "background": False}
    train(_config(tmp_path, "fg", **sections, checkpoint=foreground, distributed=gang))
    for epoch in (1, 2, 3):
        bg, fg = (
            _checkpoint_tensors(tmp_path / "bg", epoch),
            _checkpoint_tensors(tmp_path / "fg", epoch),
        )
        assert sorted(bg) == sorted(fg)
        # not the writer's global RNG state: a record of the process, which no resume reads
        differ = [k for k in fg if k != "rng.torch" and not torch.equal(bg[k], fg[k])]
        assert differ == [], epoch
    assert not torch.equal(
        _checkpoint_tensors(tmp_path / "bg", 1)[shard_key(0, "table.entity")],
        _checkpoint_tensors(tmp_path / "bg", 2)[shard_key(0, "table.entity")],
    )  # the epochs differ: a snapshot taken late would show
    events = {}
    for line in log.read_text().splitlines():
        what, epoch, at = line.split()
        events[(what, int(epoch))] = float(at)
    for epoch in (1, 2):  # training went on while the epoch's file was written
        assert events[("started", epoch + 1)] < events[("written", epoch)], events


def test_a_failed_background_commit_fails_every_rank_at_the_next_commit(tmp_path: Path) -> None:
    """Rank 1's write of epoch 1's shards fails in the background (a full store): every rank
    raises it at epoch 2's commit, as the StorageFull it was (not retried: the run stops with
    the rank's message), and epoch 1 is not committed."""
    from rank_callbacks import FailShardWrite

    config = _config(
        tmp_path,
        "full",
        model={"name": "transe", "dim": 8},
        training={**TRAINING, "epochs": 3},
        distributed={"workers": 2, "strategy": "sharded", "entity_shards": 4},
        fault_tolerance={"max_restarts": 2, "restart_backoff_s": 0.1},
    )
    with pytest.raises(KgpipeError) as err:
        train(config, rank_callbacks=[FailShardWrite(rank=1, epoch=1)])
    message = str(err.value)
    assert "the sharded checkpoint of epoch 1 was not committed" in message, message
    assert "rank 1: no room left for epoch 1's shards (injected)" in message, message
    assert "restart" not in message  # refused at once, not retried
    folder = tmp_path / "full" / "checkpoints"
    assert not list(folder.glob("*/manifest.json"))
    # raised at epoch 2's commit, before rank 0 reported epoch 2; epoch 3 never trained
    assert [m["epoch"] for m in _metrics(tmp_path, "full")] == [1]


def test_a_failed_background_commit_stops_every_rank_at_the_next_epochs_end(
    tmp_path: Path,
) -> None:
    """With checkpoint.every=3, rank 1's background write of epoch 3's shards fails: the ranks
    agree on it at epoch 4's end (every rank pauses as epoch 4 starts, so the commit has surely
    ended by then) and all stop there, before reporting epoch 4 -- not at the next commit
    (epoch 6, after epochs 4 and 5 were reported) -- with the commit's own error (StorageFull:
    not retried), not a broken collective's echo."""
    from rank_callbacks import FailShardWrite, PauseAt

    config = _config(
        tmp_path,
        "full-early",
        model={"name": "transe", "dim": 8},
        training={**TRAINING, "epochs": 7},
        checkpoint={"every": 3},
        distributed={"workers": 2, "strategy": "sharded", "entity_shards": 4},
        fault_tolerance={"max_restarts": 2, "restart_backoff_s": 0.1},
    )
    assert config.checkpoint.background
    with pytest.raises(KgpipeError) as err:
        train(config, rank_callbacks=[FailShardWrite(rank=1, epoch=3), PauseAt(epoch=4, seconds=3)])
    message = str(err.value)
    assert "the sharded checkpoint of epoch 3 was not committed" in message, message
    assert "rank 1: no room left for epoch 3's shards (injected)" in message, message
    assert "restart" not in message
    reported = [m["epoch"] for m in _metrics(tmp_path, "full-early")]
    assert reported == [1, 2, 3], reported  # before: [1, 2, 3, 4, 5]


def test_a_sharded_run_exports_a_part_per_shard_and_predicts_from_the_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The export holds a Parquet part per shard (written shard by shard from the checkpoint);
    ``kgpipe predict`` answers from the parts, one at a time, what the whole model answers."""
    sections = {"model": {"name": "distmult", "dim": 16, "reciprocal": False}, "training": TRAINING}
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 3}
    train(_config(tmp_path, "run", **sections, distributed=gang))
    run = tmp_path / "run"
    parts = sorted((run / "embeddings" / "entities").glob("part-*.parquet"))
    assert [p.name for p in parts] == [f"part-00000{s}.parquet" for s in range(3)]
    relations = pq.read_table(run / "embeddings" / "relations.parquet")
    assert not any(relations.column("inverse").to_pylist())  # not reciprocal
    whole = _model(tmp_path, "run")["entity"]
    labels = vocab_labels(run, "entities")
    seen: list[int] = []
    for part in parts:
        table = pq.read_table(part)
        ids = table.column("id").to_pylist()
        rows = torch.tensor(table.column("embedding").to_pylist())
        assert torch.equal(rows, whole[ids])
        assert table.column("label").to_pylist() == [labels[i] for i in ids]
        seen += ids
    assert sorted(seen) == list(range(len(labels)))
    info = json.loads((run / "embeddings" / "model.json").read_text())
    assert (info["layout"], info["parts"]) == ("sharded", 3)
    # a part an earlier export with more shards left (a resume may change them) is not read:
    # its rows were listed twice, one with the old score
    (run / "embeddings" / "entities" / "part-000007.parquet").write_bytes(parts[0].read_bytes())
    model = load_model(Store(str(run)))
    rel = 2
    relations = vocab_labels(run, "relations")
    for flag in ("--head", "--tail"):
        code, out, err = run_cli(
            ["predict", str(run), flag, labels[7], "--relation", relations[rel], "--top", "5",
             "--json", "--no-known"],
            capsys,
        )  # fmt: skip
        assert code == 0, err
        got = json.loads(out)
        assert "known" not in got[0]  # --no-known looked nothing up (it said false)
        a, r = torch.tensor([7]), torch.tensor([rel])
        scores = (
            model.score_all_tails(a, r)[0] if flag == "--head" else model.score_all_heads(r, a)[0]
        )
        top = torch.topk(scores, 5)
        assert [g["score"] for g in got] == pytest.approx(top.values.tolist(), rel=1e-5)
        side = "tail" if flag == "--head" else "head"
        assert [g[side] for g in got] == [labels[i] for i in top.indices.tolist()]
    # an export without the names of its parts (before they were named) and more parts than
    # it counts is refused; a new export of the run replaces the old one, stale part and all
    del info["part_files"]
    (run / "embeddings" / "model.json").write_text(json.dumps(info))
    code, _, err = run_cli(["predict", str(run), "--head", labels[7], "--relation",
                            relations[rel]], capsys)  # fmt: skip
    assert code == 2 and "names 3 entity parts, and entities/ holds 4" in err, err
    code, _, err = run_cli(["export", str(run), "--out", str(run / "embeddings")], capsys)
    assert code == 0, err
    assert not (run / "embeddings" / "entities").exists()
    assert (run / "embeddings" / "entities.parquet").exists()


def test_a_failed_sharded_commit_fails_every_rank_as_what_it_was() -> None:
    """The ranks learn of a commit's failure as (kind, message) and raise it as the class the
    gang acts on: a fenced writer or a full disk is not retried, other failures are."""
    from kgpipe.errors import CheckpointError, Fenced, StorageFull
    from kgpipe.runs.sharded import _describe, _raise

    _raise([], "nothing failed")
    assert _describe(Fenced("lease lost")) == ("fenced", "lease lost")
    assert _describe(OSError("disk")) == ("", "OSError: disk")
    for kind, cls in (("fenced", Fenced), ("full", StorageFull), ("", CheckpointError)):
        with pytest.raises(cls, match=r"^epoch 3: rank 1: boom$"):
            _raise([(kind, "rank 1: boom")], "epoch 3")


def test_a_rank_reads_and_checks_only_the_files_it_needs(tmp_path: Path) -> None:
    """The manifest says which shards each file holds: a reader that selects files by it
    neither needs nor hashes the others (a corrupt other file does not stop it); a reader of
    every file does."""
    store = CheckpointStore(Store(str(tmp_path)))
    files = {}
    for rank, shards in ((0, [0, 2]), (1, [1, 3])):
        tensors = {shard_key(s, "table.entity"): torch.full((2, 3), float(s)) for s in shards}
        if rank == 0:
            tensors["table.relation"] = torch.zeros(4, 3)
        info = store.write_file(1, f"shards-r{rank}.safetensors", tensors)
        files[f"shards-r{rank}.safetensors"] = {**info, "shards": shards, "replicated": rank == 0}
    ckpt = store.commit(1, 10, [], files, {})
    (tmp_path / "checkpoints" / "epoch-000001" / "shards-r1.safetensors").write_bytes(b"corrupt")

    def mine(info: dict[str, Any]) -> bool:
        return bool(info["replicated"]) or not {0, 2}.isdisjoint(info["shards"])

    state, shards = store.load_selected(ckpt, lambda k: True, mine)
    assert sorted(shards) == [shard_key(0, "table.entity"), shard_key(2, "table.entity")]
    assert torch.equal(state.tables["relation"], torch.zeros(4, 3))
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        store.load_selected(ckpt, lambda k: True)


def test_a_slow_shard_writer_is_waited_for_under_the_commit_timeout(tmp_path: Path) -> None:
    """Rank 1 takes 25 s to write its checkpoint file, past the gang's 20-s collective timeout:
    the commit's collectives wait under `distributed.commit_timeout_s`, so the run finishes
    with no relaunch (`max_restarts: 0`) and its epoch committed."""
    from rank_callbacks import SlowShardWrites

    config = _config(
        tmp_path,
        "slow",
        model={"name": "transe", "dim": 8},
        training={**TRAINING, "epochs": 1},
        distributed={
            "workers": 2,
            "strategy": "sharded",
            "entity_shards": 4,
            "timeout_s": 20,
            "commit_timeout_s": 120,
        },
        fault_tolerance={"max_restarts": 0},
    )
    train(config, rank_callbacks=[SlowShardWrites(rank=1, seconds=25)])
    checkpoints = sorted(p.name for p in (tmp_path / "slow" / "checkpoints").iterdir())
    assert checkpoints == ["epoch-000001"]
    assert [m.get("restarts", 0) for m in _metrics(tmp_path, "slow")] == [0]


def test_a_resume_with_other_entity_shards_is_refused_before_a_gang(tmp_path: Path) -> None:
    """The entities are permuted over `entity_shards`: a resume with another number was
    accepted, then every rank refused the checkpoint, and the gang was relaunched
    max_restarts times (38 s) before the run failed. It is refused before anything starts."""
    from kgpipe.errors import RunError

    sections: dict[str, Any] = {"model": {"name": "complex", "dim": 8},
                                "training": {**TRAINING, "epochs": 1}}  # fmt: skip
    gang = {"workers": 2, "strategy": "sharded", "entity_shards": 4}
    train(_config(tmp_path, "s", **sections, distributed=gang))
    longer = {**sections, "training": {**TRAINING, "epochs": 2}}
    other = _config(tmp_path, "s", **longer, distributed={**gang, "entity_shards": 2})
    with pytest.raises(RunError, match=r"entity_shards=4, this config has 2; resume with"):
        train(other, resume=True)
    assert [m["epoch"] for m in _metrics(tmp_path, "s")] == [1]


def test_a_sharded_exports_top_answers_are_the_whole_models_with_nan_rows() -> None:
    """``kgpipe predict`` on a sharded export merges each part's top-k: NaN scores (broken
    rows) filled it part after part, and the last filter dropped them with the finite answers
    they had pushed out (2 answers of 5 here). It now equals the whole model's top-k."""
    import numpy as np

    from kgpipe.config import ModelConfig
    from kgpipe.export_shards import ShardedEmbeddings
    from kgpipe.models.model import KGEModel

    model = KGEModel.build(ModelConfig(name="distmult", dim=8), num_entities=30,
                           num_relations=2, seed=0)  # fmt: skip
    with torch.no_grad():
        model.entity[[3, 11, 25]] = float("nan")
    table = model.entity.detach()
    parts = {"p0": np.arange(0, 30, 3), "p1": np.arange(1, 30, 3), "p2": np.arange(2, 30, 3)}
    emb = ShardedEmbeddings.__new__(ShardedEmbeddings)  # the parts from memory, not files
    emb.spec, emb.interaction, emb.parts = model.spec, model.interaction, list(parts)
    emb.relations = model.relation.detach()
    read = {name: (ids, table[torch.from_numpy(ids)]) for name, ids in parts.items()}
    emb._part = read.__getitem__  # type: ignore[method-assign]
    emb.entity = table.__getitem__  # type: ignore[method-assign]
    a, r = torch.tensor([0]), torch.tensor([1])
    for side, scores in (("tail", model.score_all_tails(a, r)[0]),
                         ("head", model.score_all_heads(r, a)[0])):  # fmt: skip
        for k, exclude in ((5, ()), (8, (3, 4, 7))):
            scores = scores.clone()
            scores[list(exclude)] = float("-inf")
            want = torch.topk(scores, k)
            values, ids = emb.top(0, 1, side, k, exclude)
            assert len(ids) == k, (side, ids)
            nan = [i for i, v in zip(ids, values, strict=True) if v != v]
            assert sorted(nan) == sorted({3, 11, 25} - set(exclude))  # first, in any order
            assert ids[len(nan) :] == want.indices.tolist()[len(nan) :]
            assert values[len(nan) :] == pytest.approx(want.values.tolist()[len(nan) :])
