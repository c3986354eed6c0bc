"""One copy of the staged training triples per machine, for the ranks of a gang that share it.

Every rank of a step-synchronised gang draws the same global batch, so each one holds all the
training triples (12 bytes a triple as ``int32``). Ranks on one machine (the workers of a
LocalCluster, the GPUs of one host) would hold one copy each. :func:`open_shared` instead has
the first of them write the triples once, checksum-verified shard by shard as
:func:`~kgpipe.data.shards.read_shards` reads them, into a file in the machine's temp folder
(``TMPDIR``, folder ``kgpipe-triples``), and every rank maps that file copy-on-write: its pages
are the page cache's, held once for the machine however many ranks read them (and, being a
file's, dropped under memory pressure and read again, where private copies would need swap).

The file is named by a digest of the shard manifest (the shards' checksums), so a run on the
same staged data reuses it and a run on other data never does. Two ``flock`` files beside it
guard it: ``.build``, held exclusively for a moment by whoever writes, maps or removes the file,
and ``.use``, held shared by every rank that maps it, for as long as it trains:

- opening takes ``.build``, then ``.use`` shared, writes the file if it is not there (to a
  temporary name, then renamed: a file under the final name is complete), maps it, and lets
  ``.build`` go;
- closing lets ``.use`` go, takes ``.build``, and then ``.use`` exclusively without waiting:
  granted, no rank of any run maps the file any more, and it is removed with its lock files.
  A rank that dies releases its locks with its process; what it leaves behind is removed by the
  next rank on that machine that writes a file, which removes every entry nobody uses (and the
  temporary files of writers that are gone).

A race between a closing rank and an opening one can at worst leave two copies for a while,
never a wrong or half-written one. Dask's ``memory_limit`` counts a worker's resident pages,
mapped file pages included, so it still sees one copy per worker; the machine holds one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import torch
from torch import Tensor

from kgpipe.data.shards import ShardManifest
from kgpipe.errors import RunError
from kgpipe.storage import Store

__all__ = ["SharedTriples", "open_shared", "shared_folder"]

log = logging.getLogger(__name__)

_I32 = np.iinfo(np.int32)
_SPARE = 256 << 20  # left free on the temp folder's disk besides the file


def shared_folder() -> Path:
    """Where the machine's shared triples live: ``$TMPDIR/kgpipe-triples``."""
    return Path(tempfile.gettempdir()) / "kgpipe-triples"


def _key(manifest: ShardManifest, wide: bool) -> str:
    h = hashlib.sha256()
    for count, digest in zip(manifest.counts, manifest.sha256, strict=True):
        h.update(f"{count}\t{digest}\n".encode())
    h.update(b"int64" if wide else b"int32")
    return h.hexdigest()[:32]


@dataclass
class SharedTriples:
    """The mapped triples (:attr:`tensor`) and the shared lock that keeps the file; call
    :meth:`close` when the rank is done with them (the tensor stays readable: the mapping
    outlives the file's name)."""

    tensor: Tensor
    data: Path
    _use: IO[bytes] | None = field(default=None, repr=False)

    def close(self) -> None:
        use, self._use = self._use, None
        if use is None:
            return
        try:
            fcntl.flock(use, fcntl.LOCK_UN)
            with _locked(self.data.with_suffix(".build")):
                _remove_unused(use, self.data)
        finally:
            use.close()


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """``path`` held exclusively (created if missing); without ``wait``: whether it was."""
    with open(path, "ab") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # released when the file closes


