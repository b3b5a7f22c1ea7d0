"""What a unit that is not done is doing, from its last job and the scheduler's answer.

squeue first (live), then sacct (it lags the scheduler by 1-2 s). A pending array task
cancelled on its own leaves no record in either (docs/slurm-notes.md, surprise 4), so a
task that is in neither, of an array the scheduler does know, and that never started, is
cancelled: said at once, not after a minute. Only a task that never showed a sign of life
is judged so: a task that ran (its unit's log or partial written after its submission) and
has just left squeue may not be in sacct yet.

For a unit that ended without finishing, ``failure`` says why in the worker's own words
(``why``), or from the scheduler (out of memory, a signal), never just an exit code; a task
cancelled outside ``tilesweep cancel`` names who cancelled it where sacct does (``cancelled_by``).
"""

from __future__ import annotations

import os
import pwd
from typing import Any

from orchestrator import PROG
from orchestrator.control.history import cancelled_since, submitted_ts
from orchestrator.control.scheduler import NODES_OUT_REASON, SchedulerView, TaskState
from orchestrator.control.why import INTERRUPTED, died_under, exit_reason, last_word, never_taken, read_failure
from orchestrator.store.diskspace import FullDisk
from orchestrator.store.locks import HolderRecord
from orchestrator.store.pidspace import in_this_pid_space, pid_alive, process_start, process_stopped

# A job that is in neither squeue nor sacct this long after its submission (or after its
# unit last showed activity) is gone.
LOST_AFTER_S = 60.0
RUNNING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING", "STAGE_OUT", "SIGNALING", "STOPPED")


def slurm_state(
    job: dict[str, Any],
    view: SchedulerView | None,
    mtime: float | None,
    cancelled: dict[str, float],
    now: float,
    records: int,
) -> tuple[str, str | None]:
    """(state, detail) of a SLURM unit that is not done. ``mtime``: when its partial or log
    was last written (None: never), the sign that its task started."""
    jid = str(job["job_id"])
    submitted = submitted_ts(job) or 0.0
    if cancelled_since(cancelled, job):
        return "cancelled", f"cancelled with `{PROG} cancel`"
    if view is None or not view.asked:
        return ("running" if records else "pending"), "SLURM not asked; state guessed from the partial"
    ts = view.get(jid)
    if ts is None or (ts.source == "sacct" and ts.state == "PENDING" and view.squeue_ok):
        # squeue lists every pending task (-r): one only sacct calls pending has left the queue
        # since (sacct lags a few seconds), so it is judged as a task in neither
        return _in_neither(view, jid, submitted, mtime, now)
    state, detail = _from_task(ts, mtime, submitted, view.taken, jid)
    if state == "running" and (job.get("units_in_task") or 1) > 1 and not (mtime is not None and mtime >= submitted):
        # a whole-node task's GPUs take its units in turn: this one has not been taken yet
        return "pending", "its task is running; it waits for one of the task's GPUs"
    return state, detail


def _in_neither(
    view: SchedulerView, jid: str, submitted: float, mtime: float | None, now: float
) -> tuple[str, str | None]:
    started = mtime is not None and mtime >= submitted
    if not started and view.squeue_ok and view.sacct_ok and view.knows_array(jid):
        return "cancelled", "cancelled while pending (a pending task cancelled on its own leaves no record)"
    if started and now - (mtime or 0.0) < LOST_AFTER_S:
        where = "left squeue moments ago" if view.squeue_ok else "squeue could not be asked"
        return "running", f"{where}; not in sacct yet"
    if not started and now - submitted < LOST_AFTER_S:
        return "pending", "not yet in squeue or sacct"
    if not view.sacct_ok:
        return "failed", "not in squeue, and sacct could not be asked"
    return "cancelled", "in neither squeue nor sacct (a pending array task cancelled on its own leaves no record)"


# squeue's BeginTime, by whether the task had started: what it waits for
_BEGIN_TIME = {
    True: "SLURM requeued it (its node went down, or it was preempted or requeued) and it waits to start again",
    False: "it waits for the time SLURM lets it start (after a requeue, or sbatch --begin)",
}


def _nodes_out(reason: str) -> str:
    """What ``ReqNodeNotAvail`` (squeue's ``ReqNodeNotAvail, UnavailableNodes:vm``) means, and what
    a user can do about it: wait for the nodes, or run on others."""
    nodes = reason.partition("UnavailableNodes:")[2].strip()
    which = f"the nodes it needs ({nodes}) are" if nodes else "nodes it needs are"
    return (
        f"{NODES_OUT_REASON}: {which} down, drained or reserved; it starts once they return (`sinfo -R` says why "
        "they are out); to run it elsewhere, cancel it, then resume with executor.slurm_exclude naming them"
    )


