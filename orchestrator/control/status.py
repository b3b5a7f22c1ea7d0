"""Progress of a sweep, rebuilt from its directory alone, with the scheduler's view on top.

The partial files are the truth for progress, counted exactly as merge would accept them
(``count_unit``: the one classifier, the merger's header checks), and a completion marker
vouches for a finished unit only while it still matches its partial (the worker stamps the
partial's inode, size and mtime into it), so a truncated or replaced partial is never shown
as done. The scheduler's view (``orchestrator.control.scheduler.query``: one ``squeue`` and
one ``sacct`` for every job of the sweep) says what a unit that is not done is doing:
waiting, running, requeued, or ended without finishing (failed, cancelled, timed out;
``unit_state``), and how many GPU-hours the sweep's tasks have used. The units' leases
(``store.leases``) say which live worker, on which GPU, runs a unit. A finished unit costs
one stat and one small read, so 10,000 units are read in well under a second
(``bench/status.py``); only unfinished units' partials are parsed.

Unit states: ``done`` (marker, or every item recorded), ``pending``, ``running``,
``requeued`` (pending again after it ran: preempted or past its time limit), ``failed``
(with the worker's own reason), ``cancelled``, ``timed out``. A unit whose missing items
``tilesweep resume`` handed to new units is marked ``resumed``; it keeps the state its last
job ended in.

A halving sweep (``timing.strategy: halving``) has two rounds: each unit says which it belongs
to, progress counts round 1's records and then round 2's (its size is known once it is planned:
``round2.json``), and the sweep is complete only when round 2 is planned and done.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator import PROG
from orchestrator.control.history import History, read_history
from orchestrator.control.scheduler import SchedulerView, query
from orchestrator.control.unit_state import LOST_AFTER_S, existing, failure, local_state, slurm_state
from orchestrator.store.leases import live_unit_holders
from orchestrator.store.progress import count_unit
from orchestrator.store.round2 import read_round2
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.target import final_merge

__all__ = [
    "ACTIVE",
    "FAILED",
    "LOST_AFTER_S",
    "History",
    "SweepStatus",
    "UnitStatus",
    "count_unit",
    "format_duration",
    "format_status",
    "read_history",
    "slurm_state",
    "sweep_status",
]

ACTIVE = ("pending", "running", "requeued")
# Ended without finishing its items: what `tilesweep resume` is for.
FAILED = ("failed", "cancelled", "timed out")
STATE_ORDER = ("done", "running", "requeued", "pending", "failed", "timed out", "cancelled")


@dataclass
class UnitStatus:
    id: str
    total: int
    done: int
    complete: bool
    state: str = "pending"  # pending | running | requeued | done | failed | cancelled | timed out
    errors: int | None = None
    log: str | None = None  # the unit's log (or its task's), when it exists and the unit ended unfinished
    job_id: str | None = None  # last job: "<array>_<task>", or a plain id
    gpu: str | None = None  # the GPU its worker runs (ran) on, as the task's CUDA_VISIBLE_DEVICES names it
    executor: str | None = None
    submissions: int = 0  # jobs this unit was submitted as (resubmissions keep the history)
    detail: str | None = None  # display text only: SLURM state, pending reason, exit code
    resumed: bool = False  # its missing items were handed to later units by `tilesweep resume`
    stuck: bool = False  # pending for a reason that never resolves on its own (see scheduler.STUCK_REASONS)
    retry: bool = False  # redoes error records of other units (`resume --retry-errors`): its items are counted there
    round: int = 1  # the halving strategy's round 2 times the survivors of round 1 in full

    @property
    def submitted(self) -> bool:
        """Whether any job was ever submitted for it (a unit never submitted is "pending"
        too, but nothing will run it)."""
        return self.submissions > 0


@dataclass
class SweepStatus:
    sweep_dir: str
    planned: int
    units: list[UnitStatus] = field(default_factory=list)
    scheduler: str | None = None  # what was asked, or why nothing was
    merge_jobs: list[dict[str, Any]] = field(default_factory=list)
    first_submitted: float | None = None
    taken: float = field(default_factory=time.time)
    view: SchedulerView | None = field(default=None, repr=False)  # the scheduler's answer used
    gpu_hours: float | None = None  # sacct: elapsed x allocated GPUs over every run of every task

    halving: bool = False  # timing.strategy: halving (two rounds)
    round2: dict[str, Any] | None = None  # round2.json once round 2 is planned
    round2_deferred: str | None = None  # why the merge job could not submit round 2

    def _done_of(self, round_: int, cap: int) -> int:
        return min(cap, sum(min(u.done, u.total) for u in self.units if u.round == round_ and not u.retry))

    @property
    def round2_total(self) -> int:
        return int(self.round2.get("survivors") or 0) if self.round2 else 0

    @property
    def done(self) -> int:
        """Records done: round 1's (every planned item), then round 2's (its survivors). A retry
        unit's items were recorded (as errors) before it ran, so it adds none."""
        return self._done_of(1, self.planned) + self._done_of(2, self.round2_total)

    @property
    def total(self) -> int:
        """Records to make: the planned items, plus round 2's survivors once it is planned."""
        return self.planned + self.round2_total

    @property
    def round2_pending(self) -> bool:
        """A halving sweep whose round 2 is not planned yet."""
        return self.halving and self.round2 is None

    @property
    def errors(self) -> int:
        """Items whose newest record is an error: a retry unit's measurements supersede errors."""
        errors = sum(u.errors or 0 for u in self.units if not u.retry)
        return max(0, errors - sum(u.done - (u.errors or 0) for u in self.units if u.retry))

    @property
    def complete(self) -> bool:
        return not self.round2_pending and all(u.complete or u.done >= u.total or u.resumed for u in self.units)

    @property
    def settled(self) -> bool:
        """No unit waits or runs: every one is done or ended."""
        return not any(u.state in ACTIVE for u in self.units)

    def counts(self) -> dict[str, int]:
        c = Counter(u.state for u in self.units)
        return {s: c[s] for s in STATE_ORDER if c[s]}

    def unsettled(self) -> list[UnitStatus]:
        return [u for u in self.units if u.state in ACTIVE]

    def ended_unfinished(self) -> list[UnitStatus]:
        """Units that ended without finishing and whose missing items no later unit took
        over: what ``tilesweep resume`` would redo."""
        return [u for u in self.units if u.state in FAILED and not u.resumed]

    def eta_s(self) -> float | None:
        """Seconds to go at the rate since the first submission (None when unknown)."""
        if self.complete or self.settled or not self.first_submitted or not self.done:
            return None
        elapsed = self.taken - self.first_submitted
        return elapsed * (self.total - self.done) / self.done if elapsed > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "sweep_dir": self.sweep_dir,
            "planned": self.planned,
            "done": self.done,
            "total": self.total,
            "errors": self.errors,
            "complete": self.complete,
            "settled": self.settled,
            "states": self.counts(),
            "strategy": "halving" if self.halving else "full",
            "round2": self.round2,
            "round2_deferred": self.round2_deferred,
            "eta_s": None if self.eta_s() is None else round(self.eta_s(), 1),
            "scheduler": self.scheduler,
            "gpu_hours": self.gpu_hours,
            "merge_jobs": self.merge_jobs,
            "units": [dict(u.__dict__) for u in self.units],
        }


