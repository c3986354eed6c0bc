"""Test helpers: a real Prefect server on loopback, and headless Chromium for UI checks.

Nothing here talks to anything but 127.0.0.1.

    proc, server = start_prefect_server(tmp_dir)
    try:
        with use_prefect_server(server):       # or subprocess.run(..., env=server.client_env())
            ...  # flows, get_client(), Dask clusters
        html, png = render_page(f"{server.ui_url}/runs/flow-run/{run_id}", out_dir)
    finally:
        stop_prefect_server(proc)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Settings that would point a client (or the server) somewhere else; they are dropped from the
# inherited environment before ours are applied.
_STALE_PREFECT_VARS = (
    "PREFECT_API_URL",
    "PREFECT_API_KEY",
    "PREFECT_PROFILE",
    "PREFECT_PROFILES_PATH",
    "PREFECT_UI_URL",
    "PREFECT_UI_API_URL",
    "PREFECT_SERVER_UI_API_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
)

# Quiet and offline, for the server and its clients alike.
_QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "PREFECT_TELEMETRY_ENABLE_RESOURCE_METRICS": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    # Never offer an interactive prompt (CI has no standard input).
    "PREFECT_CLI_PROMPT": "false",
}


@dataclass
class PrefectServer:
    """A running `prefect server start` on 127.0.0.1."""

    api_url: str  # http://127.0.0.1:PORT/api
    ui_url: str  # http://127.0.0.1:PORT
    home: Path  # PREFECT_HOME shared by the server and its clients
    env: dict[str, str] = field(default_factory=dict)  # PREFECT_* variables clients need
    log_path: Path | None = None

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A full environment for a client subprocess: `base` (default os.environ) + `env`."""
        merged = {
            k: v
            for k, v in (os.environ if base is None else base).items()
            if k not in _STALE_PREFECT_VARS
        }
        merged.update(self.env)
        return merged


def prefect_cli() -> str | None:
    """The `prefect` executable of the running interpreter's environment, else on PATH."""
    beside = Path(sys.executable).parent / "prefect"
    if beside.exists():
        return str(beside)
    return shutil.which("prefect")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _log_tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


def start_prefect_server(
    home: Path, *, port: int | None = None, timeout_s: float = 90.0
) -> tuple[subprocess.Popen[bytes], PrefectServer]:
    """Start `prefect server start` (SQLite under `home`) and wait until /api/health answers.

    The server runs in its own session (process group) so that `stop_prefect_server` leaves no
    orphans. Its output goes to `home/server.log`. Without `port`, a free one is picked (and
    picked again, up to 3 times, if another process takes it first).
    """
    cli = prefect_cli()
    if cli is None:
        raise FileNotFoundError("the prefect CLI is not installed")
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        try:
            return _start_once(cli, home, port or free_port(), timeout_s)
        except _PortTaken:
            if port is not None or attempt == 2:
                raise
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    pass


