"""Leases: one worker per unit, one ``tilesweep run`` and one pre-flight lowering per sweep at a time.

A lease is the soft lock of ``locks`` (a lock *file* created atomically, naming its holder:
host, boot id, pid namespace, pid and the pid's start time, refreshed by a heartbeat), so it
works on the shared filesystems sweep directories live on, and a holder that died is told
apart from a live one the same way as for the merge lock. Three kinds:

- ``SWEEP/leases/<unit>.lease``: held by the worker of a unit for the unit's whole run
  (``jobs.worker.run_unit``). A second worker on the same unit (a second ``run``, a stray
  requeue, a resumed unit whose old worker still runs, a unit started by hand) is refused
  before it writes anything. The lease names the worker's GPU and SLURM task, which
  ``status`` shows.
- ``SWEEP/run.lease``: held by ``tilesweep run`` while it runs or waits, or by ``resume`` while
  it runs the sweep here, naming that command; a second ``run`` of the same sweep follows the
  first one's progress instead of starting work beside it, a second ``resume`` is refused.
- ``SWEEP/lowering.lease``: held by ``plan --lower --sweep-dir`` while it lowers; a second one
  waits for it, then lowers only the configs the first left without a verdict; ``run``,
  ``submit`` and ``resume`` wait for it before they start a unit (``wait_for_lowering``), and so
  does ``wait`` before it starts a sweep's next round; the final merge job leaves that round to
  ``wait`` or ``resume`` while one lowers (``live_lowering``).

A holder on another host is taken to be gone after ``FOREIGN_STALE_S`` without a heartbeat
(two minutes, not the merge lock's hour: a unit's lease must not block a resumed unit for
long after its node died). A holder that was an earlier run of the *same* SLURM job is gone
for certain (SLURM ends a job's processes before it requeues it), so a requeued task takes
its own lease over at once.

Why not filelock's ``SoftFileLease`` (``store/locks.py`` has the full account, with the
tests that show it): it takes the lease of a live holder on this host whose heartbeat stalls
for ``lease_duration`` (a ``tilesweep run`` stopped with Ctrl-Z, a worker under a debugger),
and then two runs drive one sweep, or two workers run one unit;
it takes a dead node's lease only after the contender itself watched it unchanged for a whole
``lease_duration``, where a worker tries once; its marker has no room for the GPU and SLURM
task ``status`` shows; and it cannot be told that a holder is gone for a reason only the
caller knows (the requeued SLURM task above).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator import PROG
from orchestrator.errors import LeaseHeld, LockTimeout, SweepDirError
from orchestrator.store.files import write_advice
from orchestrator.store.locks import HEARTBEAT_S, HolderRecord, SoftLock, StaleIf

log = logging.getLogger(__name__)

LEASES = "leases"
RUN_LEASE = "run.lease"
LOWERING_LEASE = "lowering.lease"
FOREIGN_STALE_S = 120.0  # 24 missed heartbeats


def unit_lease_path(root: Path, unit_id: str) -> Path:
    return Path(root) / LEASES / f"{unit_id}.lease"


def run_lease_path(root: Path) -> Path:
    return Path(root) / RUN_LEASE


@dataclass
class Holder:
    """Who holds a lease, read from its file: the holder's fields and the heartbeat's age."""

    path: Path
    fields: HolderRecord
    age_s: float
    live: bool

    def describe(self) -> str:
        f = self.fields
        text = f"pid {f.get('pid')} on {f.get('host')}"
        if f.get("job"):
            text += f", SLURM task {f['job']}"
        if f.get("gpu") not in (None, ""):
            text += f", GPU {f['gpu']}"
        return text + f", since {f.get('created')}"

    def command(self) -> str:
        """The command that holds the lease, as a message names it (`` `tilesweep resume` ``), or
        ``tilesweep command`` where the file names none (a lease of an older tilesweep)."""
        named = self.fields.get("command")
        return f"`{PROG} {named}`" if isinstance(named, str) and named.strip() else f"{PROG} command"


def _same_job(job: str | None) -> StaleIf:
    """A holder of the asker's own SLURM task is an earlier run of it, which SLURM ended."""

    def stale_if(holder: HolderRecord) -> str | None:
        if job and holder.get("job") == job:
            return f"it was an earlier run of this same SLURM job {job}, which SLURM ended before requeueing it"
        return None

    return stale_if


