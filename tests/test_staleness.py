"""Bounded staleness under the sharded strategy (``distributed.staleness: k``): a rank computes
with rows it fetched up to ``k`` steps before, and fetches only the others.

The cache is checked on its own (ages, eviction), and on a gang of 2 ranks: fewer rows
fetched and fewer bytes than every row fresh every step, the same model from the same seed
twice, and a resume from a commit that repeats the uninterrupted run bit for bit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from kgpipe.config import RunConfig, parse_config
from kgpipe.distributed.sharded import RowCache
from kgpipe.errors import ConfigError
from kgpipe.pipeline import train

TRAINING: dict[str, Any] = {
    "epochs": 2,
    "batch_size": 256,
    "negatives": 16,
    "chunk_size": 32,
    "lr": 0.01,
    "loss": "margin",
}


def _config(tmp_path: Path, name: str, staleness: int, epochs: int = 2) -> RunConfig:
    return parse_config(
        {
            "run": {"seed": 7, "root": str(tmp_path), "name": name},
            "data": {"dataset": "umls"},
            "model": {"name": "transe", "dim": 16, "init": "uniform", "init_scale": 0.1},
            "training": {**TRAINING, "epochs": epochs},
            "evaluation": {"test": False},
            "checkpoint": {"keep_last": 5},
            "distributed": {
                "workers": 2,
                "strategy": "sharded",
                "entity_shards": 4,
                "staleness": staleness,
            },
        }
    )


def _entity(tmp_path: Path, name: str) -> torch.Tensor:
    return load_file(tmp_path / name / "model.safetensors")["entity"]


def _metrics(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    text = (tmp_path / name / "metrics.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()]


def test_the_cache_serves_a_row_while_it_is_at_most_k_steps_old() -> None:
    cache = RowCache(staleness=2)
    ids = torch.tensor([3, 9, 5])
    cache.update(ids, torch.tensor([[3.0], [9.0], [5.0]]), step=10)
    assert cache.ids.tolist() == [3, 5, 9]  # kept sorted, rows beside their ids
    for step, fresh in ((10, True), (11, True), (12, True), (13, False)):
        mask, rows = cache.lookup(torch.tensor([5, 4, 9]), step)
        assert mask.tolist() == [fresh, False, fresh], step
        assert rows is not None and rows.view(-1).tolist() == ([5.0, 9.0] if fresh else []), step
    cache.update(
        torch.tensor([4]), torch.tensor([[4.0]]), step=12
    )  # 3, 5, 9 still usable at 13? no
    assert cache.ids.tolist() == [4]  # fetched at 10: too old for step 13, dropped
    assert cache.size == 1
    cache.update(torch.tensor([7]), torch.tensor([[7.0]]), step=13)
    assert cache.ids.tolist() == [4, 7]  # 4 (step 12) is still usable at step 14
    cache.clear()
    assert cache.size == 0 and cache.lookup(torch.tensor([4]), 13)[0].tolist() == [False]


@pytest.mark.parametrize("staleness", [1, 3])
def test_the_cache_agrees_with_a_dict_over_many_steps_and_reuses_its_slots(staleness: int) -> None:
    """Random steps against a reference (a dict of id -> (step, row)): the same rows served, the
    same ids kept; the pool stops growing once the cache has reached its steady size, and
    never passes its limit."""
    gen = torch.Generator().manual_seed(staleness)
    limit = 40  # the rows other ranks own: ids 0..39
    cache = RowCache(staleness, limit=limit)
    ref: dict[int, tuple[int, torch.Tensor]] = {}
    pools = []
    for step in range(200):
        if step % 50 == 49:  # an epoch's end
            cache.clear()
            ref.clear()
        ids = torch.unique(
            torch.randint(
                0, limit, (int(torch.randint(1, 25, (1,), generator=gen)),), generator=gen
            )
        )
        mask, rows = cache.lookup(ids, step)
        fresh = [i for i in ids.tolist() if i in ref and step - ref[i][0] <= staleness]
        assert ids[mask].tolist() == fresh, step
        if fresh:
            assert rows is not None
            assert torch.equal(rows, torch.stack([ref[i][1] for i in fresh])), step
        need = ids[~mask]
        new_rows = torch.randn(need.numel(), 3, generator=gen)
        cache.update(need, new_rows, step)
        ref = {i: v for i, v in ref.items() if v[0] >= step + 1 - staleness}
        ref.update({i: (step, r) for i, r in zip(need.tolist(), new_rows, strict=True)})
        assert cache.ids.tolist() == sorted(ref), step
        assert cache.pool is not None
        pools.append(cache.pool.shape[0])
    assert max(pools) <= limit
    assert len(set(pools)) <= 8  # grown a few times in 200 steps: freed slots are written again


def test_staleness_needs_the_sharded_strategy(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="staleness works with strategy=sharded only"):
        parse_config({"run": {"root": str(tmp_path)}, "distributed": {"staleness": 2}})


def test_stale_reads_fetch_less_repeat_themselves_and_resume_bit_for_bit(tmp_path: Path) -> None:
    train(_config(tmp_path, "fresh", staleness=0))
    train(_config(tmp_path, "stale", staleness=3))
    train(_config(tmp_path, "again", staleness=3))
    fresh, stale = _metrics(tmp_path, "fresh"), _metrics(tmp_path, "stale")
    assert all("rows_cached" not in m for m in fresh)
    assert all(m["rows_cached"] > 0 and m["rows_fetched"] > 0 for m in stale)
    assert sum(m["bytes_sent"] for m in stale) < sum(m["bytes_sent"] for m in fresh)
    a, b = _entity(tmp_path, "fresh"), _entity(tmp_path, "stale")
    assert 0 < float((a - b).abs().max()) < 0.5  # stale rows change the path, not the scale
    assert torch.equal(b, _entity(tmp_path, "again"))  # the cache is deterministic
    assert stale[-1]["loss"] == pytest.approx(fresh[-1]["loss"], rel=0.2)

    # a resume from the commit of epoch 1 repeats epoch 2 exactly: the cache starts empty
    shutil.copytree(tmp_path / "stale", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "epoch-000002")
    for leftover in ("model.safetensors", "results.json"):
        (tmp_path / "resumed" / leftover).unlink(missing_ok=True)
    train(_config(tmp_path, "resumed", staleness=3), resume=True)
    assert torch.equal(_entity(tmp_path, "resumed"), b)
