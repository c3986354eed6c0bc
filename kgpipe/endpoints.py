"""Failing fast when a run starts against an object store that does not answer."""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlsplit

from kgpipe.errors import StorageUnreachable

__all__ = ["check_reachable", "tcp_problem"]

# object-store endpoints this process has reached once: their faults are a run's faults from then
# on, retried with the long backoff
_REACHED: set[str] = set()


def _endpoint(fs: Any) -> str | None:
    """The object-store endpoint URL ``fs`` talks to, where one is configured (S3-compatible
    stores: ``client_kwargs.endpoint_url``, ``endpoint_url``, or ``AWS_ENDPOINT_URL[_S3]``)."""
    if not {"s3", "s3a"} & _protocols(fs):
        return None
    options = getattr(fs, "storage_options", None) or {}
    client = options.get("client_kwargs") or {}
    found = (
        client.get("endpoint_url")
        or options.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    return str(found) if found else None


def tcp_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """Why one TCP connection to the host of ``url`` (``http(s)://host[:port]``, or
    ``host:port``) fails within ``timeout_s``: "connection refused", "no answer in 5 s",
    "unknown host h", ...; None when it connects."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or "localhost"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((host, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer in {timeout_s:g} s"
    except socket.gaierror:
        return f"unknown host {host}"
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def check_reachable(fs: Any, url: str, *, timeout_s: float = 5.0) -> None:
    """Fail fast when a run starts against an object store that cannot be reached: one TCP
    connection to the configured endpoint (within ``timeout_s``) instead of minutes of retries
    of a refused connection (botocore's own retries inside each of ours: 82 s measured). Once
    reached, an endpoint's later faults are retried with the full backoff (:func:`retrying`).
    Stores without a configured endpoint (AWS itself, local files) are not probed.

    Raises :class:`~kgpipe.errors.StorageUnreachable` naming the endpoint and the reason."""
    endpoint = _endpoint(fs)
    if endpoint is None or endpoint in _REACHED:
        return
    reason = tcp_problem(endpoint, timeout_s)
    if reason is None:
        _REACHED.add(endpoint)
        return
    raise StorageUnreachable(
        f"{url}: cannot reach the object store at {endpoint} ({reason}); is it running, and "
        "is the endpoint right?"
    )


def _protocols(fs: Any) -> set[str]:
    proto = fs.protocol
    return {proto} if isinstance(proto, str) else set(proto)