def _from_task(ts: TaskState, mtime: float | None, submitted: float, asked: float, jid: str) -> tuple[str, str | None]:
    """``asked``: when the scheduler was asked (``wait`` asks it less often than it reads files);
    ``jid``: the task's id, for what releases it from a hold."""
    s = ts.state
    if s == "PENDING":
        ran = mtime is not None and mtime >= submitted
        if ran and mtime is not None and mtime > asked:  # it started after squeue said pending: it runs
            return "running", None
        reason = ts.reason if ts.reason not in ("", "None") else None
        if ts.reason == "JobHeldUser":
            reason = f"{ts.reason}: it is held, and starts once released: `scontrol release {jid}`"
        elif ts.reason == "JobHeldAdmin":
            reason = f"{ts.reason}: a SLURM administrator holds it; it starts once they release it"
        elif ts.reason == "BeginTime":  # a requeue (its node went down, a preemption, scontrol requeue), sbatch --begin
            reason = f"{ts.reason}: {_BEGIN_TIME[ran]}; it starts on its own"
        elif ts.reason_word == NODES_OUT_REASON:
            reason = _nodes_out(ts.reason)
        elif ts.stuck:
            reason = f"{ts.reason}: it cannot start as submitted (cancel it, then resume with other executor settings)"
        return ("requeued" if ran else "pending"), reason
    if s.startswith("REQUEUE"):
        return "requeued", s
    if s in RUNNING_STATES:
        return "running", None if s == "RUNNING" else s
    if s == "CANCELLED":
        return "cancelled", cancelled_by(ts.by)
    if s == "PREEMPTED":
        return "cancelled", s
    if s in ("TIMEOUT", "DEADLINE"):
        return "timed out", s
    if s == "COMPLETED":
        return "failed", "the job completed without finishing its items (stopped early; see its log)"
    if s == "OUT_OF_MEMORY":
        return "failed", "out of memory (SLURM ended the task at its memory limit: raise executor.mem_gb)"
    return "failed", f"{s} (exit {ts.exit_code})" if ts.exit_code else s


def cancelled_by(uid: str) -> str:
    """Who cancelled a task that ``tilesweep cancel`` did not: the user sacct names (``CANCELLED
    by UID``), by name where this machine knows the id; where it names nobody, that it was not
    ``tilesweep cancel``."""
    if not uid:
        return f"cancelled outside `{PROG} cancel` (scancel, or SLURM itself)"
    try:
        who = f"{pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
    except (KeyError, ValueError):
        who = f"uid {uid}"
    return f"cancelled by {who} with scancel, not `{PROG} cancel`"


