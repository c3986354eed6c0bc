"""One copy of the staged training triples per machine, for the ranks of a gang that share it.

Every rank of a step-synchronised gang draws the same global batch, so each one holds all the
training triples (12 bytes a triple as ``int32``). Ranks on one machine (the workers of a
LocalCluster, the GPUs of one host) would hold one copy each. :func:`open_shared` instead has
the first of them write the triples once, checksum-verified shard by shard as
:func:`~kgpipe.data.shards.read_shards` reads them, into a file in the machine's temp folder
(``$TMPDIR/kgpipe-triples-<uid>``, the user's own, mode 0700), and every rank maps that file
copy-on-write: its pages are the page cache's, held once for the machine however many ranks
read them (and, being a file's, dropped under memory pressure and read again, where private
copies would need swap).

The file is named by a digest of the shard manifest (the shards' checksums): ranks that train
on the same staged data at the same time share it, and a run on other data never takes it.
Locks (``flock``):

- ``.lock``, one for the folder, never removed: held exclusively by a rank while it maps the
  file, writes it (the whole write: to a temporary name, then renamed, so a file under its
  final name is complete), or removes what nobody uses;
- ``<key>.use``, held shared by every rank that maps ``<key>.npy``, for as long as it trains;
  opened, locked and removed only under ``.lock``.

Closing lets ``.use`` go, then (under ``.lock``) takes it exclusively without waiting: granted,
no rank maps the file any more, and both go. A rank that dies releases its locks with its
process; every opening removes the files nobody holds (and, since writers hold ``.lock``, any
temporary file it finds is a dead writer's). Where the folder cannot be used (not writable,
``flock`` unsupported, too little free space, a write that fails) the rank reads a copy of its
own, as ``distributed.share_triples: false`` does, and logs why.

Dask's ``memory_limit`` counts a worker's resident pages, mapped file pages included, so it
still sees one copy per worker; the machine holds one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import torch
from torch import Tensor

from kgpipe.data.shards import ShardManifest, read_shard
from kgpipe.errors import RunError
from kgpipe.storage import Store

__all__ = ["SharedTriples", "open_shared", "shared_folder"]

log = logging.getLogger(__name__)

_I32 = np.iinfo(np.int32)
_SPARE = 256 << 20  # left free on the temp folder's disk besides the file


def shared_folder() -> Path:
    """Where this user's shared triples live: ``$TMPDIR/kgpipe-triples-<uid>``."""
    return Path(tempfile.gettempdir()) / f"kgpipe-triples-{os.getuid()}"


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
            with _folder_locked(self.data.parent):
                _remove_unused(use, self.data)
        except OSError as err:  # housekeeping: the next opening sweeps what is left
            log.info("shared triples: could not remove %s: %s", self.data, err)
        finally:
            use.close()


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    with open(folder / ".lock", "ab") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # released when the file closes


