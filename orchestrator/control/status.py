"""Progress of a sweep, rebuilt from its directory alone, with the scheduler's view on top.

The partial files are the truth for progress (a record line is a finished config) and the
completion markers for completeness. The scheduler's view (``orchestrator.control.scheduler.query``: one
``squeue`` and one ``sacct`` for every job of the sweep) only says what a unit that is not
done is doing: waiting, running, requeued, or ended without finishing (failed, cancelled,
timed out). Partials are counted on bytes, never parsed, so a sweep of 10,000 units is read
in well under a second (``bench/status.py``).

Unit states: ``done`` (marker, or every item recorded), ``pending``, ``running``,
``requeued`` (pending again after it ran: preempted or past its time limit), ``failed``,
``cancelled``, ``timed out``. A unit whose missing items ``tilesweep resume`` handed to new
units is marked ``resumed``; it keeps the state its last job ended in.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator import PROG
from orchestrator.control.scheduler import SchedulerView, array_of, query
from orchestrator.store.partials import count_partial
from orchestrator.store.sweepdir import SweepDir

ACTIVE = ("pending", "running", "requeued")
# Ended without finishing its items: what `tilesweep resume` is for.
FAILED = ("failed", "cancelled", "timed out")
STATE_ORDER = ("done", "running", "requeued", "pending", "failed", "timed out", "cancelled")
# A job that is in neither squeue nor sacct this long after its submission is gone: a
# pending array task cancelled on its own leaves no record (docs/slurm-notes.md).
LOST_AFTER_S = 60.0


@dataclass
class UnitStatus:
    id: str
    total: int
    done: int
    complete: bool
    state: str = "pending"  # pending | running | requeued | done | failed | cancelled | timed out
    errors: int | None = None
    log: str | None = None  # stderr of the unit's last job (shown when it ended without finishing)
    job_id: str | None = None  # last job: "<array>_<task>", or a plain id
    executor: str | None = None
    submissions: int = 0  # jobs this unit was submitted as (resubmissions keep the history)
    detail: str | None = None  # display text only: SLURM state, pending reason, exit code
    resumed: bool = False  # its missing items were handed to later units by `tilesweep resume`
    stuck: bool = False  # pending for a reason that never resolves on its own (see scheduler.STUCK_REASONS)

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

    @property
    def done(self) -> int:
        return min(self.planned, sum(min(u.done, u.total) for u in self.units))

    @property
    def errors(self) -> int:
        return sum(u.errors or 0 for u in self.units)

    @property
    def complete(self) -> bool:
        return all(u.complete or u.done >= u.total or u.resumed for u in self.units)

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
        return elapsed * (self.planned - self.done) / self.done if elapsed > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {"sweep_dir": self.sweep_dir, "planned": self.planned, "done": self.done, "errors": self.errors,
                "complete": self.complete, "settled": self.settled, "states": self.counts(),
                "eta_s": None if self.eta_s() is None else round(self.eta_s(), 1), "scheduler": self.scheduler,
                "merge_jobs": self.merge_jobs, "units": [dict(u.__dict__) for u in self.units]}


@dataclass
class History:
    """jobs.jsonl read once: the last job of each unit and the sweep's events."""

    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    submissions: Counter = field(default_factory=Counter)
    cancelled: dict[str, float] = field(default_factory=dict)  # array id -> when `tilesweep cancel` ran
    resumed: set[str] = field(default_factory=set)
    merge_jobs: list[dict[str, Any]] = field(default_factory=list)
    first_submitted: float | None = None


def read_history(sd: SweepDir) -> History:
    h = History()
    for e in sd.job_history():
        event = e.get("event")
        if event is None and "unit" in e:
            h.latest[e["unit"]] = e
            h.submissions[e["unit"]] += 1
            if h.first_submitted is None:
                h.first_submitted = _ts(e)
        elif event == "cancel":
            for a in e.get("arrays", []):
                h.cancelled[str(a)] = float(e.get("ts") or 0)
        elif event == "resume":
            h.resumed.update(e.get("replaces", []))
            h.resumed.difference_update(e.get("units", []))
        elif event == "merge_job":
            h.merge_jobs.append(e)
    return h


