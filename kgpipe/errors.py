"""Errors that reach users as a clear message rather than a traceback.

Every error that is the user's to fix (bad input data, an invalid config, a missing run folder)
derives from :class:`KgpipeError`; the CLI prints its message and exits non-zero.
"""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "KgpipeError", "RunError"]


class KgpipeError(Exception):
    """Base class of errors whose message is meant for the user."""


class ConfigError(KgpipeError):
    """The configuration is invalid (unknown key, wrong type, violated constraint)."""


class DataError(KgpipeError):
    """Input data is unreadable or malformed.

    The message names the file and, where there is one, the line number and an excerpt.
    """

    def __init__(
        self, source: str, problem: str, *, line: int | None = None, excerpt: str | None = None
    ) -> None:
        self.source = source
        self.problem = problem
        self.line = line
        self.excerpt = excerpt
        where = f"{source}, line {line}" if line is not None else source
        msg = f"{where}: {problem}"
        if excerpt is not None:
            shown = excerpt if len(excerpt) <= 120 else excerpt[:117] + "..."
            msg += f"\n    {shown!r}"
        super().__init__(msg)


class RunError(KgpipeError):
    """A run folder is missing, incomplete, or would be overwritten."""


class Fenced(RunError):
    """This writer may no longer commit to the run folder (its lease was taken over, or its
    driver is gone); relaunching it cannot help."""


class Diverged(RunError):
    """Training's loss stopped being a finite number (the tables went to inf or NaN); the same
    config would diverge again, so it is not retried."""


class SearchStopped(RunError):
    """A hyperparameter search stopped because every recent trial failed (a cause they all
    share, such as unreadable data); its study is kept and can be resumed."""


class StorageError(KgpipeError):
    """An object store refused an operation (credentials) or stayed unreachable after retries."""


class StorageAccessDenied(StorageError):
    """The object store refused the credentials or the permission (no retry can help)."""


class StorageUnreachable(StorageError):
    """A run started against an object store whose endpoint does not answer (checked once per
    endpoint and process, before the first read or write, so that it fails in seconds)."""


class StorageFull(StorageError):
    """The run root's device or quota has no room left for a write; the message names the path,
    the bytes the write needed and the bytes free. Nothing half-written is left behind."""


class CheckpointError(KgpipeError):
    """No usable checkpoint, or a checkpoint that does not belong to this run."""
