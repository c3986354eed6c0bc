"""What the subcommands share: argparse types that reject bad values with argparse's one-line
usage error (exit status 2), and the storage errors of a command as one line."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from kgpipe.errors import KgpipeError, StorageAccessDenied, StorageError

__all__ = [
    "CHECKPOINT_HELP",
    "PREFIX_HELP",
    "checkpoint",
    "non_negative_int",
    "positive_int",
    "prefix",
    "storage_errors",
    "url",
]

CHECKPOINT_HELP = (
    "which model: best (the committed checkpoint with the best validation MRR), latest (the "
    "newest committed checkpoint) or an epoch number (its committed checkpoint); default: the "
    "run's final model.safetensors"
)
PREFIX_HELP = (
    "declare a prefix for prefixed names, e.g. ex=http://example.org/ns# (repeatable). Labels "
    "may be given whole, inside <...>, as a prefixed name (ex:term6; rdf, rdfs, owl, xsd, "
    "skos, foaf and dcterms are predeclared, and an undeclared prefix matches the last path "
    "segment of the namespace, ns:term6 for http://example.org/ns#term6) or by their unique "
    "end after a '/', '#' or ':' (term6)"
)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text!r}")
    return value


def checkpoint(text: str) -> str | int:
    """``best``, ``latest`` or an epoch number (>= 0)."""
    if text in ("best", "latest"):
        return text
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not best, latest or an epoch number"
        ) from None


def url(text: str) -> str:
    """A folder or file URL (a local path or any fsspec URL): not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def prefix(text: str) -> tuple[str, str]:
    """``NAME=NAMESPACE`` of ``--prefix``."""
    name, eq, namespace = text.partition("=")
    name = name.strip().removesuffix(":")
    if not eq or not name or not namespace or any(c in name for c in " :/#"):
        raise argparse.ArgumentTypeError(
            f"expected NAME=NAMESPACE (e.g. ex=http://example.org/ns#), not {text!r}"
        )
    return name, namespace.strip()


@contextlib.contextmanager
def storage_errors(where: str, doing: str) -> Iterator[None]:
    """Errors that the storage layer passes through raw -- missing object-store credentials
    (botocore), a protocol fsspec does not know or cannot load, an ``OSError`` of a local path
    -- as one line naming ``where`` and what the command was ``doing``."""
    try:
        yield
    except KgpipeError:
        raise
    except (OSError, ValueError, ImportError) as err:
        raise StorageError(f"{where}: cannot {doing} ({_brief(err)})") from None
    except Exception as err:
        if not type(err).__module__.startswith(("botocore", "aiobotocore", "s3fs", "fsspec")):
            raise
        cls = StorageAccessDenied if "Credentials" in type(err).__name__ else StorageError
        raise cls(f"{where}: cannot {doing} ({_brief(err)})") from None


def _brief(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
