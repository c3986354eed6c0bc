"""The Prefect orchestrator of ``kgpipe train``: runs the ``train-kge`` flow in this process.

Registered as the ``prefect`` entry point of ``kgpipe.orchestrators`` (``pyproject.toml``), so
the library's CLI finds it without importing Prefect itself. Prefect is imported only after the
local defaults below are in the environment (its settings are read at import).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from flows.server import TiedPrefectServer
from kgpipe.config import RunConfig
from kgpipe.endpoints import tcp_problem
from kgpipe.errors import RunError
from kgpipe.runs.folder import RESULTS, run_store
from kgpipe.runs.parsed import forget_parsed
from kgpipe.runs.stage import preflight, run_lease
from kgpipe.tracking import check_tracking
from kgpipe.training.hooks import Callback

__all__ = ["ECHO", "configured_api_url", "local_prefect_defaults", "run"]

#: a log record's attribute that keeps it out of the CLI's echo (``extra={ECHO: False}``): the
#: epoch lines, which the CLI shows with its own progress display, and the flow's summary
ECHO = "kgpipe_echo"


def local_prefect_defaults() -> None:
    """Environment defaults for running a flow on Prefect's temporary local API server; call
    before Prefect is imported. A value already set wins.

    * no telemetry: offline it only logs an error;
    * a patient start-up wait instead of Prefect's 20 s: the first start on a new machine
      creates and migrates the database, which on 2 busy cores took longer than that (the flow
      then failed with "Timed out while attempting to connect to ephemeral Prefect API server").
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def quiet_prefect_console(verbose: bool) -> None:
    """Prefect's console lines at WARNING (its task-state and per-epoch INFO lines stay in the
    Prefect API, for the UI), or at INFO with ``verbose``; call before Prefect is imported.
    A level the user set in ``PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL`` wins."""
    os.environ.setdefault(
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "INFO" if verbose else "WARNING"
    )


class _Echo(logging.Handler):
    """kgpipe's own INFO messages in the flow and its tasks (what staging read, where each
    segment starts, the test evaluation) to the CLI's ``log``, one line each; not Prefect's
    engine lines (task states, ...), and not the records marked ``extra={ECHO: False}``.
    Warnings reach the console through Prefect's handler already."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.log = log
        self.prefect_dir = _prefect_dir()  # once, not per record

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING or not getattr(record, ECHO, True):
            return
        if record.pathname.startswith(self.prefect_dir):
            return
        with contextlib.suppress(Exception):
            self.log(record.getMessage())


class _NoSignalCrash(logging.Filter):
    """Prefect logs a run that a signal stopped as crashed, at ERROR ("Crash detected!
    Execution was aborted by an interrupt signal", then its "Crashed" states): the command
    says that it was interrupted, and how to go on, itself. On the console only: the Prefect
    API still records them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "aborted by an interrupt signal" not in message and (
            "aborted by a termination signal" not in message
        )


@contextlib.contextmanager
def _quiet_signal_crashes() -> Iterator[None]:
    names = [
        n for n in logging.root.manager.loggerDict if n == "prefect" or n.startswith("prefect.")
    ]
    handlers = {
        h
        for logger in [logging.getLogger(), *map(logging.getLogger, names)]
        for h in logger.handlers
        if isinstance(h, logging.StreamHandler)
    }
    quiet = _NoSignalCrash()
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)


def _prefect_dir() -> str:
    import prefect

    return str(Path(prefect.__file__).parent)


@contextlib.contextmanager
def _echo(log: Callable[[str], None] | None) -> Iterator[None]:
    if log is None:
        yield
        return
    handler = _Echo(log)
    loggers = [logging.getLogger(n) for n in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def configured_api_url() -> str | None:
    """The Prefect API the user configured, read without importing Prefect (whose settings are
    fixed at import): ``PREFECT_API_URL`` in the environment, in the active profile
    (``$PREFECT_HOME/profiles.toml``), or in ``prefect.toml`` here. None: no server configured,
    so ``kgpipe train`` starts its own temporary one."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    home = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser()
    try:
        data = tomllib.loads(profiles.read_text())
        active = os.environ.get("PREFECT_PROFILE") or data.get("active", "ephemeral")
        url = data.get("profiles", {}).get(active, {}).get("PREFECT_API_URL")
        if url:
            return str(url)
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        pass
    try:
        url = tomllib.loads(Path("prefect.toml").read_text()).get("api", {}).get("url")
        return str(url) if url else None
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        return None


def _check_prefect_api() -> None:
    """A configured Prefect API that does not answer: one line, before any work (Prefect's
    client failed with three tracebacks of 114 lines once the flow had started)."""
    url = configured_api_url()
    problem = tcp_problem(url) if url else None
    if url and problem:
        raise RunError(
            f"cannot reach the Prefect API at {url} ({problem}; set by PREFECT_API_URL or the "
            "active Prefect profile): start that server, unset it to let kgpipe start its own, "
            "or train without Prefect: --no-prefect"
        )


def run(
    config: RunConfig,
    *,
    resume: bool,
    overwrite: bool,
    callbacks: Sequence[Callback],
    log: Callable[[str], None] | None = None,
    verbose: bool = False,
) -> tuple[str, dict[str, Any] | None]:
    """Run the ``train-kge`` flow for ``config`` (on a temporary local Prefect API server
    unless ``PREFECT_API_URL`` is set); returns the run folder's URL and its test results.
    ``log`` hears kgpipe's messages from the flow (Prefect's console lines are at WARNING
    unless ``verbose``)."""
    config = config.with_run_name()
    _check_prefect_api()
    # one writer per run folder: the lease is taken before Prefect starts, and under it bad
    # input stops with a plain message, before Prefect logs a task failure and before an
    # existing run folder would be replaced
    with run_lease(config, holder=f"kgpipe train (pid {os.getpid()})") as lease:
        # the graph it parses is kept for the flow's staging, in this process
        config = preflight(config, overwrite=overwrite, resume=resume, keep=True)
        check_tracking(config.tracking)  # a tracking server that does not answer: one line
        local_prefect_defaults()
        quiet_prefect_console(verbose)
        if not configured_api_url():
            # our own temporary server rather than Prefect's: one that a Ctrl-C does not reach
            # and that does not outlive this command (flows/server.py)
            os.environ["PREFECT_API_URL"] = TiedPrefectServer().start()
        if log is not None:
            log(f"training {config.run.name} through the Prefect flow train-kge")
        from flows.train import build_train_flow

        flow = build_train_flow(callbacks)
        # with verbose, Prefect's console prints kgpipe's lines itself: no echo as well
        try:
            with _echo(None if verbose else log), _quiet_signal_crashes():
                summary = flow(
                    config, resume=not overwrite, overwrite=overwrite, lease=lease.handle
                )
        finally:
            forget_parsed()  # a flow that failed before its staging: not kept past it
    store = run_store(config)
    # the results of this flow run: a resume that did not test leaves an earlier results.json
    tested = summary.get("results") is not None and store.exists(RESULTS)
    results = json.loads(store.read_text(RESULTS)) if tested else None
    return str(summary["run"]), results
