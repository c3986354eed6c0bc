"""MLflow, imported only when a config tracks to it: a client whose calls are bounded in time and
whose failures are one line, and what kgpipe logs through it (params, epochs, final metrics).

MLflow's HTTP client retries a refused connection with exponential backoff for minutes by
default; our calls run with two retries and a 15 s request timeout instead (unless the
environment sets ``MLFLOW_HTTP_REQUEST_*`` itself), after a TCP probe of the server that fails
in seconds. Only the process that drives training talks to MLflow: ranks and Dask workers
never import it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from kgpipe.config import RunConfig, TrackingConfig, redact_secrets
from kgpipe.config.base import hide_password
from kgpipe.endpoints import tcp_problem
from kgpipe.errors import ConfigError, KgpipeError

__all__ = [
    "MLFLOW_MISSING",
    "Mlflow",
    "TrackingError",
    "connect",
    "epoch_metrics",
    "experiment_name",
    "flat_params",
    "metric_key",
    "shown_uri",
    "text_params",
    "within",
]

MLFLOW_MISSING = "tracking.backend=mlflow needs the mlflow package: pip install 'kgpipe[mlflow]'"
#: the metric every epoch has: its history says which epochs a run has logged
MARK = "loss"
# what our MLflow calls run with (a value set in the environment wins)
_HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # no "View run at" lines on our stdout
}
_REACHED: set[str] = set()  # tracking servers this process has reached once


class TrackingError(KgpipeError):
    """The tracking server cannot be reached, or refused a request (one line)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code  # MLflow's error code (RESOURCE_DOES_NOT_EXIST, ...), if it gave one


shown_uri = hide_password  # ``uri`` without a password in it (for messages and records)


class _Bounds:
    """Who holds the bounds now (threads may overlap), and which variables they added."""

    lock = threading.Lock()
    users = 0
    added: tuple[str, ...] = ()


@contextlib.contextmanager
def _bounded() -> Iterator[None]:
    """MLflow's HTTP retries and timeout bounded while our calls run (the variables the
    environment does not set are set for that time)."""
    with _Bounds.lock:
        if _Bounds.users == 0:
            _Bounds.added = tuple(k for k in _HTTP_BOUNDS if k not in os.environ)
            os.environ.update({k: _HTTP_BOUNDS[k] for k in _Bounds.added})
        _Bounds.users += 1
    try:
        yield
    finally:
        with _Bounds.lock:
            _Bounds.users -= 1
            if _Bounds.users == 0:
                for k in _Bounds.added:
                    os.environ.pop(k, None)


def _probe(uri: str, timeout_s: float = 5.0) -> None:
    """One TCP connection to an http(s) tracking server: a refused or silent server fails in
    seconds, before any MLflow retry (checked once per server and process)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or uri in _REACHED:
        return
    if getproxies().get(parts.scheme) and not proxy_bypass(parts.hostname or ""):
        return  # MLflow's requests go through the proxy: a direct connection proves nothing
    reason = tcp_problem(uri, timeout_s)
    if reason is None:
        _REACHED.add(uri)
        return
    raise TrackingError(
        f"tracking.uri={shown_uri(uri)}: cannot reach the MLflow tracking server ({reason}); "
        "is `mlflow server` running there, and is the URI right?"
    )


def _unopened(uri: str, err: BaseException) -> str:
    if urlsplit(uri).scheme in ("file", ""):
        why = (
            "MLflow 3 keeps file:// stores in maintenance mode and opens them only with "
            "MLFLOW_ALLOW_FILE_STORE=true; a local store is sqlite:///ABSOLUTE/PATH/mlflow.db"
        )
    else:
        why = _reason(err)
    return f"tracking.uri={shown_uri(uri)}: MLflow cannot open this tracking store ({why})"


def _reason(err: BaseException) -> str:
    """MLflow's error as a short phrase (its messages embed whole responses and URLs)."""
    text = " ".join(str(err).split())
    for pattern, phrase in (
        (r"Connection refused", "connection refused"),
        (r"Read timed out|ConnectTimeout|timed out", "the server did not answer in time"),
        (r"Name or service not known|nodename nor servname", "unknown host"),
        (r"Max retries exceeded|ConnectionError|RemoteDisconnected", "the connection failed"),
    ):
        if re.search(pattern, text):
            return phrase
    return text if len(text) <= 300 else text[:297] + "..."


