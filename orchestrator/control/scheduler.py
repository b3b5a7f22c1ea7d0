"""The scheduler's side of a sweep, asked through SLURM's own tools (no submitit here).

Every question is one call of one tool for all of a sweep's jobs, never one per job:
``squeue`` for the live view (no lag, one row per task with ``-r``) and ``sacct`` for jobs
that have left the queue (it lags the scheduler by 1-2 s; see docs/slurm-notes.md). Both
are asked by array id, which returns every task of the array. Status reads the answer as a
hint layered over the partial files, which stay the truth for progress.

``TILESWEEP_SLURM_QUERIES=0`` turns the queries off (status then works from the sweep
directory alone); missing tools turn them off too, with a note saying so.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from orchestrator.errors import DispatchError

log = logging.getLogger(__name__)

QUERY_ENV = "TILESWEEP_SLURM_QUERIES"
TIMEOUT_S = 60.0
# Pending reasons that never resolve on their own: status shows them.
STUCK_REASONS = {
    "PartitionTimeLimit",
    "PartitionNodeLimit",
    "InvalidAccount",
    "InvalidQOS",
    "QOSMaxWallDurationPerJobLimit",
    "PartitionConfig",
    "BadConstraints",
    "DependencyNeverSatisfied",
}
# The pending reasons of a held job (sbatch --hold, scontrol hold; a site's or an administrator's
# hold): it starts once released, never on its own.
HELD_REASONS = {"JobHeldUser", "JobHeldAdmin"}
# The pending reason of a job whose nodes are down, drained or reserved: it starts once they return
# (squeue names them: "ReqNodeNotAvail, UnavailableNodes:vm[1-2]"), which no waiting alone brings.
NODES_OUT_REASON = "ReqNodeNotAvail"
# Default MaxArraySize of Slurm, used when scontrol cannot be asked.
DEFAULT_MAX_ARRAY_SIZE = 1001
# Tasks kept free below MaxJobCount (which counts every task in the system) per array.
JOB_COUNT_MARGIN = 100

_SACCT_ID = re.compile(r"^(\d+)(?:_(\d+|\[([^\]]*)\]))?$")


@dataclass
class TaskState:
    """What SLURM says of one job or array task."""

    state: str  # first word, upper case: PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, ...
    source: str  # "squeue" (live) or "sacct" (accounting)
    reason: str = ""  # squeue's reason of a pending task (JobArrayTaskLimit, BeginTime, ...)
    exit_code: str = ""  # sacct's ExitCode (1:0 after an exception, 9:0 after a SIGKILL)
    by: str = ""  # who ended it, where sacct says (the user id of "CANCELLED by 1000")

    @property
    def reason_word(self) -> str:
        """The reason's name, without the details squeue may add after a comma (the nodes of
        ``ReqNodeNotAvail, UnavailableNodes:vm``)."""
        return self.reason.split(",", 1)[0].strip()

    @property
    def stuck(self) -> bool:
        """Pending for a reason that waiting alone does not end (status and ``wait`` warn of it):
        one it cannot start for as submitted, a hold it starts once released from, or nodes it
        needs that are out until someone returns them."""
        word = self.reason_word
        return self.state == "PENDING" and (word in STUCK_REASONS or word in HELD_REASONS or word == NODES_OUT_REASON)


@dataclass
class SchedulerView:
    """One answer of squeue + sacct for a set of jobs."""

    states: dict[str, TaskState] = field(default_factory=dict)
    asked: bool = False  # whether SLURM was asked at all
    squeue_ok: bool = False
    sacct_ok: bool = False
    notes: list[str] = field(default_factory=list)  # why something could not be asked
    taken: float = field(default_factory=time.time)
    arrays_seen: set[str] = field(default_factory=set)  # arrays (or jobs) squeue or sacct knows
    gpu_seconds: dict[str, float] = field(default_factory=dict)  # array -> sacct elapsed x GPUs, every run

    def get(self, job_id: str) -> TaskState | None:
        return self.states.get(job_id)

    def knows_array(self, job_id: str) -> bool:
        """Whether the scheduler knows the array of ``job_id`` (any task of it, or its pending
        range, in squeue or sacct). A task of a known array that is in neither is gone."""
        return array_of(job_id) in self.arrays_seen

    def gpu_hours(self, job_ids: Iterable[str]) -> float | None:
        """GPU-hours of the arrays of ``job_ids`` (every run of every task); None without sacct,
        or where sacct has no row for one of the arrays (slurmdbd not told of a task that just
        ended yet, or the array purged): a sum without it would be too low."""
        arrays = {array_of(j) for j in job_ids}
        if not self.sacct_ok or not arrays <= self.gpu_seconds.keys():
            return None
        return round(sum(self.gpu_seconds[a] for a in arrays) / 3600.0, 4)


def array_of(job_id: str) -> str:
    """The array (or plain job) id of a task id: ``36_3`` -> ``36``, ``66`` -> ``66``."""
    return job_id.split("_", 1)[0]


def task_of_raw(raw: str) -> str | None:
    """The array task (``36_3``) whose own job id is ``raw`` (sacct's JobIDRaw, squeue's ``%A``:
    SLURM gives each task one as it starts, in no order a sweep could know), as squeue (running)
    or sacct (ended) says; None where they name no one task (the id of a pending array names its
    every task) or SLURM is not asked."""
    if queries_disabled():
        return None
    for cmd in (["squeue", "-h", "-r", "-o", "%i|%A"], ["sacct", "-X", "-n", "-P", "-o", "JobID,JobIDRaw"]):
        res = run_tool([*cmd, "-j", raw])
        if isinstance(res, str) or res.returncode != 0:
            continue
        rows = [line.strip().split("|") for line in res.stdout.splitlines()]
        tasks = {row[0] for row in rows if len(row) == 2 and row[1] == raw and "_" in row[0]}
        if len(tasks) == 1:
            return tasks.pop()
    return None


def queries_disabled() -> str | None:
    """Why SLURM must not be asked, or None."""
    if os.environ.get(QUERY_ENV, "1").strip().lower() in ("0", "no", "off", "false"):
        return f"SLURM not asked ({QUERY_ENV}=0)"
    return None


def run_tool(cmd: list[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str] | str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return f"`{cmd[0]}` is not on PATH"
    except subprocess.TimeoutExpired:
        return f"`{cmd[0]}` did not answer within {timeout:.0f} s"
    except OSError as exc:
        return f"`{cmd[0]}` could not run: {exc}"


def one_line(text: object) -> str:
    """A tool's (or an exception's) several lines as one, for a one-line message."""
    return "; ".join(line.strip() for line in str(text).strip().splitlines() if line.strip())


def query(job_ids: Iterable[str]) -> SchedulerView:
    """The state of every given job/task: one ``squeue`` and one ``sacct`` call in all."""
    arrays = sorted({array_of(j) for j in job_ids if j}, key=lambda a: (len(a), a))
    view = SchedulerView()
    if not arrays:
        return view
    disabled = queries_disabled()
    if disabled:
        view.notes.append(disabled)
        return view
    view.asked = True
    ids = ",".join(arrays)
    res = run_tool(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ids])
    if isinstance(res, str):
        view.notes.append(f"squeue: {res}")
    elif res.returncode != 0 and "Invalid job id" not in res.stderr:
        view.notes.append(f"squeue failed (exit {res.returncode}): {one_line(res.stderr)}")
    else:  # exit 1 "Invalid job id specified": every id has left the controller
        view.squeue_ok = True
        for line in res.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 2 and parts[0]:
                view.states[parts[0]] = TaskState(
                    state=parts[1].split()[0].upper() if parts[1].strip() else "UNKNOWN",
                    source="squeue",
                    reason=parts[2] if len(parts) > 2 else "",
                )
                view.arrays_seen.add(array_of(parts[0]))
    _ask_sacct(view, ids)
    view.taken = time.time()
    return view


def _ask_sacct(view: SchedulerView, ids: str) -> None:
    """sacct with ``-D``: one row per run of a task (a requeued task has several, oldest
    first), so the last row gives its state and every row its GPU time."""
    res = run_tool(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State,ExitCode,ElapsedRaw,AllocTRES", "-j", ids])
    if isinstance(res, str):
        view.notes.append(f"sacct: {res}")
        return
    if res.returncode != 0:
        view.notes.append(f"sacct failed (exit {res.returncode}): {one_line(res.stderr)}")
        return
    view.sacct_ok = True
    for row in parse_sacct(res.stdout):
        jid, state, code = row[:3]
        view.arrays_seen.add(array_of(jid))
        current = view.states.get(jid)
        if current is None or current.source == "sacct":  # squeue wins; a later run wins over an earlier one
            view.states[jid] = TaskState(state=state, source="sacct", exit_code=code, by=row[5])
        view.gpu_seconds[array_of(jid)] = view.gpu_seconds.get(array_of(jid), 0.0) + row[3] * row[4]


def parse_sacct(text: str) -> Iterable[tuple[str, str, str, int, int, str]]:
    """(task id, state word, exit code, elapsed seconds, GPUs, by) per row of ``sacct -X -n -P -o
    JobID,State,ExitCode[,ElapsedRaw,AllocTRES]`` (elapsed and GPUs 0 when not asked for).

    Pending tasks of an array come as one row with a range (``36_[2-5%2]``, ``38_[1,3,5-6]``):
    it is expanded. ``CANCELLED by 1000`` becomes ``CANCELLED``, by ``1000`` (the user id that
    cancelled it; by is empty where the state names nobody)."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 2:
            continue
        m = _SACCT_ID.match(parts[0].strip())
        if m is None:
            continue  # steps (.batch), heterogeneous jobs: not ours
        words = parts[1].split()
        state = words[0].upper() if words else "UNKNOWN"
        by = words[2] if len(words) == 3 and words[1] == "by" else ""
        code = parts[2] if len(parts) > 2 else ""
        elapsed = int(parts[3]) if len(parts) > 3 and parts[3].strip().isdigit() else 0
        gpus = _gpus(parts[4]) if len(parts) > 4 else 0
        array, single, ranges = m.group(1), m.group(2), m.group(3)
        if single is None:
            yield array, state, code, elapsed, gpus, by
        elif ranges is None:
            yield f"{array}_{single}", state, code, elapsed, gpus, by
        else:
            for index in expand_indices(ranges):
                yield f"{array}_{index}", state, code, elapsed, gpus, by


