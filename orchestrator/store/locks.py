"""The lock every merger into one results document takes: hard (flock) or soft (a lock file).

``hard`` is filelock's flock lock: the kernel drops it when its holder dies, so it never
goes stale, but flock is unreliable on NFS and Lustre. ``soft`` is a lock *file* that only
needs atomic create-if-absent, which those filesystems do keep. Its content names the holder:
host name, boot id and pid namespace (together: the machine and pid space it lives in), pid
and the pid's start time (so a recycled pid is not mistaken for the holder), plus a token.
While held, a thread refreshes the file's mtime every ``HEARTBEAT_S``.

A soft lock is broken as stale only when that is certain or very likely:
- holder in our pid space (same host, boot and pid namespace): when that pid is gone, or now
  belongs to a process started at another time;
- holder elsewhere: only when the lock file has not been refreshed for ``FOREIGN_STALE_S``
  (a live holder refreshes it every few seconds), with a loud warning naming the holder.
A live holder's lock is never broken. Breaking renames the lock file aside and checks it is
still the stale one before dropping it; if a new holder slipped in, its file is put back.
Even so, merging is idempotent: two mergers that both believe they hold the lock write the
same document, so a lock that fails costs a redo, never a record.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock

from orchestrator.errors import LockTimeout, ResultsError

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
FOREIGN_STALE_S = 3600.0  # no heartbeat for an hour: the holder elsewhere is gone


def lock_path_for(output: Path) -> Path:
    """The lock every merger into ``output`` takes: a hidden file beside it."""
    return output.with_name(f".{output.name}.lock")


# ---------------------------------------------------------------------------- who am I


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def host_identity() -> dict[str, Any]:
    """What makes two processes share a pid space: host name, kernel boot, pid namespace."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = None
    return {"host": socket.gethostname(), "boot_id": _read("/proc/sys/kernel/random/boot_id"), "pidns": pidns}


