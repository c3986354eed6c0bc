"""Retries of transient storage faults, and how to tell them from permanent ones (a missing
object, refused credentials, a full disk or bucket)."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kgpipe.errors import StorageAccessDenied, StorageError

__all__ = ["RetryPolicy", "is_out_of_space", "is_transient", "retrying"]

log = logging.getLogger("kgpipe.storage")

T = TypeVar("T")

# Errors that no retry can fix: missing objects, refused credentials, bad arguments.
_PERMANENT = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    FileExistsError,
    ValueError,
    TypeError,
    KeyError,
)
_PERMANENT_NAMES = {"NoCredentialsError", "PartialCredentialsError", "ParamValidationError"}
# the client's own set-up (a mistyped AWS_PROFILE, no region): not the store's passing fault
_SETUP_NAMES = {"ProfileNotFound", "NoRegionError", "InvalidRegionError", "UnknownServiceError"}
# requests an object store refused for good, by its error code (s3fs keeps the ClientError as
# the cause of the OSError it raises: EINVAL for most, also for passing ones such as
# IncompleteBody or BadDigest, so the code decides); NotImplemented is ENOSYS
_PERMANENT_CODES = {
    "InvalidBucketName", "InvalidArgument", "MalformedXML", "NotImplemented", "InvalidRequest",
    "InvalidURI", "KeyTooLongError", "MethodNotAllowed", "InvalidStorageClass",
    "PermanentRedirect", "AuthorizationHeaderMalformed", "InvalidLocationConstraint",
}  # fmt: skip
_PERMANENT_ERRNOS = {errno.ENOSYS, errno.EMSGSIZE, errno.ENOTEMPTY}


def _store_code(err: BaseException) -> str | None:
    """The object store's error code behind ``err`` (its own, or its causes'), if any."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code"):
            return str(response["Error"]["Code"])
        seen = seen.__cause__ or seen.__context__
    return None


# what object stores answer when a bucket's quota or the servers' disks are full
_OUT_OF_SPACE_CODES = {
    "QuotaExceeded",
    "InsufficientStorage",
    "XMinioStorageFull",
    "EntityTooLarge",
}


def is_out_of_space(err: BaseException) -> bool:
    """Whether ``err`` says the device or the bucket's quota is full (no retry can help soon)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    response = getattr(err, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in _OUT_OF_SPACE_CODES or any(c in str(err) for c in _OUT_OF_SPACE_CODES)


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` looks like a passing object-store/network fault worth retrying."""
    if isinstance(err, _PERMANENT) or type(err).__name__ in _PERMANENT_NAMES | _SETUP_NAMES:
        return False
    if isinstance(err, OSError) and err.errno in _PERMANENT_ERRNOS:
        return False
    if _store_code(err) in _PERMANENT_CODES:
        return False
    if is_out_of_space(err):
        return False
    if isinstance(err, OSError | ConnectionError | TimeoutError):
        return True
    module = type(err).__module__
    return module.startswith(("botocore", "aiobotocore", "aiohttp", "urllib3", "requests"))


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of transient storage errors: ``retries`` more attempts, delays doubling from
    ``backoff_s`` up to ``max_backoff_s``."""

    retries: int = 6
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0

    def delays(self) -> list[float]:
        return [min(self.max_backoff_s, self.backoff_s * 2**i) for i in range(self.retries)]


def retrying(fn: Callable[[], T], *, what: str, policy: RetryPolicy) -> T:
    """Call ``fn``; on transient errors retry with backoff, then raise :class:`StorageError`."""
    delays = policy.delays()
    for attempt in range(len(delays) + 1):
        try:
            return fn()
        except Exception as err:
            if not is_transient(err):
                if isinstance(err, PermissionError):
                    raise StorageAccessDenied(f"{what}: access denied ({_brief(err)})") from None
                if type(err).__name__ in _SETUP_NAMES:
                    raise StorageError(f"{what}: {_brief(err)}") from None
                if type(err).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
                    raise StorageAccessDenied(
                        f"{what}: no credentials ({_brief(err)}); give them in storage_options "
                        "or the AWS_* environment variables"
                    ) from None
                raise
            if attempt == len(delays):
                raise StorageError(
                    f"{what}: failed after {attempt + 1} attempts ({_brief(err)})"
                ) from None
            log.warning(
                "%s: %s; retry %d/%d in %.1f s",
                what, _brief(err), attempt + 1, len(delays), delays[attempt],
            )  # fmt: skip
            time.sleep(delays[attempt])
    raise AssertionError("unreachable")


def _brief(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
