"""Reading triples from and writing run folders to a real S3 server (SeaweedFS on loopback)."""

from __future__ import annotations

import gzip
import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import s3fs
from conftest import S3Server

from kgpipe.config import parse_config
from kgpipe.data.dataset import load_dataset
from kgpipe.errors import DataError, StorageUnreachable
from kgpipe.pipeline import train
from kgpipe.runs.read import evaluate_run, load_run


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


def test_candidate_files_from_s3_into_an_s3_run(
    s3_server: S3Server, datasets_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``data.candidates`` read from the store (gzipped and plain text), staged into a run folder
    on the store and read back from it (downloaded, not memory-mapped) at the test."""
    import numpy as np

    fs = _fs(s3_server)
    lines = {}
    for split in ("train", "valid", "test"):
        raw = (datasets_root / "nations" / f"{split}.txt").read_bytes()
        fs.pipe(f"kgpipe/cand/{split}.tsv", raw)
        lines[split] = [x.split("\t") for x in raw.decode().splitlines() if x.strip()]
    entities = sorted({x for rows in lines.values() for h, _, t in rows for x in (h, t)})
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(entities), (len(lines["test"]), 2, 6))
    text = [
        "\n".join("\t".join(entities[i] for i in row) for row in pick[:, s]) + "\n" for s in (0, 1)
    ]
    fs.pipe("kgpipe/cand/test-head.tsv.gz", gzip.compress(text[0].encode()))
    fs.pipe("kgpipe/cand/test-tail.tsv", text[1].encode())
    opts = s3_server.storage_options()
    cfg = parse_config(
        {
            "run": {"root": "s3://kgpipe/runs", "name": "cand", "storage_options": opts},
            "data": {
                **{s: f"s3://kgpipe/cand/{s}.tsv" for s in ("train", "valid", "test")},
                "candidates": {
                    "test": {
                        "head": "s3://kgpipe/cand/test-head.tsv.gz",
                        "tail": "s3://kgpipe/cand/test-tail.tsv",
                    }
                },
                "storage_options": opts,
            },
            "model": {"name": "distmult", "dim": 8},
            "training": {"epochs": 1, "batch_size": 256, "negatives": 4},
        }
    )
    train(cfg)
    saved = json.loads(fs.cat("kgpipe/runs/cand/results.json"))
    assert saved["protocol"]["candidates"] == "files-6"
    staged = np.load(io.BytesIO(fs.cat("kgpipe/runs/cand/data/candidates/test-tail.npy")))
    assert staged.tolist() == pick[:, 1].tolist()  # nations' labels sort as its ids do
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)  # the data's, for the re-read
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    again = evaluate_run("s3://kgpipe/runs/cand", storage_options=opts)
    assert again["mrr"] == pytest.approx(saved["mrr"], abs=1e-12)


def test_parquet_from_s3_is_read_a_batch_at_a_time(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Parquet file on S3 takes the columnar reader (seeks and ranged reads on the object)
    and gives what the same file on disk gives, its row named in an error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import kgpipe.data.reading as reading

    n = 3_000
    table = pa.table({"head": [f"e{i % 101}" for i in range(n)],
                      "relation": [f"r{i % 7}" for i in range(n)],
                      "tail": [f"e{(i * 13) % 103}" for i in range(n)]})  # fmt: skip
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=500)
    _fs(s3_server).put(str(tmp_path / "train.parquet"), "kgpipe/data/pq/train.parquet")
    opts = s3_server.storage_options()
    seen: list[str] = []
    real = reading._read_columnar
    monkeypatch.setattr(reading, "_read_columnar", lambda *a: seen.append("c") or real(*a))
    remote = parse_config({"data": {"train": "s3://kgpipe/data/pq/train.parquet",
                                    "storage_options": opts}})  # fmt: skip
    local = parse_config({"data": {"train": str(tmp_path / "train.parquet")}})
    got, want = load_dataset(remote.data), load_dataset(local.data)
    assert seen == ["c", "c"]
    assert got.train.tolist() == want.train.tolist() and got.vocab == want.vocab
    assert got.fingerprint == want.fingerprint
    bad = table.set_column(2, "tail", pa.array([*table.column(2).to_pylist()[:-1], None]))
    pq.write_table(bad, tmp_path / "bad.parquet", row_group_size=500)
    _fs(s3_server).put(str(tmp_path / "bad.parquet"), "kgpipe/data/pq/bad.parquet")
    remote = parse_config({"data": {"train": "s3://kgpipe/data/pq/bad.parquet",
                                    "storage_options": opts}})  # fmt: skip
    with pytest.raises(DataError, match=r"bad.parquet, line 3000: null tail value"):
        load_dataset(remote.data)


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
    stored = load_run(str(tmp_path / "sec")).config.data
    with pytest.raises(DataError, match=r"s3://kgpipe/data/y\.tsv: cannot read"):
        load_dataset(stored)
    # (evaluating the run needs no access to the data: it ranks the triples the run staged)
    assert evaluate_run(str(tmp_path / "sec"))["triples"] == 1
    # ... and from the environment, as usual for AWS clients, they work
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    s3fs.S3FileSystem.clear_instance_cache()
    assert load_dataset(stored).test.shape[0] == 1


@pytest.mark.parametrize("when", ["reading the training triples", "writing the vocabulary"])
def test_s3_outage_during_staging(
    own_s3_server: Any,
    datasets_root: Path,
    tmp_path: Path,
    when: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SeaweedFS is stopped while staging reads the graph (or writes the run folder's
    vocabulary), and started again 6 s later: every read and write of the run goes through the
    storage layer's retries, and the run completes as it would have without the outage.

    botocore's own retries are turned off here (they alone span about 10 s per call, which
    would hide an outage this short from kgpipe's layer, the one under test)."""
    import threading
    import time

    from safetensors.torch import load as st_load

    from kgpipe.storage import Store

    server = own_s3_server.server
    s3fs.S3FileSystem.clear_instance_cache()
    fs = _fs(server)
    for split in ("train", "valid", "test"):
        raw = (datasets_root / "nations" / f"{split}.txt").read_bytes()
        fs.pipe(f"kgpipe/outage/data/{split}.tsv", raw)
    opts = {**server.storage_options(), "config_kwargs": {"retries": {"max_attempts": 1}}}

    def config(root: str, name: str, root_opts: dict[str, Any]) -> Any:
        return parse_config(
            {
                "run": {"root": root, "name": name, "storage_options": root_opts},
                "data": {
                    **{s: f"s3://kgpipe/outage/data/{s}.tsv" for s in ("train", "valid", "test")},
                    "storage_options": opts,
                },
                "model": {"name": "distmult", "dim": 16},
                "training": {"epochs": 2, "batch_size": 256, "negatives": 8, "threads": 2},
                "fault_tolerance": {"storage_retries": 8, "storage_backoff_s": 0.5},
            }
        )

    train(config(str(tmp_path), "calm", {}))  # the same run with S3 up throughout
    seen: dict[str, Any] = {}

    def outage() -> None:
        if "stopped" in seen:
            return
        own_s3_server.stop()
        seen["stopped"] = time.monotonic()

        def restart() -> None:
            time.sleep(6)
            own_s3_server.start()
            seen["restarted"] = time.monotonic()

        seen["thread"] = threading.Thread(target=restart)
        seen["thread"].start()

    import kgpipe.data.io as data_io

    real_read = data_io.read_url
    real_write = Store.write_bytes
    real_produced = Store.write_produced

    def read_url(url: str, *args: Any, **kwargs: Any) -> bytes:
        if when.startswith("reading") and url.endswith("outage/data/train.tsv"):
            outage()
        return real_read(url, *args, **kwargs)

    def write_bytes(self: Store, rel: str, data: bytes) -> None:
        if when.startswith("writing") and rel == "entities.tsv":
            outage()
        real_write(self, rel, data)

    def write_produced(self: Store, rel: str, *args: Any, **kwargs: Any) -> tuple[str, int]:
        if when.startswith("writing") and rel == "entities.tsv":  # the vocabulary's writer
            outage()
        return real_produced(self, rel, *args, **kwargs)

    import kgpipe.data.columnar_tsv as columnar  # where the columnar reader opens its streams

    real_open = columnar.opened

    def opened(url: str, *args: Any, **kwargs: Any) -> Any:  # the columnar reader's streams
        if when.startswith("reading") and url.endswith("outage/data/train.tsv"):
            outage()
        return real_open(url, *args, **kwargs)

    data_io.read_url = read_url  # type: ignore[assignment]
    columnar.opened = opened  # type: ignore[assignment]
    Store.write_bytes = write_bytes  # type: ignore[method-assign]
    Store.write_produced = write_produced  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="kgpipe.storage"):
            result = train(config("s3://kgpipe/outage/runs", "stormy", opts))
    finally:
        data_io.read_url = real_read  # type: ignore[assignment]
        columnar.opened = real_open  # type: ignore[assignment]
        Store.write_bytes = real_write  # type: ignore[method-assign]
        Store.write_produced = real_produced  # type: ignore[method-assign]
        if "thread" in seen:
            seen["thread"].join()
    assert seen["restarted"] - seen["stopped"] >= 6
    retried = [r.getMessage() for r in caplog.records if r.name == "kgpipe.storage"]
    assert retried and all("retry" in m for m in retried), retried  # the storage layer's
    assert result.results is not None
    calm = json.loads((tmp_path / "calm" / "results.json").read_text())
    assert result.results["mrr"] == calm["mrr"]
    stormy = st_load(_fs(server).cat_file("kgpipe/outage/runs/stormy/model.safetensors"))
    calm_model = st_load((tmp_path / "calm" / "model.safetensors").read_bytes())
    assert all(bool((stormy[k] == calm_model[k]).all()) for k in ("entity", "relation"))


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens on it once closed


