"""Reading files from any fsspec URL, decompressed by extension: whole (:func:`read_bytes`, for
the line parser) or as a stream (:func:`opened`, for the columnar reader).

The line parser reads a graph into memory at once: this keeps checksums and line-numbered error
messages simple and is faster than streaming for the sizes it is used for.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import os
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any

from fsspec.core import url_to_fs

from kgpipe.errors import DataError, StorageAccessDenied, StorageError
from kgpipe.storage import RetryPolicy, read_url

__all__ = [
    "COMPRESSIONS",
    "Fallback",
    "decompress",
    "opened",
    "read_bytes",
    "reading_errors",
    "split_compression",
    "where_relative",
]

#: File-name suffix (lower case) -> compression name.
COMPRESSIONS: dict[str, str] = {
    ".gz": "gzip",
    ".bz2": "bz2",
    ".xz": "xz",
    ".zst": "zstd",
    ".zstd": "zstd",
}


def split_compression(url: str) -> tuple[str, str | None]:
    """Split a compression suffix off ``url``.

    Returns the URL without the suffix and the compression name (``"gzip"``, ``"bz2"``,
    ``"xz"`` or ``"zstd"``), or ``(url, None)`` for an uncompressed file name::

        >>> split_compression("x.tsv.gz")
        ('x.tsv', 'gzip')
    """
    lower = url.lower()
    for suffix, name in COMPRESSIONS.items():
        if lower.endswith(suffix):
            return url[: -len(suffix)], name
    return url, None


def _zstd_decompress(data: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise ImportError("install zstandard to read .zst files") from None
    dctx = zstandard.ZstdDecompressor()
    parts: list[bytes] = []
    rest = data
    try:
        while rest:  # one or more concatenated frames
            dobj = dctx.decompressobj()
            parts.append(dobj.decompress(rest))
            if not dobj.eof:
                raise ValueError("compressed data ended before the end of the frame (truncated)")
            rest = dobj.unused_data
    except zstandard.ZstdError as err:
        raise ValueError(str(err)) from None
    return b"".join(parts)


def _gzip_decompress(data: bytes) -> bytes:
    return gzip.decompress(data)


def _bz2_decompress(data: bytes) -> bytes:
    return bz2.decompress(data)


def _xz_decompress(data: bytes) -> bytes:
    return lzma.decompress(data)


_DECOMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": _gzip_decompress,
    "bz2": _bz2_decompress,
    "xz": _xz_decompress,
    "zstd": _zstd_decompress,
}


def decompress(data: bytes, compression: str | None, *, source: str) -> bytes:
    """Decompress ``data`` (``compression`` as returned by :func:`split_compression`).

    Corrupt or truncated input raises :class:`~kgpipe.errors.DataError` naming ``source``.
    """
    if compression is None:
        return data
    try:
        fn = _DECOMPRESSORS[compression]
    except KeyError:
        raise DataError(source, f"unknown compression {compression!r}") from None
    try:
        return fn(data)
    except ImportError as err:
        raise DataError(source, str(err)) from None
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as err:
        raise DataError(source, f"cannot decompress ({compression}): {_detail(err)}") from None


def _detail(err: BaseException) -> str:
    """A decompressor's error, in the same words whether the file was read whole or streamed
    (lzma and bz2 say "Compressed data ended ..." for one, "Compressed file ..." for the other)."""
    return (str(err) or type(err).__name__).replace(
        "Compressed file ended", "Compressed data ended"
    )


class Fallback(Exception):
    """A file has a line the columnar reader does not take as the line parser would
    (:mod:`kgpipe.data.columnar`): read it with the line parser."""


def where_relative(url: str) -> str:
    """For a relative local path: the full path it names (paths in a config are read from the
    current directory, not the config file's folder)."""
    if "://" in url or os.path.isabs(url):
        return ""
    return f" ({os.path.abspath(url)}: relative paths are read from the current directory)"


@contextlib.contextmanager
def reading_errors(url: str) -> Iterator[None]:
    """Faults of reading ``url`` as :class:`~kgpipe.errors.DataError` (missing, unreadable, denied);
    :class:`~kgpipe.errors.StorageError` (unreachable after the retries) passes through."""
    try:
        yield
    except StorageAccessDenied as err:  # wrong credentials: the input cannot be read, ever
        detail = "access denied" + str(err).partition("access denied")[2]
        raise DataError(url, f"cannot read: {detail}") from None
    except (StorageError, DataError, Fallback):  # unreachable after the retries: maybe later
        raise
    except FileNotFoundError:
        raise DataError(url, f"file not found{where_relative(url)}") from None
    except IsADirectoryError:
        raise DataError(url, "cannot read: it is a directory, not a file") from None
    except OSError as err:
        raise DataError(url, f"cannot read: {err}") from None
    except (ValueError, ImportError) as err:  # unknown protocol, missing fsspec backend
        raise DataError(url, f"cannot read: {err}") from None
    except Exception as err:  # back-end errors outside OSError (e.g. botocore: no credentials)
        raise DataError(url, f"cannot read: {type(err).__name__}: {err}") from None


def read_bytes(
    url: str, storage_options: dict[str, Any] | None = None, *, retry: RetryPolicy | None = None
) -> bytes:
    """Read a whole file from any fsspec URL and decompress it by its extension.

    ``url`` may be a local path, ``file://``, ``s3://``, ``memory://`` or any other URL fsspec
    understands; ``storage_options`` are passed to the filesystem, and transient object-store
    faults are retried by ``retry`` (:func:`kgpipe.storage.read_url`). Files ending in ``.gz``,
    ``.bz2``, ``.xz`` and ``.zst``/``.zstd`` are decompressed (the last needs the optional
    ``zstandard`` package).

    Raises :class:`~kgpipe.errors.DataError` when the file is missing, unreadable or corrupt, and
    :class:`~kgpipe.errors.StorageError` when the store stays unreachable.
    """
    with reading_errors(url):
        raw = read_url(url, storage_options, retry=retry)
    return decompress(raw, split_compression(url)[1], source=url)


class _Store:
    """A compressed file as read from its store, remembering the store's own read faults: a
    decompressor raises OSError too (gzip's BadGzipFile, bz2's "Invalid data stream"), and
    only the store's are worth a retry."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.fault: OSError | None = None

    def read(self, n: int = -1) -> bytes:
        try:
            data: bytes = self.raw.read(n)
        except OSError as err:
            self.fault = err
            raise
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class _Zstd(io.RawIOBase):
    """Zstandard frames decompressed as they are read, one after another, and a stream that
    ends inside a frame refused (``EOFError``): fsspec's reader (zstandard's ``stream_reader``)
    ended a truncated file quietly, and staging trained on the part before the cut."""

    def __init__(self, source: Any) -> None:
        import zstandard

        self._source, self._dctx = source, zstandard.ZstdDecompressor()
        self._frame: Any = None  # the frame being decompressed
        self._out, self._at, self._done = b"", 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at == len(self._out) and not self._done:
            # 8 KiB in: a triple file's few times that out, and never more than ~32,000 times
            # it (an RLE block of 4 bytes is 128 KiB out), 256 MiB for the most repetitive
            data = self._source.read(1 << 13)
            if not data:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("compressed data ended before the end of the frame (truncated)")
                self._done = True
                break
            parts = []
            while data:  # a chunk may end one frame and begin the next
                if self._frame is None or self._frame.eof:
                    self._frame = self._dctx.decompressobj()
                parts.append(self._frame.decompress(data))
                data = self._frame.unused_data if self._frame.eof else b""
            self._out, self._at = b"".join(parts), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = self._out[self._at : self._at + n]
        self._at += n
        return n


@contextlib.contextmanager
def opened(url: str, storage_options: dict[str, Any] | None) -> Iterator[IO[bytes]]:
    """The decompressed bytes of ``url``; read and decompression faults as :class:`DataError`."""
    compression = split_compression(url)[1]
    fs, path = url_to_fs(url, **(storage_options or {}))
    with fs.open(path, "rb") as raw:
        if compression is None:
            yield raw
            return
        from fsspec.compression import compr

        if compr.get(compression) is None:
            raise DataError(url, f"cannot decompress ({compression}): its package is not installed")
        store = _Store(raw)
        try:
            if compression == "zstd":  # buffered: it is iterated by line too
                stream: Any = io.BufferedReader(_Zstd(store), buffer_size=1 << 20)
            else:
                stream = compr[compression](store, mode="rb")
            yield stream
        except (EOFError, zlib.error, lzma.LZMAError) as err:
            raise DataError(url, f"cannot decompress ({compression}): {_detail(err)}") from None
        except OSError as err:  # the store's faults are retried or reported; else a bad stream
            if err is store.fault or isinstance(err, FileNotFoundError | PermissionError):
                raise
            raise DataError(url, f"cannot decompress ({compression}): {err}") from None
        except Exception as err:  # zstandard's ZstdError is not an OSError
            if type(err).__module__.split(".")[0] not in ("zstandard", "zstd"):
                raise
            raise DataError(url, f"cannot decompress ({compression}): {err}") from None