class Mlflow:
    """An ``MlflowClient`` of ``tracking.uri`` (explicit run ids, none of MLflow's global
    state): every method of the client, called with bounded retries, raising
    :class:`TrackingError` (one line, MLflow's error code kept) instead of MLflow's errors."""

    def __init__(self, tracking: TrackingConfig) -> None:
        if tracking.backend != "mlflow" or not tracking.uri:
            raise ConfigError("experiment tracking needs tracking.backend=mlflow and tracking.uri")
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError(MLFLOW_MISSING) from None
        self.uri = tracking.uri
        self.tracking = tracking
        _probe(self.uri)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
        except Exception as err:  # a store MLflow will not open: one line, not its traceback
            raise TrackingError(_unopened(self.uri, err)) from None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        client = self.__dict__.get("client")
        if client is None or name.startswith("_"):  # not a client call (copy, pickle, ...)
            raise AttributeError(name)
        method = getattr(client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with _bounded():
                try:
                    return method(*args, **kwargs)
                except Exception as err:
                    code = getattr(err, "error_code", None)
                    raise TrackingError(
                        f"MLflow at {shown_uri(self.uri)}: {name} failed: {_reason(err)}",
                        code=str(code) if code else None,
                    ) from None

        return call

    def experiment_id(self, name: str) -> str:
        """The id of the experiment ``name``, created if missing."""
        found = self.get_experiment_by_name(name)
        if found is None:
            try:
                return str(self.create_experiment(name))
            except TrackingError as err:
                if err.code != "RESOURCE_ALREADY_EXISTS":
                    raise
                found = self.get_experiment_by_name(name)  # created meanwhile, or deleted
        if found is None or found.lifecycle_stage == "deleted":
            raise TrackingError(
                f"MLflow at {shown_uri(self.uri)}: the experiment {name!r} is deleted; restore "
                "it (mlflow experiments restore) or set tracking.experiment to another name"
            )
        return str(found.experiment_id)

    def live_run(self, run_id: str) -> Any | None:
        """The run ``run_id`` if it exists and is not deleted, else None."""
        try:
            run = self.get_run(run_id)
        except TrackingError as err:
            if err.code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise
        return run if run.info.lifecycle_stage == "active" else None

    def logged_steps(self, run_id: str, key: str = MARK) -> set[int]:
        """The steps at which ``run_id`` has a value of metric ``key``."""
        return {int(m.step) for m in self.get_metric_history(run_id, key)}

    def last_epoch(self, run_id: str) -> int:
        """The last epoch ``run_id`` has logged (0: none)."""
        return max(self.logged_steps(run_id), default=0)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Set (or overwrite) ``tags`` on ``run_id``."""
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:8000]) for k, v in tags.items()]
        for i in range(0, len(items), 100):  # MLflow takes 100 tags per batch
            self.log_batch(run_id, tags=items[i : i + 100])

    def log_params(
        self, run_id: str, params: Mapping[str, str], existing: Mapping[str, str]
    ) -> None:
        """Log the ``params`` that ``run_id`` does not have yet (MLflow's params cannot change:
        a value that differs from the logged one is kept in the tag ``kgpipe.changed_params``)."""
        from mlflow.entities import Param

        new = [Param(k, v) for k, v in params.items() if k not in existing]
        changed = {k: v for k, v in params.items() if k in existing and existing[k] != v}
        for i in range(0, len(new), 100):  # MLflow takes 100 params per batch
            self.log_batch(run_id, params=new[i : i + 100])
        if changed:
            self.set_tags(run_id, {"kgpipe.changed_params": json.dumps(changed, sort_keys=True)})

    def log_epochs(self, run_id: str, rows: Sequence[Mapping[str, Any]], *, after: int) -> int:
        """Log the epochs of ``rows`` after epoch ``after`` (step = epoch; each once, in
        order); returns the last epoch logged (``after`` if none)."""
        from mlflow.entities import Metric

        last = after
        batch: list[Metric] = []
        now = int(time.time() * 1000)
        for row in sorted(rows, key=lambda r: int(r["epoch"])):
            epoch = int(row["epoch"])
            if epoch <= last:
                continue
            values = epoch_metrics(row)
            if len(batch) + len(values) > 1000:  # MLflow takes 1000 metrics per batch
                self.log_batch(run_id, metrics=batch)
                batch = []
            batch += [Metric(k, v, now, epoch) for k, v in values.items()]
            last = epoch
        if batch:
            self.log_batch(run_id, metrics=batch)
        return last

    def log_metrics(self, run_id: str, metrics: Mapping[str, Any], *, step: int) -> None:
        """Log the numeric ``metrics`` at ``step``, leaving out those already logged there (a
        finished run that is finished again)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = {metric_key(k): v for k, v in metrics.items() if _number(v) is not None}
        batch = [
            Metric(k, float(v), now, step)
            for k, v in values.items()
            if step not in self.logged_steps(run_id, k)
        ]
        if batch:
            self.log_batch(run_id, metrics=batch)


def connect(tracking: TrackingConfig) -> Mlflow:
    """The MLflow client of ``tracking`` (backend ``mlflow``); raises a one-line
    :class:`~kgpipe.errors.KgpipeError` when the mlflow package is missing or the server does
    not answer."""
    return Mlflow(tracking)


def experiment_name(tracking: TrackingConfig, config: RunConfig | None = None) -> str:
    """``tracking.experiment``, else the run's data set, else ``kgpipe``."""
    if tracking.experiment:
        return tracking.experiment
    return (config.data.dataset if config is not None else None) or "kgpipe"


def metric_key(name: str) -> str:
    """A kgpipe metric name as MLflow accepts it (``valid_hits@10`` -> ``valid_hits_at_10``)."""
    return re.sub(r"[^\w./\- ]", "_", name.replace("@", "_at_"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def epoch_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The numeric, finite entries of an epoch record but its number (loss, lr, seconds,
    ``valid_*``, ...), under MLflow's names."""
    out: dict[str, float] = {}
    for key, value in row.items():
        number = _number(value)
        if key != "epoch" and number is not None:
            out[metric_key(key)] = number
    return out


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {} if isinstance(node, dict) else {prefix[:-1]: node}


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:6000]  # MLflow's limit of a param value


def text_params(params: Mapping[str, Any]) -> dict[str, str]:
    """``params`` as MLflow params: names it accepts, values as text (JSON but for strings)."""
    return {metric_key(k): _text(v) for k, v in params.items()}


def flat_params(config: RunConfig, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The resolved config as MLflow params: dotted keys (``training.lr``), credentials
    redacted, without the ``tracking`` section; ``extra`` added (a trial's sampled values)."""
    data = redact_secrets(config)
    data.pop("tracking", None)
    return {**text_params(_flat(data)), **text_params(extra or {})}


def within(call: Callable[[], None], wait_s: float) -> bool:
    """Run ``call`` in a daemon thread and wait for it at most ``wait_s``: whether it ended.
    For a process on its way out (Ctrl-C, SIGTERM), so that a tracking server that stopped
    answering does not hold the exit for MLflow's retries."""
    thread = threading.Thread(target=call, name="kgpipe-mlflow-end", daemon=True)
    thread.start()
    thread.join(wait_s)
    return not thread.is_alive()
