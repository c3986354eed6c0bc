"""Segments between validations, early stopping, warm-start mapping (pure parts and a run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kgpipe.config import parse_config
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import RunError
from kgpipe.pipeline import train
from kgpipe.runs.segments import segment_ends, should_stop
from kgpipe.runs.warmstart import warm_start_tables


def _cfg(epochs: int, every: int) -> object:
    return parse_config({"data": {"dataset": "umls"}, "training": {"epochs": epochs},
                         "evaluation": {"every": every}})  # fmt: skip


def test_segment_ends() -> None:
    assert segment_ends(0, _cfg(10, 4)) == [4, 8, 10]
    assert segment_ends(5, _cfg(10, 4)) == [8, 10]
    assert segment_ends(0, _cfg(10, 0)) == [10]
    assert segment_ends(8, _cfg(8, 4)) == []
    assert segment_ends(0, _cfg(8, 4)) == [4, 8]


def test_should_stop() -> None:
    rows = [{"valid_mrr": x} for x in (0.1, 0.3, 0.2, 0.25)]
    assert should_stop(rows, 2)  # no better than 0.3 in the last two
    assert not should_stop(rows, 3)
    assert not should_stop([*rows, {"valid_mrr": 0.31}], 2)
    assert not should_stop(rows, None)


def test_early_stopping_keeps_the_best_validated_model(tmp_path: Path) -> None:
    cfg = parse_config({
        "run": {"root": str(tmp_path), "name": "es", "seed": 0},
        "data": {"dataset": "umls"},
        "model": {"name": "distmult", "dim": 16},
        # a learning rate far too high: validation MRR peaks early, then stalls or falls
        "training": {"epochs": 40, "batch_size": 512, "lr": 0.5, "loss": "softplus",
                     "negatives": 16, "chunk_size": 64},
        "evaluation": {"every": 1, "patience": 2},
        "checkpoint": {"keep_last": 2},
    })  # fmt: skip
    result = train(cfg)
    assert result.results is not None
    history = result.history
    assert len(history) < 40
    mrrs = [h.extra["valid_mrr"] for h in history]
    best_epoch = max(range(len(mrrs)), key=lambda i: (mrrs[i], -i)) + 1
    assert result.results["training"]["model_epoch"] == best_epoch
    assert max(mrrs[-2:]) <= max(mrrs[:-2])
    manifests = sorted((tmp_path / "es" / "checkpoints").glob("*/manifest.json"))
    kept = [json.loads(m.read_text())["epoch"] for m in manifests]
    assert best_epoch in kept and len(kept) <= 3  # last 2 and the best
    # resumed (as after a crash while it finished): no more training, the same model
    (tmp_path / "es" / "results.json").unlink()
    again = train(cfg, resume=True)
    assert [h.epoch for h in again.history] == [h.epoch for h in history]
    assert again.results is not None
    assert again.results["training"]["model_epoch"] == best_epoch
    assert again.results["mrr"] == result.results["mrr"]
    # its best checkpoint corrupt: the run finishes from the best one that verifies
    best_state = next((tmp_path / "es" / "checkpoints" / f"epoch-{best_epoch:06d}").glob("state-*"))
    raw = bytearray(best_state.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    best_state.write_bytes(bytes(raw))
    (tmp_path / "es" / "results.json").unlink()
    last = train(cfg, resume=True)
    assert last.results is not None
    others = {h.epoch: h.extra["valid_mrr"] for h in history if h.epoch in kept}
    others.pop(best_epoch)
    assert last.results["training"]["model_epoch"] == max(others, key=lambda e: (others[e], -e))


def test_warm_start_maps_rows_by_label() -> None:
    old = Vocabulary(("a", "b", "c"), ("r", "s"))
    new = Vocabulary(("c", "x", "a"), ("s", "t"))
    oe, orel = torch.arange(6.0).reshape(3, 2), torch.arange(8.0).reshape(4, 2)  # reciprocal
    ne, nrel = torch.full((3, 2), -1.0), torch.full((4, 2), -1.0)
    ws = warm_start_tables(old, oe, orel, new, ne, nrel)
    assert ws.entity.tolist() == [[4, 5], [-1, -1], [0, 1]]
    # relation s: row 1 -> row 0, and its inverse row 3 -> row 2
    assert ws.relation.tolist() == [[2, 3], [-1, -1], [6, 7], [-1, -1]]
    assert (ws.kept_entities, ws.new_entities, ws.dropped_entities) == (2, 1, 1)
    assert (ws.kept_relations, ws.new_relations, ws.dropped_relations) == (1, 1, 1)


def test_a_staging_that_stopped_is_staged_again_with_its_warm_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow retries its staging task after a storage fault. The retry found its own
    half-staged folder and refused it ("a run with this name exists"), or, when the fault hit
    the warm start after data.json, took the folder as staged and trained from a random start.
    The warm start is now committed before data.json (written last), and a folder without it
    is staged again."""
    import kgpipe.runs.stage as stage
    from kgpipe.errors import StorageError
    from kgpipe.runs.folder import is_staged, run_store

    base = {
        "run": {"root": str(tmp_path)},
        "data": {"dataset": "umls"},
        "model": {"name": "distmult", "dim": 8},
        "training": {"epochs": 1, "max_steps_per_epoch": 2},
        "evaluation": {"test": False},
    }
    previous = train(parse_config({**base, "run": {**base["run"], "name": "prev"}})).url
    config = parse_config({**base, "run": {**base["run"], "name": "next"}})  # fmt: skip
    real, faults = stage.commit_warm_start, [StorageError("injected: the store went away")]

    def flaky(*args: object, **kwargs: object) -> object:
        if faults:
            raise faults.pop()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(stage, "commit_warm_start", flaky)
    with pytest.raises(StorageError):
        stage.prepare_run(config, warm_start=previous)
    assert not is_staged(run_store(config))  # not taken for staged by a retry
    stage.preflight(config)  # nor refused by kgpipe train's check before the flow
    run = stage.prepare_run(config, warm_start=previous)  # the retry: staged again
    assert [c.epoch for c in run.checkpoints().committed()] == [0]
    assert is_staged(run_store(config))
    with pytest.raises(RunError, match="a run with this name exists"):
        stage.prepare_run(config)  # a finished staging is still not overwritten


def test_a_resume_that_does_not_test_leaves_no_earlier_test_results(tmp_path: Path) -> None:
    """results.json held the test metrics of the model an earlier finish chose; a resume that
    trained on without testing left them beside another model (and the Prefect path printed
    them as the run's)."""
    base = {"run": {"root": str(tmp_path), "name": "r"}, "data": {"dataset": "umls"},
            "model": {"name": "distmult", "dim": 8},
            "training": {"epochs": 1, "max_steps_per_epoch": 2}}  # fmt: skip
    assert train(parse_config(base)).results is not None
    assert (tmp_path / "r" / "results.json").exists()
    longer = {**base, "training": {"epochs": 2, "max_steps_per_epoch": 2},
              "evaluation": {"test": False}}  # fmt: skip
    assert train(parse_config(longer), resume=True).results is None
    assert not (tmp_path / "r" / "results.json").exists()