def _remove_unused(use: IO[bytes], data: Path) -> bool:
    """Remove ``data`` and its lock files when nobody holds ``use`` (its ``.use`` file, opened;
    the caller holds ``.build``)."""
    try:
        fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    for suffix in (".npy", ".use", ".build"):
        with contextlib.suppress(FileNotFoundError):
            data.with_suffix(suffix).unlink()
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _sweep(folder: Path, keep: str) -> None:
    """Remove the entries of ``folder`` that no rank uses: data files whose locks nobody holds,
    and temporary files whose writer is gone."""
    for use_path in folder.glob("*.use"):
        if use_path.stem == keep:
            continue
        try:
            with _locked(use_path.with_suffix(".build"), wait=False) as mine:
                if mine:
                    with open(use_path, "rb") as use:
                        _remove_unused(use, use_path.with_suffix(".npy"))
        except OSError:
            continue
    for tmp in folder.glob("*.npy.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _write(store: Store, manifest: ShardManifest, data: Path, dtype: type) -> None:
    """The shards' triples, verified, written to ``data`` (through a temporary name)."""
    tmp = data.with_name(f"{data.name}.tmp-{os.getpid()}")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(manifest.total, 3))
    try:
        at = 0
        for i, name in enumerate(manifest.files):
            raw = store.read_bytes(name)
            if hashlib.sha256(raw).hexdigest() != manifest.sha256[i]:
                raise RunError(f"{store.url_of(name)}: checksum mismatch (corrupt shard)")
            part = np.load(io.BytesIO(raw), allow_pickle=False)
            del raw
            if part.ndim != 2 or part.shape != (manifest.counts[i], 3):
                raise RunError(
                    f"{store.url_of(name)}: holds {part.shape} ids, the manifest says "
                    f"{manifest.counts[i]} triples"
                )
            if dtype is np.int32 and part.size and (part.min() < 0 or part.max() > _I32.max):
                raise RunError(
                    f"{store.url_of(name)}: ids outside 0..{_I32.max}, the run's entity and "
                    "relation counts say they fit int32"
                )
            out[at : at + len(part)] = part
            at += len(part)
        if at != manifest.total:
            raise RunError(f"the shards hold {at} triples, the manifest says {manifest.total}")
        out.flush()
        del out
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, data)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _mapped(data: Path, manifest: ShardManifest, dtype: type) -> np.ndarray | None:
    """The file mapped copy-on-write, or None when it is not the triples it should hold."""
    try:
        arr = np.load(data, mmap_mode="c", allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # not a .npy of ours: written again
        return None
    if arr.shape != (manifest.total, 3) or arr.dtype != np.dtype(dtype):
        return None
    return arr


def open_shared(
    store: Store, manifest: ShardManifest, *, wide: bool, folder: Path | None = None
) -> SharedTriples | None:
    """All training triples of ``manifest``, mapped from the machine's one copy (written by the
    first rank to arrive); ``wide``: the ids need ``int64``. None where the temp folder cannot
    hold the file (the caller reads its own copy)."""
    dtype: type = np.int64 if wide else np.int32
    folder = folder or shared_folder()
    key = _key(manifest, wide)
    data = folder / f"{key}.npy"
    size = manifest.total * 3 * np.dtype(dtype).itemsize
    try:
        folder.mkdir(parents=True, exist_ok=True)
        use = open(folder / f"{key}.use", "ab")  # noqa: SIM115 (held until close)
    except OSError as err:
        log.info("shared triples: %s cannot be used (%s); reading a copy of our own", folder, err)
        return None
    with _locked(folder / f"{key}.build"):
        try:
            fcntl.flock(use, fcntl.LOCK_SH)  # held while this rank trains on the mapping
            arr = _mapped(data, manifest, dtype)
            if arr is None:
                _sweep(folder, keep=key)
                arr = _written(store, manifest, data, dtype, size)
        except BaseException:
            _give_up(use, data)
            raise
        if arr is None:
            _give_up(use, data)
            return None
    return SharedTriples(torch.from_numpy(arr), data, use)


def _written(
    store: Store, manifest: ShardManifest, data: Path, dtype: type, size: int
) -> np.ndarray | None:
    """The triples written to ``data`` and mapped; None where its disk has no room for them."""
    free = shutil.disk_usage(data.parent).free
    if free < size + _SPARE:
        log.info(
            "shared triples: %s has %d MB free, the triples need %d MB; reading a copy of our own",
            data.parent,
            free >> 20,
            size >> 20,
        )
        return None
    with contextlib.suppress(FileNotFoundError):
        data.unlink()  # not ours (another shape or type): written again
    _write(store, manifest, data, dtype)
    arr = _mapped(data, manifest, dtype)
    if arr is None:
        raise RunError(f"{data}: the triples written there do not read back")
    return arr


def _give_up(use: IO[bytes], data: Path) -> None:
    """Let ``use`` go (the caller holds ``.build``), removing the lock files if nobody else
    holds it."""
    try:
        fcntl.flock(use, fcntl.LOCK_UN)
        _remove_unused(use, data)
    finally:
        use.close()
