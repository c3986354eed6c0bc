"""The graph a pre-flight check parsed, kept for the staging that follows it in this process.

``kgpipe train`` checks the input before Prefect starts (:func:`~kgpipe.runs.stage.preflight`:
every input error is one line, before a task fails) and the flow then stages it
(:func:`~kgpipe.runs.stage.prepare_run`): the same files parsed twice, which on a graph of 100M
lines is minutes and a second peak of the reader's memory. A pre-flight check asked to keep
its result leaves it here; the staging takes it (once) when its data config is the same and
every input file still has the size and version fsspec reports (modification time and inode,
or the object store's ``LastModified``, ``ETag`` and version: all that are there) it had
before the check read it; otherwise the files are read again.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

from fsspec.core import url_to_fs

from kgpipe.config import DataConfig
from kgpipe.data.dataset import TripleDataset
from kgpipe.data.reading import sources

__all__ = ["file_versions", "forget_parsed", "keep_parsed", "take_parsed"]

#: what fsspec's ``info`` may say of a file's version (every one present is compared)
_VERSION_KEYS = (
    "mtime",
    "ino",
    "created",
    "LastModified",
    "ETag",
    "VersionId",
    "last_modified",
    "etag",
    "generation",
)


@dataclass(frozen=True)
class _Kept:
    key: str
    versions: tuple[tuple[str, Any, str], ...]
    dataset: TripleDataset


_kept: _Kept | None = None
_lock = threading.Lock()


def file_versions(data: DataConfig) -> tuple[tuple[str, Any, str], ...] | None:
    """``(url, size, version)`` of every input file, or None when one cannot be told (then
    nothing is reused)."""
    out = []
    files = [(src.url, src.storage_options) for src in sources(data)]
    given = data.candidates
    for split in (given.valid, given.test) if given is not None else ():
        if split is not None:  # the candidate files are input too
            files += [(split.head, data.storage_options), (split.tail, data.storage_options)]
    for url, options in files:
        try:
            fs, path = url_to_fs(url, **(options or {}))
            with contextlib.suppress(Exception):
                fs.invalidate_cache(path)  # not a listing cached before the file changed
            info = fs.info(path)
        except Exception:  # best effort: the files are then read again
            return None
        version = {k: str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None}
        if not version:
            return None
        out.append((url, info.get("size"), repr(sorted(version.items()))))
    return tuple(out)


def keep_parsed(
    data: DataConfig, versions: tuple[tuple[str, Any, str], ...] | None, dataset: TripleDataset
) -> None:
    """Keep ``dataset`` (parsed from ``data`` whose files had ``versions`` before the read)."""
    global _kept
    with _lock:
        _kept = _Kept(data.model_dump_json(), versions, dataset) if versions else None


def forget_parsed() -> None:
    """Drop what a pre-flight check kept (a flow that failed before its staging took it)."""
    global _kept
    with _lock:
        _kept = None


def take_parsed(data: DataConfig) -> TripleDataset | None:
    """The kept dataset of ``data`` when its files have not changed since (it is no longer
    kept either way)."""
    global _kept
    with _lock:
        kept, _kept = _kept, None
    if kept is None or kept.key != data.model_dump_json():
        return None
    return kept.dataset if file_versions(data) == kept.versions else None
