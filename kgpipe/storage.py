"""One storage layer over fsspec URLs (local paths, ``file://``, ``s3://``, ``memory://``).

Writes go through :meth:`Store.write_bytes`, which on a local file system writes a temporary file
and renames it into place, so a reader never sees a half-written file; object stores make a PUT
visible only when it completes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import fsspec
from fsspec.core import url_to_fs

from kgpipe.checksums import file_checksum
from kgpipe.endpoints import check_reachable
from kgpipe.errors import StorageError, StorageFull
from kgpipe.retry import RetryPolicy, is_out_of_space, is_transient, retrying

__all__ = [
    "RetryPolicy",
    "Store",
    "check_reachable",
    "is_out_of_space",
    "is_transient",
    "join_url",
    "read_url",
    "retrying",
]

T = TypeVar("T")


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

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.url = url.rstrip("/") or url
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        try:
            self.fs, self.root = url_to_fs(self.url, **self.storage_options)
        except (ValueError, ImportError) as err:  # "Protocol not known", "install gcsfs"
            raise StorageError(f"{self.url}: cannot open this storage URL ({err})") from None
        self.local = "file" in _protocols(self.fs)

    def _do(self, what: str, rel: str, fn: Callable[[], T]) -> T:
        if self.local:
            return fn()
        return retrying(fn, what=f"{what} {self.url_of(rel)}", policy=self.retry)

    def path(self, rel: str) -> str:
        return join_url(self.root, rel) if rel else self.root

    def url_of(self, rel: str) -> str:
        return join_url(self.url, rel)

    def exists(self, rel: str = "") -> bool:
        return self._do("stat", rel, lambda: bool(self.fs.exists(self.path(rel))))

    def read_bytes(self, rel: str) -> bytes:
        return self._do("read", rel, lambda: bytes(self.fs.cat_file(self.path(rel))))

    def list(self, rel: str = "") -> list[str]:
        """Names (not paths) directly under ``rel``; empty when it does not exist."""

        def ls() -> list[str]:
            path = self.path(rel)
            self.fs.invalidate_cache(path)
            try:
                entries = self.fs.ls(path, detail=False)
            except FileNotFoundError:
                return []
            return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)

        return self._do("list", rel, ls)

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8")

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_text(rel))

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``data`` whole or not at all: on a local disk a temporary file renamed into
        place (removed again if the write fails), on an object store one PUT. A full device or
        quota raises :class:`StorageFull` naming the path and the bytes."""
        path = self.path(rel)
        parent = path.rsplit("/", 1)[0]
        try:
            if self.local:
                self._write_local(path, parent, data)
            else:

                def put() -> None:
                    self.fs.makedirs(parent, exist_ok=True)
                    self.fs.pipe_file(path, data)

                self._do("write", rel, put)
        except (OSError, StorageError) as err:
            if is_out_of_space(err):
                raise StorageFull(self._full_message(rel, parent, len(data))) from None
            raise

    def write_produced(
        self, rel: str, produce: Callable[[str], None], *, size: int, checksum: bool = True
    ) -> tuple[str, int]:
        """Write the file that ``produce(path)`` writes at a local ``path``, whole or not at all,
        and return its checksum (:func:`~kgpipe.checksums.file_checksum`; ``""`` without
        ``checksum``) and size, so that a large file (a checkpoint) never sits in memory.
        Local: a temporary file beside ``rel``, fsynced and renamed into place; an object store:
        a temporary file in the system's temp folder, uploaded (in parts) with retries, removed.
        ``size``: the least bytes the file has (shorter is an error; full-disk messages say it)."""
        path = self.path(rel)
        parent = path.rsplit("/", 1)[0]
        try:
            if self.local:
                self.fs.makedirs(parent, exist_ok=True)
                tmp = f"{path}.tmp-{uuid.uuid4().hex}"
                return _produce(tmp, produce, size, final=path, checksum=checksum)
        except (OSError, StorageError) as err:
            if is_out_of_space(err):
                raise StorageFull(self._full_message(rel, parent, size)) from None
            raise
        with tempfile.TemporaryDirectory(prefix="kgpipe-upload-") as folder:
            tmp = os.path.join(folder, "data")
            try:
                digest = _produce(tmp, produce, size, checksum=checksum)
            except OSError as err:
                if is_out_of_space(err):
                    raise StorageFull(
                        f"{self.url_of(rel)}: no space left in the temporary folder {folder} for "
                        f"the upload (writing {size:,} bytes; point TMPDIR at a larger disk)"
                    ) from None
                raise

            def put() -> None:
                self.fs.makedirs(parent, exist_ok=True)
                self.fs.put_file(tmp, path)

            try:
                self._do("write", rel, put)
            except (OSError, StorageError) as err:
                if is_out_of_space(err):
                    raise StorageFull(self._full_message(rel, parent, size)) from None
                raise
            return digest

    @contextlib.contextmanager
    def local_copy(self, rel: str) -> Iterator[str]:
        """A local path of the file at ``rel`` while the context lasts: the file itself on a
        local disk; from an object store a download (with retries) to the system's temp
        folder, removed after. Nothing is read into memory."""
        if self.local:
            if not os.path.isfile(self.path(rel)):
                raise FileNotFoundError(self.path(rel))
            yield self.path(rel)
            return
        with tempfile.TemporaryDirectory(prefix="kgpipe-download-") as folder:
            tmp = os.path.join(folder, "data")
            try:
                self._do("read", rel, lambda: self.fs.get_file(self.path(rel), tmp))
            except OSError as err:
                if is_out_of_space(err):
                    raise StorageFull(
                        f"{self.url_of(rel)}: no space left in the temporary folder {folder} for "
                        "the download (point TMPDIR at a larger disk)"
                    ) from None
                raise
            yield tmp

    def _write_local(self, path: str, parent: str, data: bytes) -> None:
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _full_message(self, rel: str, parent: str, size: int) -> str:
        where = f"{self.url_of(rel)}: no space left"
        if not self.local:
            return f"{where} in the bucket or its quota (writing {size:,} bytes)"
        try:
            free = f"; {shutil.disk_usage(parent).free:,} bytes free there"
        except OSError:
            free = ""
        return f"{where} on the device (writing {size:,} bytes{free})"

    def create(self, rel: str, data: bytes) -> None:
        """Write ``data`` at ``rel`` only if nothing is there: of two processes that race to
        create the same file, exactly one succeeds and the other gets ``FileExistsError``. Local:
        a complete temporary file hard-linked into place (``link`` fails if the name exists); an
        object store: a conditional PUT (``If-None-Match: *``)."""
        path = self.path(rel)
        parent = path.rsplit("/", 1)[0]
        if self.local:
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            try:
                self._write_local(tmp, parent, data)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise
                except OSError as err:  # a file system without hard links: O_EXCL instead
                    if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                        raise
                    with open(path, "xb") as f:
                        f.write(data)
            except OSError as err:
                if is_out_of_space(err):
                    raise StorageFull(self._full_message(rel, parent, len(data))) from None
                raise
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return

        def put() -> None:
            try:
                self.fs.pipe_file(path, data, mode="create")
            except OSError as err:
                if _precondition_failed(err):  # s3fs says EINVAL; the store said 412
                    raise FileExistsError(path) from None
                raise

        self._do("create", rel, put)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode("utf-8"))

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_text(rel, json.dumps(obj, indent=2, sort_keys=False) + "\n")

    def open(self, rel: str, mode: str = "rb") -> Any:
        return fsspec.open(self.url_of(rel), mode, **self.storage_options).open()

    def remove_partial_writes(self) -> tuple[str, ...]:
        """Remove the temporary files of local writes that a killed process left behind (a
        failed write removes its own); object stores have none. Only the run folder's one
        writer may call this. Returns what was removed."""
        if not self.local:
            return ()
        removed: tuple[str, ...] = ()
        for path in Path(self.root).rglob("*.tmp-*"):
            if path.parent.name == "lease":  # a contender's create may be under way there
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed += (str(path),)
        return removed

    def missing_folders(self) -> tuple[str, ...]:
        """This store's local folder and those of its parents that do not exist yet, deepest
        first (what a first write will create); empty on object stores."""
        if not self.local:
            return ()
        missing: tuple[str, ...] = ()
        folder = Path(self.root).absolute()
        while not folder.exists() and folder != folder.parent:
            missing += (str(folder),)
            folder = folder.parent
        return missing

    def remove_empty_folders(self, rels: Sequence[str], *, also: Sequence[str] = ()) -> None:
        """Remove the local folders ``rels`` (in order), then the paths ``also``, where they
        are empty; a folder that is not (someone wrote into it meanwhile) stays. Object stores
        have no empty folders."""
        if not self.local:
            return
        for path in [self.path(rel) for rel in rels] + list(also):
            with contextlib.suppress(OSError):
                os.rmdir(path)

    def remove(self, rel: str = "", *, recursive: bool = True) -> None:
        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):  # a retry after a delete that landed
                self.fs.rm(self.path(rel), recursive=recursive)  # but whose answer was lost

        if self.exists(rel):
            self._do("delete", rel, rm)