@pytest.mark.parametrize("where", ["data", "run root"])
def test_an_unreachable_endpoint_fails_in_seconds_at_start_up(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused connection when a run starts is one line within seconds (it took 82 s of
    retries, botocore's inside kgpipe's), naming the endpoint; nothing is written."""
    import time

    from kgpipe.cli.main import main

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}
    run = {"root": str(tmp_path / "runs"), "name": "r"}
    data: dict[str, Any] = {"dataset": "umls"}
    if where == "data":
        data = {"train": "s3://bucket/train.tsv", "storage_options": options}
    else:
        run = {"root": "s3://bucket/runs", "name": "r", "storage_options": options}
    cfg = {
        "run": run,
        "data": data,
        "model": {"name": "transe", "dim": 4},
        "training": {"epochs": 1},
    }
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    status = main(["train", "-c", str(tmp_path / "c.yaml"), "--no-prefect", "-q"])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert status == 2
    assert elapsed < 10, elapsed
    assert f"cannot reach the object store at {endpoint} (connection refused)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_a_reached_endpoint_is_not_probed_again(s3_server: S3Server) -> None:
    """Once an endpoint answered, a later fault is a run's fault: no fail-fast probe again (its
    faults then go to the storage layer's retries, tested by the outage tests)."""
    from kgpipe import endpoints as storage

    fs = s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True)
    storage.check_reachable(fs, "s3://kgpipe/x")
    assert s3_server.endpoint in storage._REACHED
    dead = s3fs.S3FileSystem(
        key="k",
        secret="s",
        client_kwargs={"endpoint_url": f"http://127.0.0.1:{_closed_port()}"},
        skip_instance_cache=True,
    )
    with pytest.raises(StorageUnreachable):
        storage.check_reachable(dead, "s3://kgpipe/x")
    dead_endpoint = dead.storage_options["client_kwargs"]["endpoint_url"]
    storage._REACHED.add(dead_endpoint)  # as if it had answered once
    try:
        storage.check_reachable(dead, "s3://kgpipe/x")  # reached once: left to the retries
    finally:
        storage._REACHED.discard(dead_endpoint)
