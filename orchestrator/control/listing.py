"""Sweeps under a folder, and a unit's log: what ``tilesweep ls`` and ``tilesweep logs`` read.

``ls`` finds every sweep directory under a folder (a directory holding ``sweep.json``; the
search does not descend into a sweep directory), and every plan cut short before its
``sweep.json`` was written (``sweep_paths.cut_short``), and asks SLURM once for all of them (one
squeue + one sacct over every sweep's arrays), so listing many sweeps costs what one
``status`` costs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import PROG, counted, word
from orchestrator.control.history import History, read_history
from orchestrator.control.scheduler import QUERY_ENV, array_of, expand_indices, queries_disabled, query, task_of_raw
from orchestrator.control.status import SweepStatus, sweep_status
from orchestrator.control.status_model import FAILED
from orchestrator.control.why import NOT_TAKEN
from orchestrator.errors import SweepDirError, TilesweepError
from orchestrator.store import carried
from orchestrator.store.filekinds import holds_file
from orchestrator.store.files import ACCESS_ERRNOS, cannot_access, misplaced
from orchestrator.store.sweep_paths import cut_short, finish_command
from orchestrator.store.sweepdir import SWEEP_FILE, SweepDir

MAX_DEPTH = 4


@dataclass
class Listed:
    """One sweep found by ``list_sweeps``: its status, or why it could not be read, or, for a plan
    cut short before its ``sweep.json`` was written, the commands that finish it."""

    path: Path
    status: SweepStatus | None = None
    error: str | None = None
    finish: str | None = None


def find_sweeps(folder: Path, max_depth: int = MAX_DEPTH, unreadable: list[Listed] | None = None) -> list[Path]:
    """Sweep directories under ``folder`` (itself included), sorted, at most ``max_depth`` deep;
    a folder this user may not read (which may be a sweep directory), and a plan cut short before
    its ``sweep.json`` was written, go to ``unreadable``."""
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
        if unreadable is not None and cut_short(path):
            unreadable.append(Listed(path=path, finish=finish_command(path)))
            dirs[:] = []
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
# a SLURM job as squeue and sacct print it without a task: an array's id ("6343"), the final merge
# job's, a one-task array's; a unit's position in the index is spelled so too
JOB_ID = re.compile(r"\d+")
# an array's tasks that wait to start as squeue prints them, in one row: ``6343_[0-2%1]``, ``6343_[1,4-5]``
PENDING_TASKS = re.compile(r"(\d+)_\[([0-9,%-]*)\]")


@dataclass
class SweepJobs:
    """The SLURM jobs of a sweep as ``jobs.jsonl`` records them, every submission kept (a task
    that was requeued keeps its id; one ``resume`` replaced still ran)."""

    tasks: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # task id -> unit -> its entry
    arrays: dict[str, list[str]] = field(default_factory=dict)  # array id -> its task ids
    merges: dict[str, dict[str, Any]] = field(default_factory=dict)  # merge job id -> its entry

    @classmethod
    def read(cls, sd: SweepDir) -> SweepJobs:
        jobs = cls()
        for entry in sd.job_history():
            jid = str(entry.get("job_id") or "")
            if not jid:
                continue
            if entry.get("event") == "merge_job":
                jobs.merges[jid] = entry
            elif entry.get("event") is None and "unit" in entry and entry.get("executor", "slurm") == "slurm":
                jobs.tasks.setdefault(jid, {})[entry["unit"]] = entry
                listed = jobs.arrays.setdefault(array_of(jid), [])
                if jid not in listed:
                    listed.append(jid)
        return jobs

    def known(self) -> str:
        """The jobs as a refusal names them after the sweep: "whose jobs are" each array with its
        tasks and each merge job, or that it never went to SLURM."""
        said = []
        for array, tasks in self.arrays.items():
            span = tasks[0] if len(tasks) == 1 else f"{tasks[0]} to {tasks[-1]}"
            said.append(f"array {array} ({counted(len(tasks), 'task')}: {span})")
        said += [f"merge job {m}" for m in self.merges]
        if not said:
            return "which never went to SLURM"
        return "whose jobs are " + ", ".join(
            said[:_SHOWN] + ([f"{len(said) - _SHOWN} more"] if len(said) > _SHOWN else [])
        )


_SHOWN = 6  # the jobs a refusal names before it says how many more


def log_of(sd: SweepDir, key: str, *, task: bool = False) -> Path:
    """The log ``tilesweep logs`` prints for ``key``: a unit's (``unit_log``); for a SLURM task id
    (``TASK_ID``) the log of the unit that task ran, or its own log where it ran several (a
    whole-node task's GPUs take several units) or ``task`` asks for it; for a number past the unit
    index, a job id as squeue and sacct print it (``JOB_ID``): the final merge job's log, or a
    one-task array's task's (an array of several is refused, naming its tasks), or, where no unit
    id begins with it, an array task's own job id (``task_of_raw``). Pending tasks as squeue shows
    them (``PENDING_TASKS``) are refused naming a task to give; a key that names none of these is
    refused naming the sweep's jobs."""
    if TASK_ID.fullmatch(key):
        return _task_log(sd, key, SweepJobs.read(sd), task=task)
    pending = PENDING_TASKS.fullmatch(key)
    if pending is not None:
        raise _pending_tasks(sd, key, pending[1], expand_indices(pending[2]))
    if not JOB_ID.fullmatch(key) or int(key) < len(sd.unit_index()):  # a position in the index first
        return unit_log(sd, key, task=task)
    jobs = SweepJobs.read(sd)
    if key in jobs.merges:
        return _merge_log(sd, key, jobs.merges[key])
    tasks = jobs.arrays.get(key, [])
    if len(tasks) == 1:
        return _task_log(sd, tasks[0], jobs, task=task)
    if tasks:
        shown = _some(tasks)
        raise SweepDirError(
            f"job {key} of {sd.root} is an array of {len(tasks)} tasks ({shown}), each with its own log: name one, "
            f"as `{PROG} logs {word(sd.root)} {tasks[0]}`; `{PROG} status {word(sd.root)}` shows which unit each ran"
        )
    try:
        sd.resolve_unit(key)
    except SweepDirError as exc:
        raw_of = task_of_raw(key) if jobs.arrays else None
        if raw_of in jobs.tasks:
            return _task_log(sd, raw_of, jobs, task=task)
        if raw_of is not None:
            raise SweepDirError(
                f"{key} is the job id SLURM gave task {raw_of} (sacct's JobIDRaw), no task of {sd.root}, {jobs.known()}"
            ) from None
        if jobs.arrays or jobs.merges:
            known, unasked = jobs.known(), _not_asked(key) if jobs.arrays else ""
            raise SweepDirError(f"{key} is no SLURM job of {sd.root}, {known}; {unasked}{exc.message}") from None
        raise
    return unit_log(sd, key, task=task)


def _not_asked(key: str) -> str:
    """What a refusal of ``key`` adds where SLURM was not asked whether it is one of the sweep's
    tasks by its own id (``task_of_raw``): that it was not, and how to ask it."""
    if queries_disabled() is None:
        return ""
    return (
        f"SLURM was not asked whether {key} is a task's own job id (sacct's JobIDRaw), as {QUERY_ENV}=0 "
        f"says: run it again without {QUERY_ENV}=0 to ask; "
    )


def _some(tasks: list[str]) -> str:
    """Tasks as a line names them: the first three and the last."""
    return ", ".join(tasks[:3]) + (f", ... {tasks[-1]}" if len(tasks) > 3 else "")


def _pending_tasks(sd: SweepDir, key: str, array: str, indices: list[int]) -> SweepDirError:
    """The refusal of ``key``, tasks of ``array`` that wait to start as squeue shows them in one
    row: none has a log yet, and ``logs`` takes one task's id (the sweep's tasks named)."""
    jobs = SweepJobs.read(sd)
    ours = jobs.arrays.get(array, [])
    if not ours:
        return SweepDirError(f"{key}: array {array} is no SLURM job of {sd.root}, {jobs.known()}")
    named = [t for t in (f"{array}_{i}" for i in indices) if t in ours] or ours
    where = word(sd.root)
    return SweepDirError(
        f"{key} is how squeue shows the tasks of array {array} that wait to start ({_some(named)}), and a task has a "
        f"log once it starts: give one task's id, as `{PROG} logs {where} {named[0]}`; `{PROG} status {where}` shows "
        "which unit each runs"
    )


def _task_log(sd: SweepDir, key: str, jobs: SweepJobs, *, task: bool) -> Path:
    """The log of SLURM task ``key``: that of the one unit it ran, else the task's own."""
    ran = jobs.tasks.get(key, {})  # unit -> its job in that task (a requeued task keeps its id)
    status = f"`{PROG} status {word(sd.root)}`"
    if not ran:
        raise SweepDirError(
            f"{key} is no SLURM task of {sd.root}, {jobs.known()}: none of its units ran in it; {status} "
            "shows each unit's task in its job column, and its unit id first"
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


def _merge_log(sd: SweepDir, key: str, entry: dict[str, Any]) -> Path:
    """The log of the sweep's final merge job ``key``, refused in one line while there is none."""
    stderr = entry.get("stderr")
    if stderr and Path(stderr).is_file():
        return Path(stderr)
    raise SweepDirError(
        f"merge job {key} of {sd.root} has no log ({stderr or 'none recorded'}): it has not started yet (it waits for "
        f"the units' arrays), or its log was removed; `{PROG} status {word(sd.root)}` shows the job"
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
        if path and holds_file(Path(path)):  # a pipe there is named as what it is, not as a log that is gone
            return Path(path)
    what = "task log" if task else "log"
    status = f"`{PROG} status {word(sd.root)}` shows the unit"
    if not job and any(e.get("id") == uid and e.get("origin") == carried.ORIGIN for e in sd.unit_index()):
        raise SweepDirError(
            f"unit {uid} of {sd.root} has no {what}: it holds the records planning carried from earlier documents "
            f"({carried.REUSE_FILE} names them), which no worker ran; {status}"
        )
    if sd.partial_path(uid).exists() or sd.marker_path(uid).exists():  # it ran: its log is gone
        gone = ", ".join(str(p) for p in candidates if p) or "none recorded"
        raise SweepDirError(f"unit {uid} of {sd.root} ran, but its {what} is gone ({gone}); {status}")
    if not job:
        raise SweepDirError(f"unit {uid} of {sd.root} has no {what}: it was never submitted; {status}")
    if not task and shared and job.get("stderr") and Path(job["stderr"]).is_file():
        tasklog = f"`{PROG} logs {word(sd.root)} {unit_key} --task` prints the task's log"
        ended = _never_taken(sd, uid, str(job.get("job_id")))
        if ended is not None:
            raise SweepDirError(f"unit {uid} of {sd.root} has no log: {ended}; {tasklog}")
        raise SweepDirError(
            f"unit {uid} of {sd.root} has no log yet: its task (job {job.get('job_id')}) runs, and the unit waits for "
            f"one of the task's GPUs; {tasklog}"
        )
    said = _unlogged(sd, uid)
    if said is not None:
        raise SweepDirError(f"unit {uid} of {sd.root} has no {what}: {said}")
    raise SweepDirError(
        f"unit {uid} of {sd.root} has no {what} yet: its job {job.get('job_id')} has not started; {status}"
    )


def _never_taken(sd: SweepDir, uid: str, job_id: str) -> str | None:
    """How a whole-node task's unit that none of its GPUs took ended, where its status (SLURM
    asked once) says the task (``job_id``) ended: its state and why, and what redoes its items;
    None while it waits for a GPU."""
    unit = next((u for u in sweep_status(sd).units if u.id == uid), None)
    if unit is None or unit.state not in FAILED:
        return None
    if unit.detail and NOT_TAKEN in unit.detail:  # status said it of the unit already
        return unit.detail
    said = unit.detail or unit.state
    if not said.startswith(unit.state):
        said = f"{unit.state}: {said}"
    then = f"`{PROG} resume {word(sd.root)}` redoes its items"
    if unit.resumed:
        then = "a resume gave its items to later units"
    return f"its task (job {job_id}) ended {NOT_TAKEN} ({said}), so none of it ran; {then}"


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