def process_start(pid: int) -> str | None:
    """A pid's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def pid_alive(pid: int, start: str | None) -> bool:
    if start is not None and os.path.isdir("/proc/self"):
        return process_start(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------- soft lock


def _describe(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "an unreadable holder"
    return f"pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('created')})"


class SoftLock:
    """A lock file created atomically; see the module docstring for when it is stale."""

    def __init__(
        self,
        path: Path,
        timeout: float,
        poll: float = 0.05,
        *,
        extra: dict[str, Any] | None = None,
        foreign_stale_s: float = FOREIGN_STALE_S,
        stale_if: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        """``extra``: more fields for the lock file (who else the holder is: a unit's GPU, its
        SLURM job); ``foreign_stale_s``: how long a holder elsewhere may go without a heartbeat;
        ``stale_if(holder)``: a reason the caller knows the holder is gone (e.g. it was an
        earlier run of this same SLURM job, which SLURM ended before requeueing it), or None."""
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self.extra = dict(extra or {})
        self.foreign_stale_s = foreign_stale_s
        self.stale_if = stale_if
        self._token: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- acquire / release
    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        me = {
            **self.extra,
            **host_identity(),
            "pid": os.getpid(),
            "start": process_start(os.getpid()),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "token": uuid.uuid4().hex,
        }
        payload = (json.dumps(me) + "\n").encode()
        while True:
            if self._create(payload):
                self._token = me["token"]
                self._stop.clear()
                self._beat = threading.Thread(target=self._heartbeat, name="tilesweep-lock-heartbeat", daemon=True)
                self._beat.start()
                return
            holder, age = self.holder()
            if age is not None and self._stale(holder, age):
                self._break(holder)
                continue
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"could not take the soft lock {self.path} within {self.timeout:g}s: held by {_describe(holder)}"
                    f"{'' if age is None else f', refreshed {age:.0f}s ago'}; "
                    f"if that process is gone, delete {self.path}"
                )
            time.sleep(self.poll * random.uniform(0.5, 1.5))

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        holder, _ = self.holder()
        if holder is not None and holder.get("token") == self._token:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        else:
            log.warning(
                "the soft lock %s was no longer ours when released (now held by %s); another process broke it as stale",
                self.path,
                _describe(holder),
            )
        self._token = None

    # -- internals
    def _create(self, payload: bytes) -> bool:
        """Create the lock file with its content in one step: link a complete temp file
        into place (atomic, fails if it exists, works on NFS); O_EXCL where links are not."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here: create-exclusive, then write
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            return True
        finally:
            os.unlink(tmp)

    def holder(self) -> tuple[dict[str, Any] | None, float | None]:
        """(holder's record or None if unreadable, seconds since its last heartbeat); age is
        None when there is no lock file (any more)."""
        try:
            st = os.stat(self.path)
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None, None
        except OSError:
            return None, 0.0
        try:
            holder = json.loads(text)
            if not isinstance(holder, dict):
                holder = None
        except ValueError:
            holder = None
        return holder, max(0.0, time.time() - st.st_mtime)

    def stale_reason(self, holder: dict[str, Any] | None, age: float) -> str | None:
        """Why the holder of a lock file ``age`` seconds after its last heartbeat is gone, or
        None while it may be alive (see the module docstring)."""
        if holder is not None and self.stale_if is not None:
            why = self.stale_if(holder)
            if why:
                return why
        if holder is not None and all(holder.get(k) == v for k, v in host_identity().items()):
            pid = holder.get("pid")
            if isinstance(pid, int) and not pid_alive(pid, holder.get("start")):
                return "its holder is dead"
            return None
        if age > self.foreign_stale_s:
            return f"not refreshed for {age:.0f}s (over {self.foreign_stale_s:.0f}s), so its holder is taken to be gone"
        return None

    def _stale(self, holder: dict[str, Any] | None, age: float) -> bool:
        why = self.stale_reason(holder, age)
        if why is None:
            return False
        if holder is not None and all(holder.get(k) == v for k, v in host_identity().items()):
            log.warning("breaking the stale soft lock %s of %s: %s", self.path, _describe(holder), why)
        else:
            log.warning(
                "BREAKING THE SOFT LOCK %s held by %s: %s; if it is in fact alive, two holders may now run at once",
                self.path,
                _describe(holder),
                why,
            )
        return True

    def _break(self, stale: dict[str, Any] | None) -> None:
        aside = self.path.with_name(
            f"{self.path.name}.stale.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        )
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else broke it first
        try:
            moved = json.loads(aside.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            moved = None
        same = (moved is None and stale is None) or (
            isinstance(moved, dict) and stale is not None and moved.get("token") == stale.get("token")
        )
        if not same:  # a new holder took the lock between our look and the rename: give it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                log.warning(
                    "could not restore the soft lock %s of %s after a racing stale-lock break; its file is kept as %s",
                    self.path,
                    _describe(moved),
                    aside,
                )
                return
        os.unlink(aside)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                log.warning("could not refresh the soft lock %s (was it deleted?)", self.path)


# ---------------------------------------------------------------------------- both kinds


class MergeLock:
    """Context manager: the hard or soft lock on ``path``, ``LockTimeout`` naming the file."""

    def __init__(self, path: Path, kind: str, timeout: float) -> None:
        self.path, self.kind, self.timeout = Path(path), kind, timeout
        self._lock: Any = None

    def __enter__(self) -> MergeLock:
        try:
            return self._acquire()
        except OSError as exc:  # the folder cannot hold the lock file: read-only, immutable, gone
            raise ResultsError(
                f"cannot create the lock file {self.path} ({exc.strerror or exc}); the folder {self.path.parent} "
                "is not writable: make it writable, or merge into another folder with --output"
            ) from None

    def _acquire(self) -> MergeLock:
        if self.kind == "soft":
            self._lock = SoftLock(self.path, self.timeout)
            self._lock.acquire()
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = filelock.FileLock(str(self.path), timeout=self.timeout)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise LockTimeout(
                f"could not take the lock {self.path} within {self.timeout:g}s; another merge into the same document "
                "is running (wait for it, or raise merge.lock_timeout_s)"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