def local_state(job: dict[str, Any], records: int) -> tuple[str, str | None]:
    """A unit run by the local executor (or the debug one, in the command's process): running
    while its process lives (the one that started at the time its job names, not a process that
    took its pid later), said stopped where /proc says that process is (``stopped_pid``); once it
    is gone, interrupted where its worker's log says a stop signal ended it, else failed
    (``failure`` then reads why: the worker's own reason, or the signal the run or controller
    that started it saw)."""
    if job.get("executor") == "local":
        try:
            pid = int(job.get("job_id"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pid = None
        if pid is not None:
            # its process as it started (a pid is recycled once its process ends), where the job
            # names this pid space; a job started elsewhere (or before jobs named it) by its pid alone
            start = job.get("start") if in_this_pid_space(job) else None
            if not pid_alive(pid, start):
                said = last_word(job.get("log"), str(job.get("unit")))
                if said is not None and said[0] == INTERRUPTED:
                    return INTERRUPTED, said[1]
                return "failed", "its local worker process is gone"
            if stopped_pid(job) is not None:
                return "running", f"local process {pid} is {stopped_line(pid)}"
            return "running", f"local process {pid}"
    if job.get("executor") == "debug" and isinstance(job.get("pid"), int) and in_this_pid_space(job):
        pid = job["pid"]
        if not pid_alive(pid, job.get("start")):  # the command that ran it in its own process has ended
            said = last_word(job.get("stderr"), str(job.get("unit")))
            if said is not None and said[0] == INTERRUPTED:
                return INTERRUPTED, said[1]
            return "failed", f"the debug run that ran it (pid {pid}) ended before the unit finished"
        if stopped_pid(job) is not None:
            return "running", f"the debug run that runs it (pid {pid}) is {stopped_line(pid)}"
        return "running", f"in the debug run, pid {pid}"
    return ("running" if records else "pending"), None


def stopped_pid(job: dict[str, Any]) -> int | None:
    """The process of a local or debug job, in this pid space, that /proc says is stopped
    (Ctrl-Z in the shell that runs it, a SIGSTOP): its unit records nothing until it is
    continued; None for any other job."""
    if not in_this_pid_space(job):
        return None
    pid = job.get("pid") if job.get("executor") == "debug" else job.get("job_id")
    try:
        pid = int(pid)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return pid if job.get("executor") in ("local", "debug") and process_stopped(pid) else None


def stopped_process(holder: HolderRecord) -> int | None:
    """The pid of the process a lease's ``holder`` names, where it is in this pid space, the
    process that started at the time it recorded, and /proc says it is stopped (Ctrl-Z, SIGSTOP)."""
    try:
        pid = int(holder.get("pid"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    start = holder.get("start")
    if not in_this_pid_space(holder) or not process_stopped(pid) or (start and process_start(pid) != start):
        return None
    return pid


def stopped_holder(holder: HolderRecord, detail: str | None) -> str | None:
    """``detail`` with what a unit's stopped worker is, where the live worker that holds its
    lease (``holder``: one ``run`` or ``resume`` started, one run by hand as ``python -m
    jobs.worker``, one a site's launcher started) is stopped (``stopped_process``); None where
    it is not."""
    pid = stopped_process(holder)
    if pid is None:
        return None
    return f"{detail}; its worker (pid {pid}) is {stopped_line(pid)}" if detail else f"pid {pid} is {stopped_line(pid)}"


def stopped_line(pid: int) -> str:
    """What a stopped process is, and how its user continues it."""
    return f"stopped (Ctrl-Z / SIGSTOP): `fg` in the shell that runs it resumes it, or `kill -CONT {pid}`"


# A task that ended with none of its log files there could not open them: SLURM opens them in
# the sweep directory before anything runs, and the step fails (its batch script ends COMPLETED,
# or FAILED by a signal SLURM names by number). What a user can do about it:
NO_LOG = (
    "its node could not write into the sweep directory (not a filesystem the nodes share, or not theirs to "
    "write); move the sweep directory where they can, and resume it there"
)


def existing(*paths: str | None) -> str | None:
    """The first of the paths that is a file (a log shown only when it exists)."""
    for p in paths:
        if p and os.path.isfile(p):
            return str(p)
    return None


def failure(
    unit: str, job: dict[str, Any], detail: str | None, view: SchedulerView | None, disk: FullDisk | None = None
) -> str | None:
    """Why a unit failed, in one line: the worker's own reason from the unit's log (or the
    task's), the sweep directory's ``disk`` full where they say none (it takes no reason), an
    out-of-memory or signal death from the scheduler, else ``detail``."""
    for path in (job.get("log"), job.get("stderr")):
        why = read_failure(path, unit) if path else None
        if why:
            return why
    if disk is not None and disk.probe():
        return disk.unsaid(detail or "it ended")
    ts = view.get(str(job["job_id"])) if view is not None else None
    if ts is not None and ts.state == "OUT_OF_MEMORY":
        return detail
    said = exit_reason(ts.exit_code) if ts is not None and ts.exit_code else None
    out = f"{detail}: {said}" if said and detail and said not in detail else detail
    logs = [p for p in (job.get("log"), job.get("stderr")) if p]
    if ts is not None and ts.state in ("COMPLETED", "FAILED") and logs and existing(*logs) is None:
        where = logs[-1]
        if ts.state == "COMPLETED":  # "completed without finishing its items (see its log)": there is none
            return f"the job ended without writing its log ({where}): {NO_LOG}"
        return f"{out}; it wrote no log ({where}): {NO_LOG}"
    if ts is not None and (job.get("units_in_task") or 1) > 1:
        task_end = f"SLURM: {ts.state}" + (f", exit {ts.exit_code}" if ts.exit_code else "")
        if not _taken(job):
            return never_taken(task_end)
        if ts.state in ("FAILED", "NODE_FAIL"):  # it died under the unit's worker, which said nothing
            return died_under(task_end)
    return out


def _taken(job: dict[str, Any]) -> bool:
    """Whether a GPU of the unit's whole-node task took the unit: the task writes the unit's own
    log when it hands the unit to a worker (``dispatch.node``), so a log older than the job's
    submission, or none, says it never did."""
    try:
        written = os.stat(job["log"]).st_mtime
    except (KeyError, OSError, TypeError):
        return False
    return written >= (submitted_ts(job) or 0.0)
