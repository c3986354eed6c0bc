"""One writer per run folder: a lease taken before staging or training, renewed while the run
goes on, released at its end.

Two ``kgpipe train`` commands with the same ``run.name``, or two flow runs of a deployment with a
fixed name, would otherwise both stage and train into one folder until their commits collide.
The lease is a sequence of small JSON records, ``lease/00000001.json``, ``00000002.json``, ...;
the newest one holds the folder. A writer takes the folder by *creating* the next record, with
an exclusive create (a hard link locally, a conditional PUT on an object store), so of two
writers that race for the same number exactly one wins. It may do so when there is no record,
when the newest is released, or when the newest was not renewed for ``lease_ttl_s`` (its writer
died) -- or at once when its writer ran on this host and its process is gone; otherwise it is
refused with a message that names the holder and the lease's age.

The holder renews its record from a background thread every quarter of the time to live.
Before a checkpoint is committed (by this process, or by rank 0 of a gang) the writer checks
that its record is still the newest (:func:`check_holder`): a writer that stalled past its time
to live and was taken over stops committing instead of writing beside its successor.
Wall-clock times are compared across hosts, so their clocks must agree to well under the time
to live (NTP does).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgpipe.errors import Fenced, KgpipeError, RunError
from kgpipe.storage import Store

__all__ = [
    "LEASE",
    "LeaseLost",
    "RunFolderBusy",
    "RunLease",
    "check_handle",
    "check_holder",
    "describe_holder",
]

log = logging.getLogger("kgpipe.lease")

LEASE = "lease"


class RunFolderBusy(RunError):
    """Another writer (``holder``, as it named itself) holds the run folder's live lease."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class LeaseLost(Fenced):
    """Another writer took the run folder over (this one stalled past its lease)."""


def _number(name: str) -> int | None:
    stem = name.removesuffix(".json")
    return int(stem) if name.endswith(".json") and stem.isdigit() else None


def _records(store: Store) -> list[int]:
    return sorted(n for n in (_number(x) for x in store.list(LEASE)) if n is not None)


def _rel(number: int) -> str:
    return f"{LEASE}/{number:08d}.json"


def _read(store: Store, number: int) -> dict[str, Any]:
    try:
        data = json.loads(store.read_text(_rel(number)))
    except (ValueError, UnicodeDecodeError, FileNotFoundError):  # half-written, or just removed
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(record: dict[str, Any], now: float | None = None) -> str:
    """``record``'s writer in words: who, where, and how long ago it renewed."""
    now = time.time() if now is None else now
    who = record.get("holder") or "a writer"
    where = f"{record.get('user', '?')}@{record.get('host', '?')}, pid {record.get('pid', '?')}"
    age = now - float(record.get("renewed", 0.0))
    return f"{who} ({where}), lease renewed {age:.0f} s ago"


def check_holder(store: Store, number: int, token: str | None = None, *, hint: str = "") -> None:
    """Raise :class:`LeaseLost` unless lease record ``number`` is still the newest (and, with
    ``token``, is that writer's and not released); ``hint`` ends the first message."""
    if token is not None:
        record = _read(store, number)
        if record.get("token") != token or record.get("released"):
            raise LeaseLost(
                f"{store.url}: lease record {number} is not held by this writer (released, or "
                f"another writer's){hint}"
            )
    newest = _records(store)
    if newest and newest[-1] != number:
        other = _read(store, newest[-1])
        raise LeaseLost(
            f"{store.url}: this writer's lease was taken over by {describe_holder(other)}; "
            "it stops here without committing (its last commit stays)"
        )


def check_handle(store: Store, handle: str, *, hint: str = "") -> None:
    """:func:`check_holder` for a :attr:`RunLease.handle` (``NUMBER/TOKEN``): what a writer's
    ranks and a flow run working under a caller's lease check before they commit."""
    text, _, token = handle.partition("/")
    if not text.isdigit() or not token:
        raise LeaseLost(f"{store.url}: {handle!r} is not a lease handle (NUMBER/TOKEN)")
    check_holder(store, int(text), token, hint=hint)


@dataclass
class _Held:
    number: int
    record: dict[str, Any]