def _gpus(tres: str) -> int:
    """GPUs in an AllocTRES field (``billing=4,cpu=4,gres/gpu=4,node=1``; typed GPUs are
    listed twice, ``gres/gpu=4,gres/gpu:h100=4``: the untyped count is taken)."""
    m = re.search(r"(?:^|,)gres/gpu=(\d+)", tres)
    return int(m.group(1)) if m else 0


def expand_indices(spec: str) -> list[int]:
    """``2-5%2`` -> [2, 3, 4, 5]; ``1,3,5-6`` -> [1, 3, 5, 6]."""
    out: list[int] = []
    for part in spec.split("%", 1)[0].split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            out.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class ClusterLimits:
    max_array_size: int  # tasks one array may hold
    max_job_count: int | None  # tasks the controller holds at once (all users)
    source: str  # where the numbers come from

    @property
    def per_array(self) -> int:
        """Tasks to put in one array: within MaxArraySize, and leaving room under MaxJobCount
        (an array over it makes sbatch block for minutes before failing)."""
        if self.max_job_count is None:
            return self.max_array_size
        return max(1, min(self.max_array_size, self.max_job_count - JOB_COUNT_MARGIN))


def cluster_limits() -> ClusterLimits:
    """MaxArraySize and MaxJobCount from one ``scontrol show config`` (Slurm's defaults,
    with a warning, when it cannot be asked)."""
    res = run_tool(["scontrol", "show", "config"])
    if isinstance(res, str) or res.returncode != 0:
        why = res if isinstance(res, str) else one_line(res.stderr)
        log.warning(
            "cannot read the cluster's MaxArraySize (%s); assuming Slurm's default %d", why, DEFAULT_MAX_ARRAY_SIZE
        )
        return ClusterLimits(max_array_size=DEFAULT_MAX_ARRAY_SIZE, max_job_count=None, source=f"Slurm default ({why})")
    size = re.search(r"^MaxArraySize\s*=\s*(\d+)", res.stdout, re.M)
    count = re.search(r"^MaxJobCount\s*=\s*(\d+)", res.stdout, re.M)
    return ClusterLimits(
        max_array_size=int(size.group(1)) if size else DEFAULT_MAX_ARRAY_SIZE,
        max_job_count=int(count.group(1)) if count else None,
        source="scontrol show config",
    )


def cancel(job_ids: Iterable[str]) -> None:
    """``scancel`` the given arrays or jobs in one call (a finished one is not an error)."""
    ids = sorted(set(job_ids), key=lambda a: (len(a), a))
    if not ids:
        return
    res = run_tool(["scancel", *ids])
    if isinstance(res, str):
        raise DispatchError(f"cannot cancel jobs {', '.join(ids)}: {res}")
    if res.returncode != 0:
        raise DispatchError(f"scancel {' '.join(ids)} failed (exit {res.returncode}): {one_line(res.stderr)}")


def missing_tools(*tools: str) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]


def require_submit_tools() -> None:
    """Refuse, before anything is written, to submit from a machine without sbatch and srun
    (submitit needs both)."""
    missing = missing_tools("sbatch", "srun")
    if missing:
        raise DispatchError(
            f"`{missing[0]}` is not on PATH, so nothing can be submitted to SLURM; run on a login node of the "
            "cluster (or load its module), or use executor kind local"
        )
