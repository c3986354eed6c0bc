"""Reading triples from and writing run folders to a real S3 server (SeaweedFS on loopback)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import s3fs
from conftest import S3Server

from kgpipe.config import parse_config
from kgpipe.data.dataset import load_dataset
from kgpipe.errors import DataError
from kgpipe.pipeline import train
from kgpipe.runs.read import evaluate_run


def _fs(server: S3Server) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True)


def test_train_from_s3_into_s3(
    s3_server: S3Server, datasets_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _fs(s3_server)
    for split in ("train", "valid", "test"):
        raw = (datasets_root / "nations" / f"{split}.txt").read_bytes()
        fs.pipe(f"kgpipe/data/nations/{split}.tsv.gz", gzip.compress(raw))
    opts = s3_server.storage_options()
    cfg = parse_config(
        {
            "run": {"root": "s3://kgpipe/runs", "name": "nations", "storage_options": opts},
            "data": {
                "train": "s3://kgpipe/data/nations/train.tsv.gz",
                "valid": "s3://kgpipe/data/nations/valid.tsv.gz",
                "test": "s3://kgpipe/data/nations/test.tsv.gz",
                "storage_options": opts,
            },
            "model": {"name": "distmult", "dim": 16},
            "training": {"epochs": 2, "batch_size": 256, "negatives": 8},
        }
    )
    result = train(cfg)
    assert result.url == "s3://kgpipe/runs/nations"
    listed = {p.split("kgpipe/runs/nations/")[1] for p in fs.find("kgpipe/runs/nations")}
    assert {
        "config.yaml",
        "results.json",
        "metrics.jsonl",
        "model.safetensors",
        "vocab/entities.tsv",
        "embeddings/entities.parquet",
    } <= listed
    saved = json.loads(fs.cat("kgpipe/runs/nations/results.json"))
    # credentials are not stored in the run: the run root's come explicitly, the data's from env
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    again = evaluate_run("s3://kgpipe/runs/nations", storage_options=opts)
    assert again["mrr"] == pytest.approx(saved["mrr"], abs=1e-12)


def test_wrong_credentials_are_a_clear_error(s3_server: S3Server) -> None:
    _fs(s3_server).pipe("kgpipe/data/x.tsv", b"a\tr\tb\n")
    opts = {**s3_server.storage_options(), "secret": "wrong"}
    cfg = parse_config({"data": {"train": "s3://kgpipe/data/x.tsv", "storage_options": opts}})
    with pytest.raises(DataError) as err:
        load_dataset(cfg.data)
    assert "s3://kgpipe/data/x.tsv" in str(err.value)
    assert "wrong" not in str(err.value)


def test_credentials_never_reach_the_run_folder(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _fs(s3_server)
    fs.pipe("kgpipe/data/y.tsv", b"a\tr\tb\nb\tr\tc\nc\ts\ta\n")
    fs.pipe("kgpipe/data/y-test.tsv", b"a\tr\tc\n")
    opts = s3_server.storage_options()
    cfg = parse_config(
        {
            "run": {"root": str(tmp_path), "name": "sec"},
            "data": {
                "train": "s3://kgpipe/data/y.tsv",
                "test": "s3://kgpipe/data/y-test.tsv",
                "storage_options": opts,
            },
            "model": {"name": "transe", "dim": 4},
            "training": {"epochs": 1, "batch_size": 2, "negatives": 2},
        }
    )
    train(cfg)
    for path in (tmp_path / "sec").rglob("*"):
        if path.is_file():
            assert s3_server.secret.encode() not in path.read_bytes(), path
            assert s3_server.key.encode() not in path.read_bytes(), path
    # the data's credentials are not in the run: without them, a clear error ...
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec caches file systems by their arguments
    with pytest.raises(DataError, match=r"s3://kgpipe/data/y\.tsv: cannot read"):
        evaluate_run(str(tmp_path / "sec"))
    # ... and from the environment, as usual for AWS clients, they work
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    s3fs.S3FileSystem.clear_instance_cache()
    assert evaluate_run(str(tmp_path / "sec"))["triples"] == 1
