"""One storage layer over fsspec URLs (local paths, ``file://``, ``s3://``, ``memory://``).

Writes go through :meth:`Store.write_bytes`, which on a local file system writes a temporary file
and renames it into place, so a reader never sees a half-written file; object stores make a PUT
visible only when it completes.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import fsspec
from fsspec.core import url_to_fs

__all__ = ["Store", "join_url"]


def join_url(base: str, *parts: str) -> str:
    """Join URL path components with ``/`` (no normalisation of the scheme)."""
    out = base.rstrip("/")
    for p in parts:
        p = p.strip("/")
        if p:
            out = f"{out}/{p}"
    return out


class Store:
    """A folder at a URL: relative reads and writes, listing, existence checks."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/") or url
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = url_to_fs(self.url, **self.storage_options)
        self.local = "file" in _protocols(self.fs)

    def path(self, rel: str) -> str:
        return join_url(self.root, rel) if rel else self.root

    def url_of(self, rel: str) -> str:
        return join_url(self.url, rel)

    def exists(self, rel: str = "") -> bool:
        return bool(self.fs.exists(self.path(rel)))

    def read_bytes(self, rel: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(rel)))

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8")

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_text(rel))

    def write_bytes(self, rel: str, data: bytes) -> None:
        path = self.path(rel)
        parent = path.rsplit("/", 1)[0]
        if self.local:
            self.fs.makedirs(parent, exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(path, data)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode("utf-8"))

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_text(rel, json.dumps(obj, indent=2, sort_keys=False) + "\n")

    def open(self, rel: str, mode: str = "rb") -> Any:
        return fsspec.open(self.url_of(rel), mode, **self.storage_options).open()

    def remove(self, rel: str = "", *, recursive: bool = True) -> None:
        if self.exists(rel):
            self.fs.rm(self.path(rel), recursive=recursive)


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
