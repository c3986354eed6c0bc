"""The temporary Prefect API server of ``kgpipe train``, tied to the life of the command.

Without ``PREFECT_API_URL`` Prefect would start its own temporary server as a plain child in the
command's process group: a Ctrl-C in the terminal reaches it too and kills it mid-run (the client
then retries it for minutes), and when the command is killed it keeps running for good, since
Prefect stops it only from an ``atexit`` hook. This one instead

* runs in its own session, so the terminal's signals do not reach it;
* asks the kernel for SIGTERM when the command dies by any means, SIGKILL included
  (``PR_SET_PDEATHSIG`` on Linux), and watches its parent besides (any POSIX system);
* listens on a socket the command bound first (no port race), and serves the same application
  as Prefect's own temporary server;
* is stopped by the command at exit, after Prefect has flushed its logs and events.

Run as ``python -m flows.server FD PARENT_PID`` by :class:`TiedPrefectServer` only.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from kgpipe.errors import RunError

__all__ = ["TiedPrefectServer"]

GRACE_S = 5.0


def _die_with_parent(sig: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(sig), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down on SIGTERM
    time.sleep(GRACE_S)
    os._exit(70)


def _serve(listen_fd: int, parent_pid: int) -> None:
    _die_with_parent(signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        sys.exit(0)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    # what Prefect's own temporary server sets: no UI, the smaller set of services
    os.environ.update(
        {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    )
    import uvicorn

    config = uvicorn.Config(
        "prefect.server.api.server:create_app", factory=True, log_level="error", lifespan="on"
    )
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=listen_fd)])


class TiedPrefectServer:
    """Starts the server (:meth:`start` returns its API URL); stopped at interpreter exit."""

    def __init__(self, startup_timeout_s: float = 120.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.api_url = ""

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.api_url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
        env = dict(os.environ)
        env.pop("PREFECT_API_URL", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.server", str(sock.fileno()), str(os.getpid())],
            pass_fds=[sock.fileno()],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        sock.close()
        # at exit, and registered before Prefect is imported: Prefect's own exit hooks (which
        # flush logs and events to this server) run first
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RunError(
                    f"the temporary Prefect server exited with status {self.proc.returncode}; "
                    "set PREFECT_API_URL to a running server, or train with --orchestrator none"
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self.api_url
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RunError(
                    "the temporary Prefect server did not answer within "
                    f"{self.startup_timeout_s:.0f} s; set PREFECT_API_URL to a running server, or "
                    "train with --orchestrator none"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=GRACE_S + 1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