def _start_once(
    cli: str, home: Path, port: int, timeout_s: float
) -> tuple[subprocess.Popen[bytes], PrefectServer]:
    api_url = f"http://127.0.0.1:{port}/api"
    ui_url = f"http://127.0.0.1:{port}"

    server_env = {k: v for k, v in os.environ.items() if k not in _STALE_PREFECT_VARS}
    server_env.update(_QUIET_ENV)
    server_env["PREFECT_HOME"] = str(home)
    # The UI's JavaScript is told where the API is; pin it to loopback.
    server_env["PREFECT_SERVER_UI_API_URL"] = api_url

    log_path = home / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child, closed below
    try:
        proc = subprocess.Popen(
            [cli, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env,
            start_new_session=True,
        )
    finally:
        log.close()  # the child holds its own descriptor

    client_env = dict(_QUIET_ENV)
    del client_env["PREFECT_SERVER_LOGGING_LEVEL"]
    client_env.update({"PREFECT_HOME": str(home), "PREFECT_API_URL": api_url})
    server = PrefectServer(api_url, ui_url, home, client_env, log_path)

    deadline = time.monotonic() + timeout_s
    while not _healthy(api_url):
        if proc.poll() is not None:
            stop_prefect_server(proc)  # anything it left in its process group
            tail = _log_tail(log_path)
            error = _PortTaken if "already in use" in tail else RuntimeError
            raise error(
                f"prefect server exited with {proc.returncode} before becoming healthy; "
                f"log tail ({log_path}):\n{tail}"
            )
        if time.monotonic() > deadline:
            stop_prefect_server(proc)
            raise TimeoutError(
                f"prefect server on {api_url} not healthy after {timeout_s:.0f} s; "
                f"log tail ({log_path}):\n{_log_tail(log_path)}"
            )
        time.sleep(0.5)
    return proc, server


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the child's pid


def stop_prefect_server(proc: subprocess.Popen[bytes], *, grace_s: float = 15.0) -> None:
    """SIGINT the server's process group, then SIGTERM, then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0)):
        if proc.poll() is not None:
            break
        _signal_group(proc, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    # Whatever is left in the group (the server itself or children that outlived it) goes now.
    _signal_group(proc, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(timeout=5)


# Client settings mirrored into Prefect's in-process settings context (see `use_prefect_server`).
_SETTING_KEYS = {
    "PREFECT_API_URL": "api.url",
    "PREFECT_HOME": "home",
    "PREFECT_CLI_PROMPT": "cli.prompt",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "cloud.enable_orchestration_telemetry",
    "PREFECT_TELEMETRY_ENABLE_RESOURCE_METRICS": "telemetry.enable_resource_metrics",
}


@contextlib.contextmanager
def use_prefect_server(server: PrefectServer) -> Iterator[PrefectServer]:
    """Point this process (and subprocesses started inside) at `server`; restore on exit.

    Sets `server.env` in os.environ (for subprocesses and Dask workers started inside) AND enters
    `prefect.settings.temporary_settings`: Prefect builds its settings context from the
    environment once, when `prefect` is first imported, so changing os.environ after that import
    is not seen in-process (flows would silently go to an ephemeral server instead).
    """
    try:
        # Imported BEFORE os.environ changes: Prefect's first import builds its process-wide
        # settings context from the environment, and a first import below would build it from
        # this server's variables, leaving every later test in this server's PREFECT_HOME
        # after the context ends (seen when a `-m slow` run reached this fixture first).
        from prefect.settings import temporary_settings
    except ImportError:
        temporary_settings = None
    saved = {k: os.environ.get(k) for k in (*server.env, *_STALE_PREFECT_VARS)}
    for k in _STALE_PREFECT_VARS:
        os.environ.pop(k, None)
    os.environ.update(server.env)
    try:
        with contextlib.ExitStack() as stack:
            if temporary_settings is not None:
                updates = {_SETTING_KEYS[k]: v for k, v in server.env.items() if k in _SETTING_KEYS}
                stack.enter_context(temporary_settings(updates=updates))
                stack.callback(drain_prefect_workers)  # runs first, while still pointed here
            yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def drain_prefect_workers() -> None:
    """Deliver the logs and events this process has queued for the server before the test lets
    go of it (what `prefect.testing.utilities.prefect_test_harness` does): else Prefect's
    at-exit flush sends them after the session's server has stopped and prints
    "--- Error logging to API --- All connection attempts failed"."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    EventsWorker.drain_all(timeout=30)


# -- headless Chromium ------------------------------------------------------------------------------

_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable, or None. `KGPIPE_CHROMIUM` overrides."""
    explicit = os.environ.get("KGPIPE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else shutil.which(explicit)
    for name in _CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _chromium_cmd(binary: str, user_data_dir: Path, budget_ms: int) -> list[str]:
    return [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1600,1000",
        f"--user-data-dir={user_data_dir}",
        f"--virtual-time-budget={budget_ms}",
    ]


def _run_chromium(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        out, err = proc.communicate()
        raise TimeoutError(
            f"chromium did not finish in {timeout_s:.0f} s: {' '.join(cmd)}\n"
            f"{err.decode(errors='replace')[-2000:]}"
        ) from None
    finally:
        _signal_group(proc, signal.SIGKILL)  # GPU/renderer helpers left behind
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def render_page(
    url: str,
    out_dir: Path,
    *,
    budget_ms: int = 15000,
    name: str = "page",
    timeout_s: float | None = None,
) -> tuple[str, Path]:
    """Render `url` in headless Chromium: returns (DOM after scripts ran, path of a PNG screenshot).

    Two Chromium runs (one `--dump-dom`, one `--screenshot`), each with a fresh profile and a
    virtual time budget of `budget_ms` (page timers fast-forward; network waits are real).
    """
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no chromium executable found (apt-get install chromium)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hard_timeout = timeout_s if timeout_s is not None else 60.0 + budget_ms / 1000.0
    png = (out_dir / f"{name}.png").resolve()
    png.unlink(missing_ok=True)

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [*_chromium_cmd(binary, Path(profile), budget_ms), "--dump-dom", url]
        res = _run_chromium(cmd, hard_timeout)
    if res.returncode != 0:
        raise RuntimeError(
            f"chromium --dump-dom {url} exited with {res.returncode}:\n"
            f"{res.stderr.decode(errors='replace')[-2000:]}"
        )
    html = res.stdout.decode("utf-8", errors="replace")
    (out_dir / f"{name}.html").write_text(html)

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [*_chromium_cmd(binary, Path(profile), budget_ms), f"--screenshot={png}", url]
        res = _run_chromium(cmd, hard_timeout)
    if res.returncode != 0 or not png.exists():
        raise RuntimeError(
            f"chromium --screenshot {url} exited with {res.returncode} "
            f"(png written: {png.exists()}; was the page reachable?):\n"
            f"{res.stderr.decode(errors='replace')[-2000:]}"
        )
    return html, png