def _mtime(path: Any) -> float | None:
    try:
        return os.stat(path).st_mtime
    except (OSError, TypeError):
        return None


def sweep_status(sd: SweepDir, *, query_slurm: bool = True, view: SchedulerView | None = None) -> SweepStatus:
    """The sweep's progress from its files; with the scheduler's view of its SLURM jobs when
    ``view`` is given or ``query_slurm`` (one squeue + one sacct call in all)."""
    hist = read_history(sd)
    st = SweepStatus(
        str(sd.root),
        planned=sd.planned,
        first_submitted=hist.first_submitted,
        halving=sd.spec.timing.strategy == "halving",
        round2=read_round2(sd),
    )
    st.round2_deferred = hist.round2_deferred if st.round2_pending else None
    mtimes, notes = _progress(sd, st, hist)
    merge_ids = [str(m["job_id"]) for m in hist.merge_jobs]
    if view is None and query_slurm and (hist.slurm_jobs or merge_ids):
        view = query(hist.slurm_jobs + merge_ids)
    st.view = view
    if view is not None:
        st.scheduler = "; ".join(view.notes) or (
            f"squeue + sacct at {_dt.datetime.fromtimestamp(view.taken).strftime('%H:%M:%S')}" if view.asked else None
        )
        st.gpu_hours = view.gpu_hours(hist.slurm_jobs) if view.asked and hist.slurm_jobs else None
    elif any(u.state != "done" and u.executor == "slurm" for u in st.units):
        st.scheduler = "SLURM not asked"
    now = time.time()
    for u in st.units:
        if u.state != "done":
            _unit_state(u, hist.latest.get(u.id), view, mtimes[u.id], hist, now)
    _leases(sd, st)
    final = final_merge(sd) if hist.merge_jobs else None
    for u in st.units:  # a stale marker or a partial of another sweep: said whatever runs the unit
        if u.id in notes:
            u.detail = f"{u.detail}; {notes[u.id]}" if u.detail else notes[u.id]
    for m in hist.merge_jobs:
        ts = view.get(str(m["job_id"])) if view is not None else None
        refused = final is not None and str(final.get("job_id")) == str(m["job_id"]) and not final.get("ok")
        st.merge_jobs.append(
            {
                "job_id": str(m["job_id"]),
                "state": ts.state if ts else None,
                "reason": ts.reason if ts else None,
                "log": m.get("stderr"),
                "error": final.get("error") if refused and final else None,
            }
        )
    st.taken = now
    return st