def _own_folder(folder: Path) -> None:
    """Create ``folder`` (mode 0700) or check that it is this user's own, not a link."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{folder} is not a folder of this user's")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)


def _remove_unused(use: IO[bytes], data: Path) -> bool:
    """Remove ``data`` and its ``.use`` file when nobody holds ``use`` (the caller holds the
    folder's lock)."""
    try:
        fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    for path in (data, data.with_suffix(".use")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return True


def _sweep(folder: Path, keep: str) -> None:
    """Remove what nobody uses (the caller holds the folder's lock): data files whose ``.use``
    nobody holds, and temporary files (their writers held the lock: they are gone)."""
    for data in folder.glob("*.npy"):
        if data.stem == keep:
            continue
        with open(data.with_suffix(".use"), "ab") as use:
            _remove_unused(use, data)
    for path in [*folder.glob("*.npy.tmp"), *folder.glob("*.use")]:
        if path.suffix == ".use" and (path.stem == keep or path.with_suffix(".npy").exists()):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _write(store: Store, manifest: ShardManifest, data: Path, dtype: type) -> None:
    """The shards' triples, verified, written to ``data`` through a temporary file (plain
    writes: a full disk is an ``OSError``, not a fault in a mapping)."""
    tmp = data.with_name(f"{data.name}.tmp")
    tmp.unlink(missing_ok=True)  # a dead writer's (writers hold the folder's lock)
    try:
        with open(tmp, "xb") as f:
            header = {
                "descr": np.dtype(dtype).str,
                "fortran_order": False,
                "shape": (manifest.total, 3),
            }
            np.lib.format.write_array_header_1_0(f, header)
            at = 0
            for i, name in enumerate(manifest.files):
                part = read_shard(store, manifest, i)
                if dtype is np.int32 and part.size and (part.min() < 0 or part.max() > _I32.max):
                    raise RunError(
                        f"{store.url_of(name)}: ids outside 0..{_I32.max}, the run's entity and "
                        "relation counts say they fit int32"
                    )
                f.write(np.ascontiguousarray(part, dtype=dtype).tobytes())
                at += len(part)
            if at != manifest.total:
                raise RunError(f"the shards hold {at} triples, the manifest says {manifest.total}")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, data)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _mapped(data: Path, manifest: ShardManifest, dtype: type) -> np.ndarray | None:
    """The file mapped copy-on-write, or None when it is missing or not the triples it should
    hold (then written again); other faults (out of maps, memory) raise ``OSError``."""
    try:
        arr = np.load(data, mmap_mode="c", allow_pickle=False)
    except FileNotFoundError:
        return None
    except ValueError:  # not a .npy of ours
        return None
    if arr.shape != (manifest.total, 3) or arr.dtype != np.dtype(dtype):
        return None
    return arr


def open_shared(
    store: Store, manifest: ShardManifest, *, wide: bool, folder: Path | None = None
) -> SharedTriples | None:
    """All training triples of ``manifest``, mapped from the machine's one copy (written by the
    first rank to arrive); ``wide``: the ids need ``int64``. None where the temp folder cannot
    be used (the caller reads its own copy); a corrupt shard is a :class:`RunError`."""
    if manifest.total == 0:
        return None
    dtype: type = np.int64 if wide else np.int32
    folder = folder or shared_folder()
    key = _key(manifest, wide)
    data = folder / f"{key}.npy"
    use: IO[bytes] | None = None
    try:
        _own_folder(folder)
        with _folder_locked(folder):
            use = open(folder / f"{key}.use", "ab")  # noqa: SIM115 (held until close)
            fcntl.flock(use, fcntl.LOCK_SH)  # held while this rank trains on the mapping
            _sweep(folder, keep=key)
            arr = _mapped(data, manifest, dtype)
            if arr is None and _room(folder, manifest.total * 3 * np.dtype(dtype).itemsize):
                _write(store, manifest, data, dtype)
                arr = _mapped(data, manifest, dtype)
            if arr is None:
                raise OSError(f"{data}: no room for the triples, or they do not read back")
            return SharedTriples(torch.from_numpy(arr), data, use)
    except OSError as err:
        log.info("shared triples: %s cannot be used (%s); reading a copy of our own", folder, err)
        _give_up(use, data)
        return None
    except BaseException:
        _give_up(use, data)
        raise


def _room(folder: Path, size: int) -> bool:
    free = shutil.disk_usage(folder).free
    if free < size + _SPARE:
        log.info(
            "shared triples: %s has %d MB free, the triples need %d MB",
            folder,
            free >> 20,
            size >> 20,
        )
        return False
    return True


def _give_up(use: IO[bytes] | None, data: Path) -> None:
    """Let ``use`` go, removing the entry if nobody else holds it (best effort)."""
    if use is None:
        return
    try:
        fcntl.flock(use, fcntl.LOCK_UN)
        with _folder_locked(data.parent):
            _remove_unused(use, data)
    except OSError:
        pass
    finally:
        use.close()