def read_holder(path: Path, job: str | None = None) -> Holder | None:
    """The holder of a lease file, or None when there is none (or it is unreadable). ``live``
    says whether it may still run (``SoftLock.stale_reason`` decides, with ``job`` the
    asker's own SLURM task: a holder of the same task is an earlier run of it)."""
    lock = SoftLock(path, 0, foreign_stale_s=FOREIGN_STALE_S, stale_if=_same_job(job))
    fields, age = lock.holder()
    if age is None or fields is None:
        return None
    return Holder(Path(path), fields, age, lock.stale_reason(fields, age) is None)


@contextmanager
def lease(path: Path, what: str, *, extra: HolderRecord | None = None, job: str | None = None) -> Iterator[None]:
    """Hold the lease at ``path`` for the block, or raise ``LeaseHeld`` at once (naming
    ``what`` and its live holder) when another live process holds it."""
    lock = SoftLock(
        path, 0, extra={**(extra or {}), "job": job}, foreign_stale_s=FOREIGN_STALE_S, stale_if=_same_job(job)
    )
    try:
        lock.acquire()
    except LockTimeout:
        holder = read_holder(path, job)
        who = holder.describe() if holder is not None else "another process"
        age = f", alive {holder.age_s:.0f}s ago" if holder is not None else ""
        raise LeaseHeld(f"{what} is already held by {who}{age} (lease {path})") from None
    except OSError as exc:
        raise SweepDirError(
            f"cannot take the lease {path} of {what} ({exc.strerror or exc}): {write_advice(exc)}"
        ) from None
    try:
        yield
    finally:
        lock.release()


def unit_lease(root: Path, unit_id: str, *, gpu: str | None, job: str | None) -> AbstractContextManager[None]:
    """The lease a worker holds while it runs ``unit_id`` (see the module docstring)."""
    return lease(
        unit_lease_path(root, unit_id), f"unit {unit_id} of {root}", extra={"unit": unit_id, "gpu": gpu}, job=job
    )


def run_lease(root: Path, command: str) -> AbstractContextManager[None]:
    """The lease a command holds while it runs a sweep or waits for it: ``command``, which its
    file names for whoever finds the sweep held (``run``, or ``resume`` here)."""
    return lease(run_lease_path(root), f"the sweep in {root}", extra={"command": command})


def lowering_lease_path(root: Path) -> Path:
    return Path(root) / LOWERING_LEASE


@contextmanager
def lowering_lease(root: Path, on_wait: Callable[[str], None]) -> Iterator[None]:
    """The lease ``plan --lower --sweep-dir`` holds while it lowers the sweep's configs: a second
    one waits for it (``on_wait``, told once, is given who holds it), then lowers only what the
    first left without a verdict."""
    path = lowering_lease_path(root)
    lock = SoftLock(path, math.inf, poll=0.5, extra={"command": "plan --lower"}, foreign_stale_s=FOREIGN_STALE_S)
    lock.on_wait = lambda fields: on_wait(Holder(path, fields, 0.0, True).describe() if fields else "another process")
    try:
        lock.acquire()
    except OSError as exc:
        raise SweepDirError(
            f"cannot take the lease {path} of the lowering of {root} ({exc.strerror or exc}): {write_advice(exc)}"
        ) from None
    try:
        yield
    finally:
        lock.release()


def live_lowering(root: Path) -> Holder | None:
    """The live ``plan --lower`` that holds the sweep's lowering lease, or None."""
    holder = read_holder(lowering_lease_path(root))
    return holder if holder is not None and holder.live else None


def wait_for_lowering(root: Path, on_wait: Callable[[str], None]) -> None:
    """Return once no live ``plan --lower`` holds the sweep's lowering lease (``on_wait``, told
    once, is given who holds it): a unit started before its verdicts are all written could
    compile on a GPU the configs it is about to refuse."""
    holder = live_lowering(root)
    if holder is None:
        return
    on_wait(holder.describe())
    wait_released(lowering_lease_path(root), poll_s=0.5)


def live_unit_holders(root: Path, unit_ids: list[str]) -> dict[str, Holder]:
    """Units whose lease a live worker holds (one small read per unit that has a lease file)."""
    out: dict[str, Holder] = {}
    folder = Path(root) / LEASES
    try:
        present = {p.name for p in folder.iterdir()}
    except FileNotFoundError:
        return out
    for uid in unit_ids:
        if f"{uid}.lease" in present:
            holder = read_holder(folder / f"{uid}.lease")
            if holder is not None and holder.live:
                out[uid] = holder
    return out


def wait_released(path: Path, *, poll_s: float = 1.0, timeout_s: float | None = None) -> bool:
    """Block until no live process holds the lease at ``path``; False on timeout."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        holder = read_holder(path)
        if holder is None or not holder.live:
            return True
        if end is not None and time.monotonic() > end:
            return False
        time.sleep(min(poll_s, HEARTBEAT_S))