def _ts(entry: dict[str, Any]) -> float | None:
    if "submitted_ts" in entry:
        return float(entry["submitted_ts"])
    try:
        return _dt.datetime.fromisoformat(entry["submitted"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def _from_marker(path: str, total: int) -> tuple[int, int, None] | None:
    """(records, errors, None) of a finished unit from its completion marker, when the marker
    alone says so: the worker finished every item in that one attempt (``already`` 0), so
    its error count is the unit's. Reading 300 bytes beats counting a whole partial."""
    try:
        with open(path, "rb") as f:
            m = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("already") != 0 or m.get("done") != total or type(m.get("errors")) is not int:
        return None
    return total, m["errors"], None


def sweep_status(sd: SweepDir, *, query_slurm: bool = True, view: SchedulerView | None = None) -> SweepStatus:
    """The sweep's progress from its files; with the scheduler's view of unfinished SLURM
    units when ``view`` is given or ``query_slurm`` (one squeue + one sacct call in all)."""
    index = sd.unit_index()
    try:
        markers = {name[:-5] for name in os.listdir(sd.done) if name.endswith(".json")}
    except FileNotFoundError:
        markers = set()
    hist = read_history(sd)
    st = SweepStatus(str(sd.root), planned=sd.planned, first_submitted=hist.first_submitted)
    mtimes: dict[str, float | None] = {}
    partials, done_dir = os.fspath(sd.partials), os.fspath(sd.done)
    for entry in index:
        uid = entry["id"]
        total = entry["n_items"]
        complete = uid in markers
        counted = _from_marker(f"{done_dir}/{uid}.json", total) if complete else None
        n, errors, mtime = counted or count_partial(f"{partials}/{uid}.jsonl")
        job = hist.latest.get(uid)
        u = UnitStatus(uid, total, n, complete, errors=errors, resumed=uid in hist.resumed and not complete,
                       submissions=hist.submissions[uid])
        if job is not None:
            u.job_id, u.executor = str(job.get("job_id")), job.get("executor")
        u.state = "done" if complete or n >= total else "pending"
        mtimes[uid] = mtime
        st.units.append(u)

    slurm_units = [u for u in st.units if u.state != "done" and u.executor == "slurm"]
    merge_ids = [str(m["job_id"]) for m in hist.merge_jobs]
    if view is None and query_slurm and (slurm_units or merge_ids):
        view = query([u.job_id for u in slurm_units if u.job_id] + merge_ids)
    st.view = view
    if view is not None:
        st.scheduler = "; ".join(view.notes) or (
            f"squeue + sacct at {_dt.datetime.fromtimestamp(view.taken).strftime('%H:%M:%S')}" if view.asked else None)
    elif slurm_units:
        st.scheduler = "SLURM not asked"
    now = time.time()
    for u in st.units:
        if u.state == "done":
            continue
        job = hist.latest.get(u.id)
        if job is None:
            u.detail = "not submitted"
            continue
        if u.executor == "slurm":
            u.state, u.detail = slurm_state(job, view, mtimes[u.id], hist.cancelled, now, u.done)
            task = view.get(str(job["job_id"])) if view is not None and view.asked else None
            u.stuck = u.state in ACTIVE and task is not None and task.stuck
        else:
            u.state, u.detail = _local_state(job, u.done)
        if u.state in FAILED:
            u.log = job.get("stderr") or job.get("log")
    for m in hist.merge_jobs:
        ts = view.get(str(m["job_id"])) if view is not None else None
        st.merge_jobs.append({"job_id": str(m["job_id"]), "state": ts.state if ts else None,
                              "reason": ts.reason if ts else None, "log": m.get("stderr")})
    st.taken = now
    return st


def slurm_state(job: dict[str, Any], view: SchedulerView | None, mtime: float | None, cancelled: dict[str, float],
                now: float, records: int) -> tuple[str, str | None]:
    """(state, detail) of a SLURM unit that is not done.

    squeue first (live), then sacct (lags 1-2 s); in neither, a young job is still pending
    (not yet in accounting) and an old one is gone. A job pending again after it wrote to its
    partial has been requeued."""
    jid = str(job["job_id"])
    submitted = _ts(job) or 0.0
    if cancelled.get(array_of(jid), -1.0) >= submitted:
        return "cancelled", f"cancelled with `{PROG} cancel`"
    if view is None or not view.asked:
        return ("running" if records else "pending"), "SLURM not asked; state guessed from the partial"
    ts = view.get(jid)
    if ts is None:
        if now - submitted < LOST_AFTER_S:
            return "pending", "not yet in squeue or sacct"
        if not view.sacct_ok:
            return "failed", "not in squeue, and sacct could not be asked"
        return "cancelled", "in neither squeue nor sacct (a pending array task cancelled on its own leaves no record)"
    s = ts.state
    if s == "PENDING":
        ran = mtime is not None and mtime >= submitted
        reason = ts.reason if ts.reason not in ("", "None") else None
        if ts.stuck:
            reason = f"{ts.reason}: it cannot start as submitted (cancel it, then resume with other executor settings)"
        return ("requeued" if ran else "pending"), reason
    if s.startswith("REQUEUE"):
        return "requeued", s
    if s in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING", "STAGE_OUT", "SIGNALING", "STOPPED"):
        return "running", None if s == "RUNNING" else s
    if s in ("CANCELLED", "PREEMPTED"):
        return "cancelled", s if s != "CANCELLED" else None
    if s in ("TIMEOUT", "DEADLINE"):
        return "timed out", s
    if s == "COMPLETED":
        return "failed", "the job completed without finishing its items (stopped early; see its log)"
    return "failed", f"{s} (exit {ts.exit_code})" if ts.exit_code else s


def _local_state(job: dict[str, Any], records: int) -> tuple[str, str | None]:
    """A unit run by the local executor: running while its process lives."""
    if job.get("executor") == "local":
        try:
            pid = int(job.get("job_id"))
        except (TypeError, ValueError):
            pid = None
        if pid is not None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return "failed", "its local worker process is gone"
            except PermissionError:
                pass
            return "running", f"local process {pid}"
    return ("running" if records else "pending"), None


# ---------------------------------------------------------------------------- text


def format_status(st: SweepStatus, *, max_lines: int = 40) -> str:
    """The text ``tilesweep status`` shows: totals, then one line per unit (all of them on a
    small sweep, the unfinished ones on a large one)."""
    counts = ", ".join(f"{n} {s}" for s, n in st.counts().items())
    eta = st.eta_s()
    head = (f"{st.sweep_dir}: {st.done}/{st.planned} items done ({st.errors} error records), "
            f"{'complete' if st.complete else 'in progress' if not st.settled else 'incomplete'}"
            + (f", ETA ~{format_duration(eta)}" if eta is not None else ""))
    lines = [head, f"units: {len(st.units)} ({counts})" + (f"; {st.scheduler}" if st.scheduler else "")]
    shown = st.units if len(st.units) <= max_lines else [u for u in st.units if u.state != "done"]
    width = max((len(u.job_id or "-") for u in shown), default=1)
    for u in shown[:max_lines]:
        state = u.state + (" (resumed)" if u.resumed else "")
        text = (f"  {u.id}  {state:<20} {u.done:>6}/{u.total:<6} errors {u.errors or 0:<4} "
                f"job {u.job_id or '-':<{width}}")
        if u.detail:
            text += f"  {u.detail}"
        if u.log:
            text += f"  log: {u.log}"
        lines.append(text.rstrip())
    hidden = len(st.units) - min(len(shown), max_lines)
    if hidden:
        lines.append(f"  ... {hidden} more units not shown (--json lists every unit)")
    for m in st.merge_jobs[-1:]:
        lines.append(f"final merge: job {m['job_id']} {(m['state'] or 'not in squeue/sacct').lower()}"
                     + (f" ({m['reason']})" if m.get("reason") not in (None, "", "None") else "")
                     + (f"  log: {m['log']}" if m["state"] not in (None, "PENDING", "RUNNING", "COMPLETED") else ""))
    if not st.complete and st.settled and st.ended_unfinished():
        lines.append(f"to redo the missing items: {PROG} resume {st.sweep_dir}")
    return "\n".join(lines)


def format_duration(seconds: float) -> str:
    """12s, 3m05s, 2h07m: short enough for a progress line."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