class RunLease:
    """The lease of the run folder in ``store`` (use with ``with``: acquired on entry, renewed
    in the background, released on exit)."""

    def __init__(self, store: Store, *, ttl_s: float, holder: str | None = None) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.holder = holder or "kgpipe"
        self._held: _Held | None = None
        self._lock = threading.Lock()  # a renewal's write and the release never interleave
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: KgpipeError | None = None
        # local folders that the lease itself brings into being (removed again if it is all)
        self._new_folders = store.missing_folders()

    @property
    def number(self) -> int | None:
        """The record this writer holds (None before :meth:`acquire`)."""
        return self._held.number if self._held else None

    @property
    def handle(self) -> str | None:
        """``NUMBER/TOKEN``: what a caller passes to a flow run that works under its lease."""
        return f"{self._held.number}/{self._held.record['token']}" if self._held else None

    def acquire(self) -> None:
        """Take the run folder, or raise :class:`RunError` naming the writer that holds it."""
        for attempt in range(3):  # a release or an expiry may race with us; look again
            numbers = _records(self.store)
            newest = numbers[-1] if numbers else 0
            if newest:
                current = _read(self.store, newest)
                if not current and attempt < 2:  # being written (a file system without hard
                    time.sleep(0.5)  # links creates it empty first): not an expired lease
                    continue
                now = time.time()
                age = now - float(current.get("renewed", 0.0))
                ttl = float(current.get("ttl_s", self.ttl_s))
                gone = not current.get("released") and _holder_gone(current)
                if gone:
                    log.warning(
                        "%s: taking over the lease of %s: that process no longer runs",
                        self.store.url,
                        describe_holder(current, now),
                    )
                elif not current.get("released") and age < ttl:
                    raise RunFolderBusy(
                        f"{self.store.url}: another writer is using this run folder: "
                        f"{describe_holder(current, now)}. Two writers of one run folder "
                        "would overwrite each other; wait for it to finish (or, if it died, "
                        f"run again after its lease expires in {ttl - age:.0f} s), or choose "
                        "another run.name",
                        str(current.get("holder", "")),
                    )
                elif not current.get("released"):
                    log.warning(
                        "%s: taking over the lease of %s (expired)",
                        self.store.url,
                        describe_holder(current, now),
                    )
            record = {
                "holder": self.holder,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "pid_started": _started(os.getpid()),
                "machine": _machine(),
                "user": _user(),
                "token": uuid.uuid4().hex,
                "acquired": time.time(),
                "renewed": time.time(),
                "ttl_s": self.ttl_s,
                "released": False,
            }
            try:
                self.store.create(_rel(newest + 1), json.dumps(record).encode())
            except FileExistsError:
                # lost the race -- or won it with a PUT whose reply was lost and whose retry
                # then found our own record: the token tells
                if _read(self.store, newest + 1).get("token") != record["token"]:
                    continue
            self._held = _Held(newest + 1, record)
            self._forget_older(newest + 1)
            return
        raise RunError(f"{self.store.url}: could not take the run folder's lease (contended)")

    def check(self) -> None:
        """Raise :class:`LeaseLost` if another writer took the run folder over."""
        if self.lost is not None:
            raise self.lost
        if self._held is not None:
            check_holder(self.store, self._held.number)
            record = _read(self.store, self._held.number)
            if record and record.get("token") != self._held.record["token"]:
                # two writers created the same record (a store whose create is not atomic):
                # the one whose record is there goes on, this one stops
                raise LeaseLost(
                    f"{self.store.url}: lease record {self._held.number} is also "
                    f"{describe_holder(record)}'s (this store's create is not atomic); this "
                    "writer stops here without committing"
                )

    def renew(self) -> None:
        """Write a new renewal time, unless the run folder was taken over (then raise)."""
        with self._lock:
            held = self._held
            if held is None:  # released meanwhile
                return
            self.check()
            held.record["renewed"] = time.time()
            self.store.write_bytes(_rel(held.number), json.dumps(held.record).encode())

    def release(self) -> None:
        """Mark the lease released (a later writer need not wait for it to expire). Never
        raises: it runs while another error (or Ctrl-C) may be on its way out."""
        self._stop.set()
        with self._lock:  # waits for a renewal in flight; later ones see nothing held
            held, self._held = self._held, None
        self._stop_renewing()
        if held is None:
            return
        try:
            check_holder(self.store, held.number)
            if _read(self.store, held.number).get("token") not in (None, held.record["token"]):
                return  # another writer's record of the same number: leave it held
            held.record.update(released=True, renewed=time.time())
            if self.store.list() in ([LEASE], []):
                # nothing was written under the lease (bad input, a refusal): leave no folder
                self.store.remove(_rel(held.number), recursive=False)
                self.store.remove_empty_folders([LEASE, ""], also=self._new_folders)
            else:
                self.store.write_bytes(_rel(held.number), json.dumps(held.record).encode())
        except LeaseLost:
            return  # not ours any more: leave the successor's record alone
        except Exception as err:  # it will expire instead
            log.warning("%s: could not release the lease: %s", self.store.url, err)

    def start_renewing(self) -> None:
        """Renew every quarter of the time to live, in a daemon thread, until :meth:`release`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="kgpipe-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.renew()
            except LeaseLost as err:
                self.lost = err
                log.error("%s", err)
                return
            except Exception as err:  # a storage hiccup: the next renewal may get through
                log.warning("%s: lease renewal failed: %s", self.store.url, err)

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _forget_older(self, number: int) -> None:
        for old in _records(self.store):
            if old < number:
                try:
                    self.store.remove(_rel(old), recursive=False)
                except Exception as err:  # housekeeping only
                    log.debug("lease record %d: %s", old, err)

    def __enter__(self) -> RunLease:
        self.acquire()
        self.start_renewing()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (Linux); None where unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux), to tell it from a later
    process that reuses its id; None where unknown."""
    fields = _stat(pid)
    return fields[19] if fields else None


def _holder_gone(record: dict[str, Any]) -> bool:
    """Whether the writer of ``record`` is known to be dead: it ran on this host and its process
    no longer runs (a killed command need not wait for its lease to expire). A writer on
    another host is judged by its lease's age alone."""
    if record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return False
    if record.get("machine") is None or record.get("machine") != _machine():
        return False  # another boot, container or pid namespace: its pids mean nothing here
    pid = int(record["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # runs, as another user
    fields = _stat(pid)
    if fields and fields[0] in ("Z", "X"):  # exited, not yet reaped (where PID 1 reaps late)
        return True
    started = record.get("pid_started")
    return started is not None and fields is not None and fields[19] != started


def _machine() -> str | None:
    """This boot of this kernel and this pid namespace (Linux), so that a pid is only compared
    with pids it can be compared with (two containers may share a host name)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