REUSED = "reused: records carried from earlier documents (reuse.json)"  # the reuse unit (store.carried)


def _progress(sd: SweepDir, st: SweepStatus, hist: History) -> tuple[dict[str, float | None], dict[str, str]]:
    """Each unit's records and errors as merge would count them (``count_unit``) into
    ``st.units``; return when each unit last showed a sign of life (its partial or its log
    written), and why a marker or a partial was not trusted, per unit."""
    try:
        markers = {name[:-5] for name in os.listdir(sd.done) if name.endswith(".json")}
    except FileNotFoundError:
        markers = set()
    mtimes: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    fingerprint, env = sd.spec.fingerprint(), sd.recorded_env()
    for entry in sd.unit_index():
        uid = entry["id"]
        total = entry["n_items"]
        c = count_unit(sd, uid, total, uid in markers, fingerprint, env)
        job = hist.latest.get(uid)
        u = UnitStatus(
            uid,
            total,
            c.done,
            c.complete,
            errors=c.errors,
            resumed=uid in hist.resumed and not c.complete,
            submissions=hist.submissions[uid],
            gpu=c.gpu,
            retry=entry.get("origin") == "retry",
            round=int(entry.get("round", 1)),
            detail=REUSED if entry.get("origin") == "reuse" else None,
        )
        if job is not None:
            u.job_id, u.executor = str(job.get("job_id")), job.get("executor")
        u.state = "done" if c.complete or c.done >= total else "pending"
        mtime = c.mtime
        if u.state != "done" and job is not None and job.get("log"):
            log_mtime = _mtime(job["log"])
            mtime = max(mtime or 0.0, log_mtime or 0.0) or None
        if c.detail:
            notes[uid] = c.detail
        mtimes[uid] = mtime
        st.units.append(u)
    return mtimes, notes


def _unit_state(
    u: UnitStatus,
    job: dict[str, Any] | None,
    view: SchedulerView | None,
    mtime: float | None,
    hist: History,
    now: float,
) -> None:
    """State, detail, reason and log of a unit that is not done."""
    if job is None:
        u.detail = "not submitted"
        return
    if u.executor == "slurm":
        u.state, u.detail = slurm_state(job, view, mtime, hist.cancelled, now, u.done)
        task = view.get(str(job["job_id"])) if view is not None and view.asked else None
        u.stuck = u.state in ACTIVE and task is not None and task.stuck
    else:
        u.state, u.detail = local_state(job, u.done)
    if u.state in FAILED:
        u.log = existing(job.get("log"), job.get("stderr"))
        if u.state == "failed":
            u.detail = failure(u.id, job, u.detail, view)


def _leases(sd: SweepDir, st: SweepStatus) -> None:
    """A live worker holding a unit's lease runs it, whatever its last job says (a stray
    second job of the unit may have ended beside it); the lease also names its GPU. A lease
    of the unit's own last job that SLURM says has ended is that job's, left by a worker
    that died with it: ignored."""
    todo = [u for u in st.units if u.state != "done"]
    holders = live_unit_holders(sd.root, [u.id for u in todo])
    for u in todo:
        h = holders.get(u.id)
        if h is None:
            continue
        own_job = h.fields.get("job") is not None and h.fields.get("job") == u.job_id
        if u.state in ACTIVE or not own_job:
            u.gpu = h.fields.get("gpu") or u.gpu
        if u.state != "running" and not own_job:
            u.state, u.detail, u.log = "running", f"by {h.describe()}", None


