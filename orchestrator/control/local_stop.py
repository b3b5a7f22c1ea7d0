"""Stopping what runs a sweep on this machine: ``tilesweep cancel`` of a sweep run by the local
executor.

Two kinds of process run a local sweep. A ``tilesweep run`` (or ``resume``) in the foreground
holds the sweep's run lease and starts each unit's worker itself: it is sent SIGTERM, which it
takes as a Ctrl-C at its own terminal (its workers abandon their configs in flight, its units
read as interrupted, its terminal says so), also where it was started with SIGINT ignored
(``nohup``, a script's ``&``). A unit started by ``resume --no-wait``
runs under a local controller that outlives the command (and a worker whose run was killed
outright runs on alone): each is sent SIGTERM, which the controller hands to its worker. A
worker no job of the sweep names, which holds its unit's lease on this machine (one run by hand
as ``python -m jobs.worker SWEEP UNIT``, or by a site's own launcher), is sent SIGTERM too.

A pid is signalled only when it is the process the sweep's files name: the run lease's holder
in this pid space with the start time it recorded, or a local controller or worker whose
command line names this sweep directory (read from /proc; where there is none, nothing is
signalled and the pid is reported instead), or the holder of a unit's lease in this pid space
with the start time it recorded whose command line is such a worker's. Nothing here prints.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.control.dispatch.local_procs import STOP_WAIT_S
from orchestrator.control.status_model import SweepStatus
from orchestrator.store.leases import live_unit_holders, read_holder, run_lease_path
from orchestrator.store.pidspace import in_this_pid_space, pid_alive
from orchestrator.store.sweepdir import SweepDir

# the modules a local unit's processes run (``local_controller``: its argument is the sweep's
# logs folder; ``local_worker``: the sweep directory)
_MODULES = {
    "orchestrator.control.dispatch.local_controller": "logs",
    "orchestrator.control.dispatch.local_worker": "root",
    "jobs.worker": "root",
    "jobs": "root",
}
_LOOK_S = 0.1  # how often the stop looks whether the processes have ended
_GRACE_S = 5.0  # beyond the workers' own time to stop (``STOP_WAIT_S``)


@dataclass
class LocalStopped:
    """What ``stop_local`` did: the foreground run it stopped (its pid), the pids of detached
    units' processes it stopped, a run it could not reach (its holder, described) and the pids
    that had not ended when it stopped waiting."""

    runner: int | None = None
    detached: list[int] = field(default_factory=list)
    elsewhere: str | None = None
    lingering: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.runner is not None or bool(self.detached) or self.elsewhere is not None


def stop_local(sd: SweepDir, st: SweepStatus) -> LocalStopped:
    """Stop the foreground run of ``sd`` and its detached local units (``st``: its status), and
    wait until they have ended (sleeping between looks)."""
    done = LocalStopped()
    holder = read_holder(run_lease_path(sd.root))
    if holder is not None and holder.live:
        pid, start = holder.fields.get("pid"), holder.fields.get("start")
        here = in_this_pid_space(holder.fields)
        if here and isinstance(pid, int) and pid_alive(pid, start):
            _signal(pid, signal.SIGTERM)
            done.runner = pid
            done.lingering += _wait_ended([pid], start)
        elif not here:
            done.elsewhere = holder.describe()
    pids = [pid for pid in _local_pids(st) if runs_sweep(pid, sd)]
    pids += [pid for pid in _unit_holders(sd, st, pids) if runs_sweep(pid, sd)]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    done.detached = pids
    done.lingering += _wait_ended(pids, None)
    return done


def _local_pids(st: SweepStatus) -> list[int]:
    """The pids of the sweep's units that run under the local executor, as its jobs say."""
    pids = []
    for u in st.units:
        if u.state == "running" and u.executor == "local" and str(u.job_id or "").isdigit():
            pids.append(int(str(u.job_id)))
    return pids


def _unit_holders(sd: SweepDir, st: SweepStatus, signalled: list[int]) -> list[int]:
    """The pids of the live workers in this pid space that hold the lease of a running unit
    whose job is none of ``signalled`` and no SLURM task (``scancel`` ends those): a worker run
    by hand or by a site's launcher, which no job of the sweep names."""
    jobs = {str(pid) for pid in signalled}
    stopped_by_job = {u.id for u in st.units if u.executor == "local" and u.job_id in jobs}
    running = [u.id for u in st.units if u.state == "running" and u.id not in stopped_by_job]
    pids = []
    for holder in live_unit_holders(sd.root, running).values():
        pid, start = holder.fields.get("pid"), holder.fields.get("start")
        if holder.fields.get("job") or not in_this_pid_space(holder.fields) or not isinstance(pid, int):
            continue
        if pid not in signalled and pid_alive(pid, start):
            pids.append(pid)
    return pids


def runs_sweep(pid: int, sd: SweepDir) -> bool:
    """Whether ``pid`` is a local controller or worker of ``sd`` (its command line, its path
    arguments read from its own working directory); False where /proc cannot say."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    args = [a.decode(errors="replace") for a in argv if a]
    for k, arg in enumerate(args[:-1]):
        if arg == "-m" and args[k + 1] in _MODULES:
            rest = args[k + 2 :]
            if not rest:
                return False
            want = sd.logs if _MODULES[args[k + 1]] == "logs" else sd.root
            where = rest[-1] if _MODULES[args[k + 1]] == "logs" else rest[0]
            return _same(cwd / where, want)
    return False


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass  # ended meanwhile, or not ours to signal: the wait below says which remain


def _wait_ended(pids: list[int], start: str | None) -> list[int]:
    """Wait until the processes ``pids`` have ended (their own stop included); those still
    there after ``STOP_WAIT_S`` and a grace."""
    deadline = time.monotonic() + STOP_WAIT_S + _GRACE_S
    left = list(pids)
    while left:
        left = [p for p in left if pid_alive(p, start)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(_LOOK_S)
    return left
