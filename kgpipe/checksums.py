"""The checksums of the files a checkpoint commits, and their check against a manifest entry.

XXH3-128 (the ``xxhash`` package): a non-cryptographic hash made to catch corruption (a flipped
bit, a truncated or swapped file) at memory speed, where SHA-256 ran at 283-388 MB/s on our
2-core CI machine and made up most of a commit's CPU time. It guards against accidents, not
against someone who can write to the store (the manifest sits beside the files). Manifests of
``kgpipe-checkpoint/1`` name SHA-256 and are verified by it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

import xxhash

__all__ = ["CHECKSUM", "CHECKSUMS", "entry_matches", "file_checksum"]

log = logging.getLogger("kgpipe.checkpoint")

#: the checksum of the files a checkpoint commits
CHECKSUM = "xxh3_128"
#: every checksum a manifest may name (sha256: manifests written before XXH3-128)
CHECKSUMS = (CHECKSUM, "sha256")


def file_checksum(path: str, algorithm: str = CHECKSUM) -> tuple[str, int]:
    """The checksum (hex; ``algorithm`` one of :data:`CHECKSUMS`) and size of a local file,
    read in blocks."""
    with open(path, "rb") as f:
        if algorithm == "sha256":
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        elif algorithm == "xxh3_128":
            digest = hashlib.file_digest(f, xxhash.xxh3_128).hexdigest()
        else:
            raise ValueError(f"unknown checksum {algorithm!r} (known: {', '.join(CHECKSUMS)})")
        return digest, os.fstat(f.fileno()).st_size


def entry_matches(path: str, info: dict[str, Any]) -> bool:
    """Whether the local file ``path`` has the size and checksum of its manifest entry (an
    entry that names no checksum of :data:`CHECKSUMS` matches nothing)."""
    algorithm = next((a for a in CHECKSUMS if a in info), None)
    if algorithm is None:
        log.warning("%s: its manifest entry names no checksum kgpipe knows (%s)", path, info)
        return False
    if os.path.getsize(path) != info["bytes"]:  # cheap: a truncated file is not read
        return False
    return file_checksum(path, algorithm) == (info[algorithm], info["bytes"])