def read_url(
    url: str, storage_options: dict[str, Any] | None = None, *, retry: RetryPolicy | None = None
) -> bytes:
    """The bytes of one file at any fsspec URL, with the retries of a :class:`Store` (input files
    outside a run folder: the graph's splits, a config), after :func:`check_reachable`."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    if "file" in _protocols(fs):
        return bytes(fs.cat_file(path))
    check_reachable(fs, url)
    return retrying(
        lambda: bytes(fs.cat_file(path)), what=f"read {url}", policy=retry or RetryPolicy()
    )


def _produce(
    tmp: str, produce: Callable[[str], None], size: int, *, final: str = "", checksum: bool
) -> tuple[str, int]:
    """``produce(tmp)``, checked (at least ``size`` bytes), fsynced, hashed (``checksum``);
    renamed to ``final`` when given. A failure removes ``tmp``."""
    try:
        try:
            produce(tmp)
        except OSError:
            raise
        except Exception as err:  # a writer that wraps the OS error (safetensors' Rust one)
            text = str(err)
            if "os error 28" in text or "No space left" in text:
                raise OSError(errno.ENOSPC, text) from None
            if "os error 122" in text or "quota exceeded" in text:
                raise OSError(errno.EDQUOT, text) from None
            raise
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if checksum:
            digest, written = file_checksum(tmp)
        else:
            digest, written = "", os.stat(tmp).st_size
        if written < size:
            raise OSError(errno.EIO, f"{tmp}: {written:,} bytes written, {size:,} expected")
        if final:
            os.replace(tmp, final)
        return digest, written
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _precondition_failed(err: BaseException) -> bool:
    """Whether ``err`` (or what it wraps) is an object store's 412 to a conditional write."""
    seen: BaseException | None = err
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in (
            "PreconditionFailed",
            "412",
        ):
            return True
        if "pre-conditions you specified did not hold" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
