"""Sweeps under a folder, and a unit's log: what ``tilesweep ls`` and ``tilesweep logs`` read.

``ls`` finds every sweep directory under a folder (a directory holding ``sweep.json``; the
search does not descend into a sweep directory) and asks SLURM once for all of them (one
squeue + one sacct over every sweep's arrays), so listing many sweeps costs what one
``status`` costs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import PROG, word
from orchestrator.control.history import History, read_history
from orchestrator.control.scheduler import query
from orchestrator.control.status import SweepStatus, sweep_status
from orchestrator.control.status_model import FAILED
from orchestrator.errors import SweepDirError, TilesweepError
from orchestrator.store.files import ACCESS_ERRNOS, cannot_access, misplaced
from orchestrator.store.sweepdir import SWEEP_FILE, SweepDir

MAX_DEPTH = 4


@dataclass
class Listed:
    """One sweep found by ``list_sweeps``: its status, or why it could not be read."""

    path: Path
    status: SweepStatus | None = None
    error: str | None = None


def find_sweeps(folder: Path, max_depth: int = MAX_DEPTH, unreadable: list[Listed] | None = None) -> list[Path]:
    """Sweep directories under ``folder`` (itself included), sorted, at most ``max_depth`` deep;
    a folder this user may not read (which may be a sweep directory) goes to ``unreadable``."""
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise SweepDirError(f"{folder} {what}; pass the folder that holds your sweep directories")
    found: list[Path] = []
    base = len(folder.parts)

    def refused(exc: OSError) -> None:
        if unreadable is not None and exc.errno in ACCESS_ERRNOS and exc.filename is not None:
            unreadable.append(Listed(path=Path(exc.filename), error=cannot_access(exc)))

    for here, dirs, files in os.walk(folder, onerror=refused):
        path = Path(here)
        if SWEEP_FILE in files:
            found.append(path)
            dirs[:] = []  # a sweep's own folders hold no sweeps
            continue
        if len(path.parts) - base >= max_depth:
            dirs[:] = []
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found)


def list_sweeps(folder: Path, *, query_slurm: bool = True) -> list[Listed]:
    """Every sweep under ``folder`` with its status; SLURM asked once for all of them."""
    listed: list[Listed] = []
    opened: list[tuple[SweepDir, History]] = []
    for path in find_sweeps(folder, unreadable=listed):
        try:
            sd = SweepDir.open(path)
            opened.append((sd, read_history(sd)))
        except (TilesweepError, OSError) as exc:
            listed.append(Listed(path=path, error=_why(exc)))
    jobs = [j for _, h in opened for j in h.slurm_jobs + [str(m["job_id"]) for m in h.merge_jobs]]
    view = query(jobs) if query_slurm and jobs else None
    for sd, _ in opened:
        try:
            listed.append(Listed(path=sd.root, status=sweep_status(sd, query_slurm=False, view=view)))
        except (TilesweepError, OSError) as exc:
            listed.append(Listed(path=sd.root, error=_why(exc)))
    return sorted(listed, key=lambda x: str(x.path))


def _why(exc: TilesweepError | OSError) -> str:
    """Why a sweep could not be read: a damaged file, one this user may not read, or a file
    where a folder belongs (or the other way round); any other error is raised again."""
    if isinstance(exc, TilesweepError):
        return exc.message
    if exc.filename is not None and exc.errno in ACCESS_ERRNOS:
        return cannot_access(exc)
    why = misplaced(exc)
    if why is None:
        raise exc
    return why


# a SLURM array task as ``status`` shows it in its job column ("6343_0"), which no unit id spells
TASK_ID = re.compile(r"\d+_\d+")


def log_of(sd: SweepDir, key: str, *, task: bool = False) -> Path:
    """The log ``tilesweep logs`` prints for ``key``: a unit's (``unit_log``), or for a SLURM task
    id (``TASK_ID``) the log of the unit that task ran, or its own log where it ran several (a
    whole-node task's GPUs take several units) or ``task`` asks for it."""
    if not TASK_ID.fullmatch(key):
        return unit_log(sd, key, task=task)
    ran: dict[str, dict[str, Any]] = {}  # unit -> its job in that task (a requeued task keeps its id)
    for entry in sd.job_history():
        if entry.get("event") is None and "unit" in entry and str(entry.get("job_id")) == key:
            ran[entry["unit"]] = entry
    status = f"`{PROG} status {word(sd.root)}`"
    if not ran:
        raise SweepDirError(
            f"{key} is no SLURM task of {sd.root}: none of its units ran in it; {status} shows each unit's task "
            "in its job column, and its unit id first"
        )
    if len(ran) == 1 and not task:
        return unit_log(sd, next(iter(ran)))
    stderr = next(iter(ran.values())).get("stderr")
    if stderr and Path(stderr).is_file():
        return Path(stderr)
    units = f"unit {next(iter(ran))}" if len(ran) == 1 else f"units {', '.join(ran)}"
    raise SweepDirError(
        f"task {key} of {sd.root} ran {units}, and its own log ({stderr or 'none recorded'}) is not there (not "
        f"started yet, or removed); {status} shows the task, `{PROG} logs {word(sd.root)} UNIT` a unit's log"
    )


def unit_log(sd: SweepDir, unit_key: str, *, task: bool = False) -> Path:
    """The log of a unit (``task``: the log of the SLURM task that ran it last), refused in
    one line when there is none yet."""
    uid = sd.resolve_unit(unit_key)
    job = read_history(sd).latest.get(uid) or {}
    if task and job and job.get("executor", "slurm") != "slurm":
        raise SweepDirError(
            f"unit {uid} of {sd.root} ran here ({job['executor']} executor), not as a SLURM task: it has no task log; "
            f"`{PROG} logs {word(sd.root)} {unit_key}` prints its log"
        )
    shared = (job.get("units_in_task") or 1) > 1  # a whole-node task's log is its units', not this one's
    own = [sd.unit_log(uid), job.get("log")] + ([] if shared else [job.get("stderr")])
    candidates = [job.get("stderr"), job.get("log")] if task else own
    for path in candidates:
        if path and Path(path).is_file():
            return Path(path)
    what = "task log" if task else "log"
    status = f"`{PROG} status {word(sd.root)}` shows the unit"
    if sd.partial_path(uid).exists() or sd.marker_path(uid).exists():  # it ran: its log is gone
        gone = ", ".join(str(p) for p in candidates if p) or "none recorded"
        raise SweepDirError(f"unit {uid} of {sd.root} ran, but its {what} is gone ({gone}); {status}")
    if not job:
        raise SweepDirError(f"unit {uid} of {sd.root} has no {what}: it was never submitted; {status}")
    if not task and shared and job.get("stderr") and Path(job["stderr"]).is_file():
        raise SweepDirError(
            f"unit {uid} of {sd.root} has no log yet: its task (job {job.get('job_id')}) runs, and the unit waits for "
            f"one of the task's GPUs; `{PROG} logs {word(sd.root)} {unit_key} --task` prints the task's log"
        )
    said = _unlogged(sd, uid)
    if said is not None:
        raise SweepDirError(f"unit {uid} of {sd.root} has no {what}: {said}")
    raise SweepDirError(
        f"unit {uid} of {sd.root} has no {what} yet: its job {job.get('job_id')} has not started; {status}"
    )


def _unlogged(sd: SweepDir, uid: str) -> str | None:
    """Why a submitted unit with no log has none, where its status (SLURM asked once) says its
    job ended: cancelled before it started (by ``tilesweep cancel`` or ``scancel``), or ended
    without writing a log (``unit_state.NO_LOG``); None while it waits to start."""
    unit = next((u for u in sweep_status(sd).units if u.id == uid), None)
    if unit is None or unit.state not in FAILED:
        return None
    if unit.state == "cancelled":
        return (
            f"its job {unit.job_id} was cancelled before it started; `{PROG} resume {word(sd.root)}` redoes its items"
        )
    return f"{unit.state} (job {unit.job_id})" + (f": {unit.detail}" if unit.detail else "")
