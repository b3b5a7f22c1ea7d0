"""The lock every merger into one results document takes: hard (flock) or soft (a lock file).

``hard`` is filelock's flock lock: the kernel drops it when its holder dies, so it never
goes stale, but flock is unreliable on NFS and Lustre. ``soft`` is a lock *file* that only
needs atomic create-if-absent, which those filesystems do keep. Its content (``HolderRecord``)
names the holder: host name, boot id and pid namespace (together: the machine and pid space it
lives in), pid and the pid's start time (so a recycled pid is not mistaken for the holder),
plus a token. While held, a thread refreshes the file's mtime every ``HEARTBEAT_S``.

A soft lock is broken as stale only when that is certain or very likely:
- holder in our pid space (same host, boot and pid namespace): when that pid is gone, or now
  belongs to a process started at another time;
- holder elsewhere: only when the lock file has not been refreshed for ``FOREIGN_STALE_S``
  (a live holder refreshes it every few seconds), with a loud warning naming the holder;
- no holder: a lock file that names none (empty, or not a JSON object) and has not changed
  for ``NO_HOLDER_STALE_S`` (a holder creates it with its record in one step, or, where the
  filesystem has no hard links, creates it, then writes its record at once).
A live holder's lock is never broken. Breaking renames the lock file aside and checks it is
still the stale one before dropping it; if a new holder slipped in, its file is put back.
Even so, merging is idempotent: two mergers that both believe they hold the lock write the
same document, so a lock that fails costs a redo, never a record.

Why not filelock's soft locks (checked against 4.3.1): each lacks a guarantee above, and
``tests/test_lock_guarantees.py`` holds ours and each of them to every guarantee with real
holder processes, marking with a strict xfail each guarantee a class lacks:
- ``SoftFileLease`` takes a lease whose marker stayed unchanged for ``lease_duration``, live
  holder or not: a holder on this host whose heartbeat stalls (a ``tilesweep run`` stopped
  with Ctrl-Z, a process under a debugger) loses its lock while alive
  (``test_a_live_holder_whose_heartbeat_stalls_is_never_broken``). It measures that silence
  on the contender's clock from the contender's first look, not from the holder's last
  heartbeat, so a contender that does not itself watch the file for ``lease_duration`` never
  takes over a holder elsewhere, however long that one has been silent: a worker tries a
  unit's lease once, and a merger waits ``merge.lock_timeout_s`` (600 s) for a lock whose
  limit is an hour (``test_a_holder_on_another_host_silent_past_its_limit_is_taken_over_at_once``).
  It logs a take-over at DEBUG at most (``test_taking_over_a_holder_on_another_host_warns_naming_it``);
  its marker is a fixed record (pid, host, mode, token, duration, start) with no room for
  the GPU and SLURM task ``status`` shows of a lease
  (``test_the_lock_file_names_the_gpu_and_job_status_shows``), and it cannot be told that a
  holder is gone for a reason only the caller knows (``stale_if``: the earlier run of a
  requeued SLURM task, ``test_leases.test_a_requeued_task_takes_over_the_lease_of_its_own_earlier_run_only``).
- ``StrictSoftFileLock`` never breaks a claim itself: a holder that died on this host keeps
  its lock until someone calls ``force_break`` (``test_a_dead_holder_on_this_host_is_taken_over_at_once``).
- ``SoftFileLock`` takes a lock from a holder on another host only through ``lifetime``: by the
  marker's age, with no heartbeat, so a live holder that holds longer than that loses it
  (``test_a_live_holder_on_this_host_is_never_broken_however_long_it_holds``; filelock's own
  ``SoftFileLockLifetimeWarning`` says as much when such a lock is made); a take-over is
  logged at DEBUG at most here too.
What filelock does hold, in the same tests: a holder on this host that died, or whose pid now
belongs to another process, is taken over at once (all but ``StrictSoftFileLock``); a live
holder on this host is kept while its heartbeat runs (``SoftFileLease``) or whatever it does
(``StrictSoftFileLock``); a holder on another host is kept before its limit.
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
from typing import TYPE_CHECKING, TypedDict, cast

from orchestrator import PROG, word
from orchestrator.errors import LockTimeout, ResultsError
from orchestrator.store.filekinds import refuse_odd
from orchestrator.store.files import beside, create_once, read_text
from orchestrator.store.pidspace import host_identity, in_this_pid_space, pid_alive, process_start

if TYPE_CHECKING:  # loaded by the merge that takes a hard lock: readers of soft locks (status) never do
    import filelock

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
FOREIGN_STALE_S = 3600.0  # no heartbeat for an hour: the holder elsewhere is gone
NO_HOLDER_STALE_S = 10.0  # a lock file naming no holder, unchanged this long, is damaged: no holder is writing it


def lock_path_for(output: Path) -> Path:
    """The lock every merger into ``output`` takes: a hidden file beside it."""
    return beside(output, ".", ".lock")


# ---------------------------------------------------------------------------- the lock file


class HolderRecord(TypedDict, total=False):
    """A soft lock file's content, one JSON object: who holds the lock. The fields of
    ``pidspace.HostIdentity``, ``pid`` and ``start`` (that pid's start time) name the
    process; ``token`` this one hold of it. The rest is what a holder adds through
    ``SoftLock(extra=...)``: a lease's unit, GPU, SLURM task or command, which ``status`` shows."""

    host: str
    boot_id: str | None
    pidns: str | None
    pid: int
    start: str | None
    created: str
    token: str
    unit: str
    gpu: str | None
    job: str | None
    command: str


# ---------------------------------------------------------------------------- soft lock


def _describe(holder: HolderRecord | None) -> str:
    if holder is None:
        return "an unreadable holder"
    return f"pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('created')})"


def _parse(text: str) -> HolderRecord | None:
    """A lock file's record, or None when it is not one (torn, or not ours)."""
    try:
        holder = json.loads(text)
    except ValueError:
        return None
    return cast(HolderRecord, holder) if isinstance(holder, dict) else None


StaleIf = Callable[[HolderRecord], str | None]


class SoftLock:
    """A lock file created atomically; see the module docstring for when it is stale."""

    def __init__(
        self,
        path: Path,
        timeout: float,
        poll: float = 0.05,
        *,
        extra: HolderRecord | None = None,
        foreign_stale_s: float = FOREIGN_STALE_S,
        stale_if: StaleIf | None = None,
    ) -> None:
        """``extra``: more fields for the lock file (who else the holder is: a unit's GPU, its
        SLURM job); ``foreign_stale_s``: how long a holder elsewhere may go without a heartbeat;
        ``stale_if(holder)``: a reason the caller knows the holder is gone (e.g. it was an
        earlier run of this same SLURM job, which SLURM ended before requeueing it), or None."""
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self.extra: HolderRecord = {**(extra or {})}
        self.foreign_stale_s = foreign_stale_s
        self.stale_if = stale_if
        self._token: str | None = None
        self.on_wait: Callable[[HolderRecord | None], None] | None = None  # told once, when it has to wait
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- acquire / release
    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        me: HolderRecord = {
            **self.extra,
            **host_identity(),
            "pid": os.getpid(),
            "start": process_start(os.getpid()),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "token": uuid.uuid4().hex,
        }
        payload = (json.dumps(me) + "\n").encode()
        waited = False
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
            if not waited and self.on_wait is not None:
                self.on_wait(holder)
            waited = True
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
        """Create the lock file with its content in one step (``files.create_once``)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return create_once(self.path, payload)

    def holder(self) -> tuple[HolderRecord | None, float | None]:
        """(holder's record or None if unreadable, seconds since its last heartbeat); age is
        None when there is no lock file (any more)."""
        try:
            st = os.stat(self.path)
            text = read_text(self.path)
        except FileNotFoundError:
            return None, None
        except OSError:
            return None, 0.0
        return _parse(text), max(0.0, time.time() - st.st_mtime)

    def stale_reason(self, holder: HolderRecord | None, age: float) -> str | None:
        """Why the holder of a lock file ``age`` seconds after its last heartbeat is gone, or
        None while it may be alive (see the module docstring)."""
        if holder is None and age > NO_HOLDER_STALE_S and self._names_no_holder():
            return "its lock file names no holder (empty or damaged)"
        if holder is not None and self.stale_if is not None:
            why = self.stale_if(holder)
            if why:
                return why
        if holder is not None and in_this_pid_space(holder):
            pid = holder.get("pid")
            if isinstance(pid, int) and not pid_alive(pid, holder.get("start")):
                return "its holder is dead"
            return None
        if age > self.foreign_stale_s:
            return f"not refreshed for {age:.0f}s (over {self.foreign_stale_s:.0f}s), so its holder is taken to be gone"
        return None

    def _names_no_holder(self) -> bool:
        """Whether the lock file reads, and holds no holder record (one this user may not read
        names a holder it cannot see: not broken)."""
        try:
            return _parse(read_text(self.path)) is None
        except (OSError, UnicodeDecodeError):
            return False

    def _stale(self, holder: HolderRecord | None, age: float) -> bool:
        why = self.stale_reason(holder, age)
        if why is None:
            return False
        if holder is None or in_this_pid_space(holder):
            log.warning("breaking the stale soft lock %s of %s: %s", self.path, _describe(holder), why)
        else:
            log.warning(
                "BREAKING THE SOFT LOCK %s held by %s: %s; if it is in fact alive, two holders may now run at once",
                self.path,
                _describe(holder),
                why,
            )
        return True

    def _break(self, stale: HolderRecord | None) -> None:
        aside = beside(self.path, "", f".stale.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else broke it first
        try:
            moved = _parse(read_text(aside))
        except (OSError, ValueError):  # gone, or not text
            moved = None
        same = (moved is None and stale is None) or (
            moved is not None and stale is not None and moved.get("token") == stale.get("token")
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
                os.utime(self.path, follow_symlinks=False)
            except OSError:
                log.warning("could not refresh the soft lock %s (was it deleted?)", self.path)


# ---------------------------------------------------------------------------- both kinds


class MergeLock:
    """Context manager: the hard or soft lock on ``path``, ``LockTimeout`` naming the file."""

    def __init__(self, path: Path, kind: str, timeout: float, sweep: Path | None = None) -> None:
        """``sweep``: the sweep directory that merges (the command that merges elsewhere names it)."""
        self.path, self.kind, self.timeout, self.sweep = Path(path), kind, timeout, sweep
        self._lock: SoftLock | filelock.BaseFileLock | None = None

    def __enter__(self) -> MergeLock:
        try:
            return self._acquire()
        except OSError as exc:  # the folder cannot hold the lock file: read-only, immutable, gone
            raise ResultsError(
                f"cannot create the lock file {self.path} ({exc.strerror or exc}); {self._why()}"
            ) from None

    def _why(self) -> str:
        """What stands in the lock file's way: a folder where it goes, a file where its folder
        goes, or a folder that takes no new files (the nearest folder of its path that exists: the
        folders below it, which a merge makes, are not there yet)."""
        elsewhere = f"merge into another folder (`{PROG} merge {word(self.sweep or 'SWEEP')} --output FILE`)"
        if self.path.is_dir():
            return f"a directory has its name: move it away, or {elsewhere}"
        blocking = next((p for p in reversed(self.path.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            return f"{blocking} is a file, where a folder belongs: name an output in a folder, or {elsewhere}"
        folder = next((p for p in self.path.parents if p.is_dir()), self.path.parent)
        return f"the folder {folder} is not writable: make it writable, or {elsewhere}"

    def _acquire(self) -> MergeLock:
        if self.kind == "soft":
            self._lock = SoftLock(self.path, self.timeout)
            self._lock.on_wait = lambda holder: self._waiting(_describe(holder))
            self._lock.acquire()
            return self
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        # filelock retries a lock file it cannot create (ENOENT in a folder like /proc) as if
        # another process held it, until the timeout: made once here, its OSError is raised at once
        refuse_odd(self.path)  # filelock would take a pipe or a device for its lock file
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644))
        self._lock = filelock.FileLock(str(self.path), timeout=self.timeout)
        try:
            try:
                self._lock.acquire(blocking=False)
            except filelock.Timeout:
                self._waiting("another process")
                self._lock.acquire()
        except filelock.Timeout:
            raise LockTimeout(
                f"could not take the lock {self.path} within {self.timeout:g}s; another merge into the same document "
                "is running (wait for it, or raise merge.lock_timeout_s)"
            ) from None
        return self

    def _waiting(self, holder: str) -> None:
        """Say once that the merge waits for the lock (it may wait up to its timeout)."""
        log.warning(
            "waiting for the lock %s, held by %s (another merge into the same document); at most %gs "
            "(merge.lock_timeout_s)",
            self.path,
            holder,
            self.timeout,
        )

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
