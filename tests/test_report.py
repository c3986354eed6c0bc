"""The end-of-run report, its curve and the metrics table (no Prefect server), and the flows'
config parameters (config / config_url / overrides)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kgpipe.config import RunConfig, load_config, parse_config
from kgpipe.errors import ConfigError
from kgpipe.runs.folder import DATA, RunFolder, run_store
from kgpipe.runs.report import curve_figure, curve_png, markdown_report, metrics_table

REPO = Path(__file__).resolve().parents[1]


def _history(epochs: int = 6, every: int = 3) -> list[dict[str, Any]]:
    out = []
    for e in range(1, epochs + 1):
        h: dict[str, Any] = {
            "epoch": e, "loss": 1.0 / e + 0.123456789, "triples": 5216, "seconds": 0.987654,
            "triples_per_s": 5216 / 0.987654, "lr": 0.1, "steps": 21, "threads": 2,
        }  # fmt: skip
        if e % every == 0:
            h.update({"valid_mrr": 0.9 + 0.002 * (e == every), "valid_hits@10": 0.987654321,
                      "valid_mr": 1.5, "valid_seconds": 0.1})  # fmt: skip
        out.append(h)
    return out


def _run(tmp_path: Path) -> RunFolder:
    config = parse_config({
        "run": {"root": str(tmp_path), "name": "rep", "seed": 3},
        "data": {"dataset": "umls"},
        "model": {"name": "complex", "dim": 64, "reciprocal": True},
        "training": {"epochs": 6, "mode": "1vsall", "loss": "cross_entropy",
                     "optimizer": "adagrad", "lr": 0.1, "batch_size": 256},
        "evaluation": {"every": 3},
    })  # fmt: skip
    store = run_store(config)
    split = {"lines": 5216, "triples": 5216, "duplicates": 0, "unseen": 0, "unseen_action": "n/a",
             "source": "umls/train.tsv", "literals_dropped": 0, "sha256": ""}  # fmt: skip
    store.write_json(DATA, {
        "fingerprint": "abcdef0123456789", "num_entities": 135, "num_relations": 46,
        "splits": {"train": split,
                   "valid": {**split, "lines": 652, "triples": 652, "source": "umls/valid.tsv",
                             "unseen_action": "error"}},
    })  # fmt: skip
    return RunFolder(store.url, config, 135, 46, 5216, "abcdef0123456789", 0)


def test_every_metrics_row_has_the_same_keys_rounded_for_reading() -> None:
    rows = metrics_table(_history())
    keys = ["epoch", "loss", "lr", "valid_mrr", "valid_hits@10", "triples_per_s", "seconds"]
    assert [list(r) for r in rows] == [keys] * 6
    assert rows[0]["valid_mrr"] is None and rows[0]["valid_hits@10"] is None
    assert rows[2]["valid_mrr"] == 0.902 and rows[2]["valid_hits@10"] == 0.9877
    assert rows[0]["loss"] == 1.1235 and rows[0]["seconds"] == 0.99 and rows[0]["lr"] == 0.1
    assert rows[0]["triples_per_s"] == 5281 and isinstance(rows[0]["triples_per_s"], int)
    json.dumps(rows, allow_nan=False)  # what the Prefect API stores
    gang = metrics_table([{**h, "world_size": 2, "bytes_sent": 10.0} for h in _history(2)])
    assert all("world_size" in r and r["bytes_sent"] == 10 for r in gang)
    assert (
        metrics_table([{**_history(1)[0], "triples_per_s": float("nan")}])[0]["triples_per_s"]
        is None
    )


def test_the_curve_is_large_with_an_mrr_axis_from_zero_a_legend_and_the_best_epoch() -> None:
    import matplotlib.pyplot as plt

    fig = curve_figure(_history())
    try:
        w, h = fig.get_size_inches()
        assert w >= 9 and h >= 4.5 and fig.dpi >= 100
        loss_ax, mrr_ax = fig.axes
        low, high = mrr_ax.get_ylim()
        # MRRs of 0.902 and 0.900: the axis spans 0..1, so the 0.002 step looks small
        assert low == 0.0 and high <= 1.0 and high - low >= 0.5
        labels = [t.get_text() for t in loss_ax.get_legend().get_texts()]
        assert labels[:2] == ["train loss", "valid MRR (filtered)"]
        assert "best: epoch 3, MRR 0.9020" in labels
    finally:
        plt.close(fig)
    low = [{**h, "valid_mrr": 0.05} if "valid_mrr" in h else h for h in _history()]
    low_fig = curve_figure(low)
    try:
        assert low_fig.axes[1].get_ylim() == (0.0, 0.2)  # room to see a low MRR move
    finally:
        plt.close(low_fig)
    assert curve_png(_history()).startswith(b"\x89PNG")


def test_the_report_says_the_hyperparameters_the_best_epoch_and_the_data(tmp_path: Path) -> None:
    run = _run(tmp_path)
    results = {"mrr": 0.91, "mr": 1.4, "hits@1": 0.85, "hits@3": 0.95, "hits@10": 0.99,
               "training": {"restarts": 0}}  # fmt: skip
    disk = markdown_report(run, results, _history(), seconds=12.0, curve="curves.png")
    for row in ("| model | complex (reciprocal relations) |", "| dim | 64 |", "| mode | 1vsall |",
                "| loss | cross_entropy |", "| optimizer | adagrad |", "| learning rate | 0.1 |",
                "| batch size | 256 |", "| negatives | — (1vsall) |", "| schedule | constant |",
                "| regularizer | none |",
                "| epochs | 6 |", "| validation | every 3 epochs |"):  # fmt: skip
        assert row in disk, row
    assert "best validation: epoch **3**, MRR **0.9020**" in disk
    assert "135 entities, 46 relations" in disk
    assert "| train | 5,216 | 5,216 | 0 | — | `umls/train.tsv` |" in disk
    assert "| valid | 652 | 652 | 0 | 0 (error) | `umls/valid.tsv` |" in disk
    assert "![loss and validation MRR](curves.png)" in disk and "base64" not in disk
    inline = markdown_report(run, results, _history(), seconds=12.0, png=b"\x89PNG")
    assert "](data:image/png;base64," in inline
    none = markdown_report(run, None, [h for h in _history() if "valid_mrr" not in h], seconds=1)
    assert "best validation: — (no validation ran)" in none
    assert "| metric (test, filtered) |" in disk  # every entity: nothing more to say
    # sampled and per-query rankings run above full ranking's: the report says which it was
    sampled = [{**h, "valid_candidates": "sampled-50"} if "valid_mrr" in h else h
               for h in _history()]  # fmt: skip
    per_query = {**results, "protocol": {"filter": ["train"], "candidates": "per-query-50"}}
    report = markdown_report(run, per_query, sampled, seconds=1)
    assert "| metric (test, filtered against per-query-50 candidates, not all entities) |" in report
    assert "MRR **0.9020**, Hits@10 0.9877 against sampled-50 candidates, not all" in report


# -- the flows' config parameters ------------------------------------------------------------------
def _resolve(*args: Any, **kw: Any) -> RunConfig:
    from flows.params import resolve_config

    return resolve_config(*args, **kw)


def test_config_url_with_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # relative to the flow run's working directory
    cfg = _resolve(None, "configs/umls-complex.yaml", ["model.dim=64", "training.epochs=2"])
    assert (cfg.model.dim, cfg.training.epochs, cfg.model.name) == (64, 2, "complex")
    with pytest.raises(ConfigError, match=r"model\.dimm: unknown key"):
        _resolve(None, "configs/umls-complex.yaml", ["model.dimm=64"])
    with pytest.raises(ConfigError, match=r"model\.dim"):
        _resolve(None, "configs/umls-complex.yaml", ["model.dim=lots"])
    with pytest.raises(ConfigError, match="config file not found"):
        _resolve(None, "configs/nope.yaml")


def test_config_with_overrides_keeps_credentials(tmp_path: Path) -> None:
    base = parse_config({"run": {"root": str(tmp_path), "storage_options": {"secret": "s3cr3t"}},
                         "data": {"dataset": "umls"}})  # fmt: skip
    assert _resolve(base, None) is base
    cfg = _resolve(base, None, ["model.dim=16"])
    assert cfg.model.dim == 16 and cfg.run.storage_options["secret"] == "s3cr3t"


def test_exactly_one_of_config_and_config_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    base = load_config("configs/umls-complex.yaml", ["model.dim=8"])
    with pytest.raises(ConfigError, match="no config"):
        _resolve(None, None)
    with pytest.raises(ConfigError, match="not both"):
        _resolve(base, "configs/umls-complex.yaml")
    # the deployment's default gives way to what the run gave
    said: list[str] = []
    got = _resolve(base, "configs/umls-complex.yaml",
                   defaults={"config_url": "configs/umls-complex.yaml"}, log=said.append)  # fmt: skip
    assert got.model.dim == 8 and "the deployment's default" in said[0]
    got = _resolve(
        base, "configs/umls-complex.yaml", defaults=lambda: {"config": base.model_dump(mode="json")}
    )
    assert got.model.dim == 256
    # a config_url of the run's own (not the default) next to a config: refused, not dropped
    with pytest.raises(ConfigError, match="not both"):
        _resolve(base, "configs/wn18rr-transe.yaml",
                 defaults={"config_url": "configs/umls-complex.yaml"})  # fmt: skip
    with pytest.raises(ConfigError, match="not both"):  # a typed config that is not the default
        _resolve(base, "configs/umls-complex.yaml", defaults={"config": {"data": {"dataset": "x"}}})
    with pytest.raises(ConfigError, match=r"list of key\.path=value"):
        _resolve(base, None, "model.dim=8")  # type: ignore[arg-type]