# ---------------------------------------------------------------------------- text


def format_status(st: SweepStatus, *, max_lines: int = 40) -> str:
    """The text ``tilesweep status`` shows: totals, then one line per unit (all of them on a
    small sweep, the unfinished ones on a large one)."""
    counts = ", ".join(f"{n} {s}" for s, n in st.counts().items())
    eta = st.eta_s()
    state = "complete" if st.complete else "in progress" if not st.settled else "incomplete"
    if state == "incomplete" and st.round2_pending and st._done_of(1, st.planned) >= st.planned:
        state = "round 1 done, round 2 to plan"
    head = (
        f"{st.sweep_dir}: {st.done}/{st.total} {'records' if st.halving else 'items'} done "
        f"({st.errors} error records), {state}" + (f", ETA ~{format_duration(eta)}" if eta is not None else "")
    )
    lines = [
        head,
        *_rounds_lines(st),
        f"units: {len(st.units)} ({counts})" + (f"; {st.scheduler}" if st.scheduler else ""),
    ]
    if st.gpu_hours is not None:
        lines.append(f"GPU-hours: {st.gpu_hours:.3f} (sacct: elapsed x allocated GPUs, every run of every task)")
    shown = st.units if len(st.units) <= max_lines else [u for u in st.units if u.state != "done"]
    width = max((len(u.job_id or "-") for u in shown), default=1)
    gpu_width = max((len(u.gpu or "-") for u in shown), default=1)
    for u in shown[:max_lines]:
        state = u.state + (" (resumed)" if u.resumed else "") + (f" (round {u.round})" if u.round != 1 else "")
        text = (
            f"  {u.id}  {state:<20} {u.done:>6}/{u.total:<6} errors {u.errors or 0:<4} "
            f"job {u.job_id or '-':<{width}} gpu {u.gpu or '-':<{gpu_width}}"
        )
        if u.detail:
            text += f"  {u.detail}"
        if u.log:
            text += f"  log: {u.log}"
        lines.append(text.rstrip())
    hidden = len(st.units) - min(len(shown), max_lines)
    if hidden:
        lines.append(f"  ... {hidden} more units not shown (--json lists every unit)")
    for m in st.merge_jobs[-1:]:
        if m.get("error"):
            lines.append(f"final merge: job {m['job_id']} failed: {m['error']}")
            continue
        lines.append(
            f"final merge: job {m['job_id']} {(m['state'] or 'not in squeue/sacct').lower()}"
            + (f" ({m['reason']})" if m.get("reason") not in (None, "", "None") else "")
            + (f"  log: {m['log']}" if m["state"] not in (None, "PENDING", "RUNNING", "COMPLETED") else "")
        )
    if not st.complete and st.settled and st.ended_unfinished():
        lines.append(f"to redo the missing items: {PROG} resume {st.sweep_dir}")
    return "\n".join(lines)


def _rounds_lines(st: SweepStatus) -> list[str]:
    """What a halving sweep's rounds have done, and who plans round 2 while it is not planned."""
    if not st.halving:
        return []
    one = f"round 1 (screening): {st._done_of(1, st.planned)}/{st.planned} items"
    if st.round2 is not None:
        r2 = st.round2
        return [
            f"{one}; round 2 (full timing of the survivors): {st._done_of(2, st.round2_total)}/{st.round2_total} "
            f"({r2.get('survivors')} of {r2.get('screened')} screened configs survived)"
        ]
    if st.round2_deferred:
        return [
            f"{one}; round 2 not planned: the merge job could not submit it ({st.round2_deferred}); "
            f"`{PROG} wait {st.sweep_dir}` or `{PROG} resume {st.sweep_dir}` does"
        ]
    return [
        f"{one}; round 2 (full timing of the survivors) is planned once round 1 is complete "
        f"(by the final merge job, `{PROG} wait`, `{PROG} resume` or `{PROG} run`)"
    ]


def format_duration(seconds: float) -> str:
    """12s, 3m05s, 2h07m: short enough for a progress line."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
