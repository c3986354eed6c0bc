"""The memory a rank needs, estimated before a gang launches, and the refusal when one rank
cannot fit its worker's memory limit (issue 22, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from kgpipe.config import parse_config
from kgpipe.devices import device_memory
from kgpipe.distributed.gang import live_workers
from kgpipe.errors import ConfigError
from kgpipe.launch.memory import (
    check_gang_memory,
    check_training_gang,
    format_bytes,
    gang_workers,
    rank_memory,
    ranking_memory,
)
from kgpipe.pipeline import train

MIB = 2**20


def _config(**sections: dict) -> object:
    return parse_config({"data": {"dataset": "umls"}, **sections})


def test_rank_memory_is_the_tables_their_state_a_checkpoint_and_the_triples() -> None:
    config = _config(model={"name": "transe", "dim": 10, "reciprocal": True})
    m = rank_memory(config, num_entities=1000, num_relations=5, num_train=101, world=2)
    tables = 4 * (1000 * 10 + 10 * 10)  # 10 relation rows (reciprocal), TransE width = dim
    assert m.tables == tables
    assert m.optimizer == 2 * tables  # Adam (the default): two moments per value
    assert m.checkpoint == 3 * tables  # the background writer's snapshot of both (streamed)
    assert m.averaging == 0  # step sync
    assert m.triples == 101 * (3 * 4 + 4)  # step sync: all triples (3 int32 ids, an int32 order)
    assert m.validation == 0  # evaluation.every: 0
    # a step: 2 x (1024 / 2 local batch) x (256 negatives + 2) x 10 floats (rows, gradients)
    assert m.step == 4 * 2 * 512 * 258 * 10
    assert m.total == 6 * tables + 101 * 16 + m.step
    synchronous = _config(model={"name": "transe", "dim": 10}, checkpoint={"background": False})
    assert (
        rank_memory(
            synchronous, num_entities=1000, num_relations=5, num_train=0, world=1
        ).checkpoint
        == 0
    )
    adagrad = _config(
        model={"name": "transe", "dim": 10}, training={"optimizer": "adagrad"},
        distributed={"workers": 2, "sync": "epoch"},
    )  # fmt: skip
    m = rank_memory(adagrad, num_entities=1000, num_relations=5, num_train=0, world=2)
    tables = 4 * (1000 * 10 + 5 * 10)
    one_vs_all = _config(
        model={"name": "transe", "dim": 10}, training={"mode": "1vsall", "loss": "bce"}
    )
    m1 = rank_memory(one_vs_all, num_entities=1000, num_relations=5, num_train=0, world=1)
    # 2 x 1024 queries (both sides of each triple) x 1000 entities, 4 matrices for BCE and 3.5
    # more for a distance model's temporaries (a step peaked at 2-4x the former count: the
    # scores and one gradient of b, not 2b, queries), and 3 table-sized gradients
    assert m1.step == int(4 * 2 * 1024 * 1000 * (4 + 3.5)) + 3 * 4 * 1000 * 10
    for name, mode, loss, reciprocal, mats, queries in (
        ("complex", "1vsall", "cross_entropy", True, 1, 2 * 1024),  # fused: blocks of scores
        ("complex", "1vsall", "cross_entropy", False, 2.25, 2 * 1024),
        ("distmult", "kvsall", "cross_entropy", False, 5.25, 1024),  # a query an example
        ("distmult", "kvsall", "bce", True, 4.25, 1024),
    ):
        config = _config(model={"name": name, "dim": 10, "reciprocal": reciprocal},
                         training={"mode": mode, "loss": loss})  # fmt: skip
        got = rank_memory(config, num_entities=1000, num_relations=5, num_train=0, world=1)
        assert got.step == int(4 * queries * 1000 * mats) + 3 * 4 * 1000 * 10, (name, mode)
    # a loss registered elsewhere (not measured) counts as the most of the measured ones
    from kgpipe.training.losses import LOSSES, BCELoss

    LOSSES.register("bce-like")(type("BCELike", (BCELoss,), {}))
    try:
        config = _config(model={"name": "distmult", "dim": 10},
                         training={"mode": "1vsall", "loss": "bce-like"})  # fmt: skip
        got = rank_memory(config, num_entities=1000, num_relations=5, num_train=0, world=1)
        assert got.step == int(4 * 2 * 1024 * 1000 * 5.25) + 3 * 4 * 1000 * 10
    finally:
        LOSSES._classes.pop("bce-like", None)
    assert (m.optimizer, m.checkpoint) == (tables, 2 * tables)
    assert m.averaging == tables + 4 * (1000 + 5)  # the epoch's start and per-row counts
    validating = _config(
        model={"name": "transe", "dim": 10}, evaluation={"every": 1, "batch_size": 256},
        distributed={"workers": 2, "sync": "epoch"},
    )  # fmt: skip
    m = rank_memory(validating, num_entities=1000, num_relations=5, num_train=101, world=2)
    # epoch sync: its 51 of 101 triples (ids, order), and all 101 ids on rank 0
    assert m.triples == 51 * (3 * 4 + 4) + 101 * 3 * 4
    # the filter index (4 int64 a triple, twice while built) and a chunk's float scores and
    # booleans against its half of the entities (full ranking is split over the gang); a
    # distance model (TransE) holds two more score-sized temporaries (a probe: 2.4x the one)
    assert m.validation == 2 * 4 * 8 * 101 + (3 * 4 + 1) * 256 * 500
    sampled = validating.model_copy(
        update={"evaluation": validating.evaluation.model_copy(update={"sampled": 100})}
    )
    m = rank_memory(sampled, num_entities=1000, num_relations=5, num_train=101, world=2)
    # rank 0 alone, against the sample of 100 and a chunk's 256 targets, not 1,000 entities
    assert m.validation == 2 * 4 * 8 * 101 + 13 * 256 * (100 + 256)
    files = {"valid": {"head": "h.tsv", "tail": "t.tsv"}}
    from_files = _config(
        data={"dataset": "umls", "candidates": files}, model={"name": "transe", "dim": 10},
        evaluation={"every": 1, "batch_size": 256},
    )  # fmt: skip
    m = rank_memory(
        from_files, num_entities=1000, num_relations=5, num_train=101, world=1,
        valid_candidates=(300, 20),
    )  # fmt: skip
    # both sides' staged int32 ids, and the per-query pairs of a chunk (ids, scores, filter
    # keys) with the rows gathered for them
    pairs = 256 * 21
    want = 2 * 4 * 8 * 101 + 2 * 300 * 20 * 4 + 45 * pairs + 3 * 4 * 2 * 10 * pairs
    assert m.validation == want


def test_a_test_ranking_rank_holds_its_share_of_the_tables_and_no_optimiser_state() -> None:
    config = _config(
        model={"name": "transe", "dim": 10}, evaluation={"batch_size": 256},
        distributed={"workers": 2, "strategy": "sharded", "entity_shards": 4},
    )  # fmt: skip
    sizes = {"num_entities": 1000, "num_relations": 5, "num_train": 101, "world": 2}
    m = ranking_memory(config, **sizes)
    assert m.tables == 4 * (500 * 10 + 5 * 10)  # 2 of 4 shards of 250 rows
    # no optimiser state; the checkpoint's tables, read next to the model's
    assert (m.optimizer, m.checkpoint, m.averaging) == (0, m.tables, 0)
    assert m.triples == 101 * 3 * 4  # the filter's ids, no epoch order
    assert m.step == 12 * 1000  # the shard map
    assert m.validation == 2 * 4 * 8 * 101 + 13 * 256 * 500  # its half of the entities
    with_files = ranking_memory(config, **sizes, test_candidates=(300, 20))
    pairs = 256 * 21  # both sides' staged int32 ids, the chunk's pairs and their rows
    assert with_files.validation == 2 * 4 * 8 * 101 + 2 * 300 * 20 * 4 + 45 * pairs + 240 * pairs


def test_a_sharded_rank_holds_its_shards_and_copies_them_for_a_background_commit() -> None:
    sharded = _config(
        model={"name": "transe", "dim": 10},
        distributed={"workers": 2, "strategy": "sharded", "entity_shards": 4},
    )
    m = rank_memory(sharded, num_entities=1000, num_relations=5, num_train=0, world=2)
    tables = 4 * (500 * 10 + 5 * 10)  # 2 of 4 shards of 250 rows; relations replicated
    assert (m.tables, m.optimizer, m.checkpoint) == (tables, 2 * tables, 3 * tables)
    foreground = _config(
        model={"name": "transe", "dim": 10},
        distributed={"workers": 2, "strategy": "sharded", "entity_shards": 4},
        checkpoint={"background": False},
    )
    f = rank_memory(foreground, num_entities=1000, num_relations=5, num_train=0, world=2)
    assert f.checkpoint == 0  # written from the live tables' row blocks
    # the fetched rows and pushed gradients double a step's buffers; the shard map
    assert m.step == 2 * 4 * 2 * 512 * 258 * 10 + 12 * 1000
    odd = rank_memory(sharded, num_entities=1000, num_relations=5, num_train=0, world=3)
    assert odd.tables == 4 * (2 * 250 * 10 + 5 * 10)  # the rank with 2 of the 4 shards
    replicated = rank_memory(
        _config(model={"name": "transe", "dim": 10}), num_entities=1000, num_relations=5,
        num_train=0, world=2,
    )  # fmt: skip
    assert replicated.tables == 4 * (1000 * 10 + 5 * 10)


def test_a_rank_that_cannot_fit_its_worker_is_refused_with_the_numbers() -> None:
    config = _config(model={"name": "transe", "dim": 1000})
    sizes = {"num_entities": 100_000, "num_relations": 10, "num_train": 0, "world": 2}
    need = rank_memory(config, **sizes).total  # ~3.2 GiB: 6 x 400 MB and a step of 1 GB
    roomy = {"w1": {"memory_limit": 8 * 2**30, "metrics": {"memory": 300 * MIB}}}
    assert check_gang_memory(config, roomy, **sizes).total == need
    no_limit = {"w": {"memory_limit": 0, "metrics": {"memory": 64 * 2**30}}}
    assert check_gang_memory(config, no_limit, **sizes).total == need  # no limit: no check
    tight = {
        "w1": {"memory_limit": 8 * 2**30, "metrics": {"memory": 300 * MIB}},
        "w2": {"memory_limit": 3 * 2**30, "metrics": {"memory": 300 * MIB}},
    }
    with pytest.raises(ConfigError) as err:
        check_gang_memory(config, tight, **sizes)
    message = str(err.value)
    assert "\n" not in message
    for part in ("needs about 3.22 GiB", "300.00 MiB", "memory limit is 3.00 GiB", "w2",
                 "distributed.memory_limit", "tables 381.51 MiB"):  # fmt: skip
        assert part in message, (part, message)


def test_a_background_commit_that_does_not_fit_is_written_in_the_foreground() -> None:
    """Where only the copy a background commit takes passes a worker's limit, the gang commits
    in the foreground rather than being refused; where even that does not fit, it is refused.
    A segment that commits only at its end (waited for at once) needs no copy."""
    config = _config(
        model={"name": "transe", "dim": 1000},
        distributed={"workers": 2, "strategy": "sharded", "entity_shards": 4},
    )
    sizes = {"num_entities": 100_000, "num_relations": 10, "num_train": 0, "world": 2}
    m = rank_memory(config, **sizes)
    assert m.checkpoint == m.tables + m.optimizer > 0

    def worker(limit: int) -> dict[str, dict]:  # a limit that leaves `limit` for the rank
        return {"w": {"memory_limit": int((limit + 100 * MIB) / 0.95) + 1,
                      "metrics": {"memory": 100 * MIB}}}  # fmt: skip

    epochs_1_to_5 = {"segment": (0, 5), **sizes}  # commits after epochs 1-4 in the background
    assert check_training_gang(config, worker(m.total), **epochs_1_to_5) is config
    launched = check_training_gang(config, worker(m.total - m.checkpoint), **epochs_1_to_5)
    assert launched.checkpoint.background is False
    assert launched.model_dump(exclude={"checkpoint"}) == config.model_dump(exclude={"checkpoint"})
    with pytest.raises(ConfigError, match="memory limit"):
        check_training_gang(config, worker(m.total - m.checkpoint - MIB), **epochs_1_to_5)
    # epoch 1 alone: its commit ends the segment, no copy; the config is launched as it is
    assert (
        check_training_gang(config, worker(m.total - m.checkpoint), segment=(0, 1), **sizes)
        is config
    )
    # epoch 5 alone, resumed: its ranks read the checkpoint next to the live tables (counted
    # only for a background commit before: a resumed rank measured +402 MiB, 241 counted)
    with pytest.raises(ConfigError, match="memory limit"):
        check_training_gang(config, worker(m.total - m.checkpoint), segment=(4, 5), **sizes)
    assert check_training_gang(config, worker(m.total), segment=(4, 5), **sizes) is config
    # a warm start commits an epoch-0 checkpoint, which its ranks read: counted too
    with pytest.raises(ConfigError, match="memory limit"):
        check_training_gang(
            config, worker(m.total - m.checkpoint), segment=(0, 1), resumed=True, **sizes
        )
    every5 = _config(
        model={"name": "transe", "dim": 1000},
        distributed={"workers": 2, "strategy": "sharded", "entity_shards": 4},
        checkpoint={"every": 5},
    )
    assert check_training_gang(every5, worker(m.total - m.checkpoint), **epochs_1_to_5) is every5


def test_a_gang_over_its_memory_limit_is_refused_before_it_trains(tmp_path: Path) -> None:
    """UMLS with 200,000-wide embeddings: ~2.2 GB per rank (tables, Adam, a commit's copies)
    against workers of 700 MiB: refused before the gang starts, nothing committed."""
    config = parse_config(
        {
            "run": {"root": str(tmp_path), "name": "big"},
            "data": {"dataset": "umls"},
            "model": {"name": "transe", "dim": 200_000},
            "training": {"epochs": 1},
            "evaluation": {"test": False},
            "distributed": {"workers": 2, "memory_limit": "700MiB"},
        }
    )
    with pytest.raises(ConfigError, match=r"memory limit is 700\.00 MiB"):
        train(config)
    assert not list((tmp_path / "big").glob("checkpoints/*/manifest.json"))


def test_ids_past_int32_are_counted_as_int64() -> None:
    config = _config(model={"name": "transe", "dim": 10})
    edge = rank_memory(config, num_entities=2**31, num_relations=5, num_train=10, world=1)
    assert edge.triples == 10 * (3 * 4 + 4)  # ids up to 2**31 - 1: int32
    big = rank_memory(config, num_entities=2**31 + 1, num_relations=5, num_train=10, world=1)
    assert big.triples == 10 * (3 * 8 + 4)


def test_a_rank_on_a_gpu_is_checked_against_its_card_and_the_rest_against_the_limit() -> None:
    """On a GPU the tables, their optimiser state, the step's buffers, the scores of a
    validation chunk and the training triples live on the card; the host keeps a commit's
    copy, the staged triples and the filter index. A model past the worker's host limit that
    fits the card is launched; one that does not fit the card is refused, naming the card."""
    config = _config(
        model={"name": "transe", "dim": 1000}, evaluation={"every": 1, "batch_size": 256},
        distributed={"workers": 2},
    )  # fmt: skip
    sizes = {"num_entities": 100_000, "num_relations": 10, "num_train": 1000, "world": 2}
    m = rank_memory(config, **sizes)
    index = 2 * 4 * 8 * 1000  # the filter index: built from the staged triples, in host memory
    assert m.validation_host == index
    host, card = m.on_gpu()
    assert (card.tables, card.optimizer, card.step, card.triples) == (
        m.tables, m.optimizer, m.step, m.triples
    )  # fmt: skip
    assert (card.checkpoint, card.validation) == (0, m.validation - index)
    assert (host.tables, host.optimizer, host.step) == (m.tables, 0, 0)  # built, then moved
    assert host.checkpoint == m.tables + m.optimizer  # written from host memory
    assert (host.triples, host.validation) == (m.triples, index)
    foreground = config.model_copy(
        update={"checkpoint": config.checkpoint.model_copy(update={"background": False})}
    )
    # a foreground commit copies the tables to host memory as well, on a GPU
    assert rank_memory(foreground, **sizes).on_gpu()[0].checkpoint == host.checkpoint

    def worker(limit: int, gpu: dict | None = None) -> dict[str, dict]:
        info = {"memory_limit": limit, "metrics": {"memory": 300 * MIB}}
        return {"tcp://w:1": {**info, "gpu": gpu} if gpu else info}

    card_80 = {"free": 80 * 2**30, "total": 80 * 2**30}
    with pytest.raises(ConfigError, match=r"memory limit is 3\.00 GiB"):  # all in host memory
        check_gang_memory(config, worker(3 * 2**30), **sizes)
    assert check_gang_memory(config, worker(3 * 2**30, card_80), **sizes).total == m.total
    with pytest.raises(ConfigError) as err:  # the host's part alone passes 1 GiB
        check_gang_memory(config, worker(2**30, card_80), **sizes)
    assert f"needs about {format_bytes(host.total)} (tables 381.51 MiB, checkpoint" in str(
        err.value
    )
    small = {"free": 2 * 2**30, "total": 16 * 2**30}
    with pytest.raises(ConfigError) as err:
        check_gang_memory(config, worker(64 * 2**30, small), **sizes)
    message = str(err.value)
    assert "\n" not in message
    parts = (
        f"needs about {format_bytes(card.total)} on its GPU",
        "tables 381.51 MiB",
        "tcp://w:1 has 2.00 GiB free of 16.00 GiB",
        "distributed.strategy: sharded",
    )
    for part in parts:
        assert part in message, (part, message)
    # a rank may fill 90 % of the card's free memory, not all of it
    edge = -(-card.total * 10 // 9) + 10
    assert check_gang_memory(config, worker(64 * 2**30, {"free": edge, "total": edge}), **sizes)
    with pytest.raises(ConfigError, match="may fill 90% of it"):
        near = int(card.total / 0.9 * 0.99)
        check_gang_memory(config, worker(64 * 2**30, {"free": near, "total": edge}), **sizes)
    # a rank that ranks the test split reads its tables in host memory and moves them; the
    # triples are the filter's, in host memory only
    ranking = ranking_memory(config, **sizes)
    r_host, r_card = ranking.on_gpu(training=False)
    assert (r_host.checkpoint, r_card.tables, r_card.triples) == (ranking.tables,) * 2 + (0,)
    assert r_host.triples == ranking.triples


def test_a_worker_without_a_gpu_reports_no_card() -> None:
    assert device_memory("cpu", None) is None
    assert device_memory("auto", "local") is None  # a LocalCluster's ranks stay on the CPU
    config = _config(model={"name": "transe", "dim": 10})
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                     host="127.0.0.1") as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        workers = gang_workers(client, config)
        assert list(workers) == list(live_workers(client))
        assert all("gpu" not in w and "memory_limit" in w for w in workers.values())
        # the memory in use is read when asked: the scheduler's figure is sampled every few
        # seconds, and at a first launch it predated torch (61 MiB for a worker holding 314)
        assert all(w["metrics"]["memory"] > 150 * 2**20 for w in workers.values()), workers
