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

What the status holds (unit states, rounds) is ``status_model``'s; its text is
``status_text``'s. Both are named here too, so a caller imports a sweep's status from one place.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import time
from typing import Any

from orchestrator.control.history import History, read_history, submitted_ts
from orchestrator.control.partitions import time_limit_of
from orchestrator.control.scheduler import HELD_REASONS, SchedulerView, queries_disabled, query
from orchestrator.control.status_merge import document, merge_jobs
from orchestrator.control.status_model import ACTIVE, FAILED, REPLACED, SweepStatus, UnitStatus
from orchestrator.control.status_text import format_duration, format_status, status_json
from orchestrator.control.unit_leases import unit_leases
from orchestrator.control.unit_state import (
    LOST_AFTER_S,
    existing,
    failure,
    local_state,
    slurm_state,
    stopped_line,
    stopped_pid,
    stopped_process,
)
from orchestrator.control.why import REQUEUES_RAN_OUT, out_of_requeues, out_of_time
from orchestrator.errors import TilesweepError
from orchestrator.planning.search import SEARCH
from orchestrator.store.diskspace import FullDisk
from orchestrator.store.leases import read_holder, run_lease_path
from orchestrator.store.partials import read_partial
from orchestrator.store.progress import count_unit
from orchestrator.store.round2 import read_round2
from orchestrator.store.runstop import RunStop, read_stop
from orchestrator.store.searchrounds import grid_size, read_end, read_rounds
from orchestrator.store.sweep_paths import finish_command
from orchestrator.store.sweepdir import SweepDir, UnitEntry
from orchestrator.store.tally import Book
from orchestrator.store.unitfile import read_items

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
    "status_json",
    "sweep_status",
]


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except (OSError, TypeError):
        return None


def sweep_status(
    sd: SweepDir, *, query_slurm: bool = True, view: SchedulerView | None = None, keep_tally: bool = False
) -> SweepStatus:
    """The sweep's progress from its files; with the scheduler's view of its SLURM jobs when
    ``view`` is given or ``query_slurm`` (one squeue + one sacct call in all). ``keep_tally``:
    leave what was counted of the unfinished partials in the sweep directory's tally file for
    the next status from any process (``tilesweep status`` does; every status reads it)."""
    hist = read_history(sd)
    st = SweepStatus(
        sweep_dir=str(sd.root),
        planned=sd.planned,
        first_submitted=hist.first_submitted,
        halving=sd.spec.timing.strategy == "halving",
        round2=read_round2(sd),
        replay_of=sd.spec.replay.source if sd.spec.replay is not None else None,
    )
    st.round2_deferred = hist.round2_deferred if st.round2_pending else None
    if sd.spec.timing.strategy == SEARCH:
        st.search, st.search_end = read_rounds(sd), read_end(sd)
        st.grid = grid_size(sd, st.search[0] if st.search else None)
        st.search_rounds = (sd.spec.search.max_rounds, sd.spec.search.screen)
        st.search_deferred = hist.deferred.get(st.next_round) if st.search_pending else None
    st.on_slurm = bool(hist.slurm_jobs)
    _runner(sd, st, hist)
    index = sd.unit_index()
    if not index:
        st.plan_finish = finish_command(sd.root, sd.meta.get("spec_source"))
    mtimes, notes, partials = _progress(sd, st, hist, index, keep_tally)
    st.later_rounds = later_rounds(index)
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
    disk = FullDisk(sd.root, once=True)  # asked where a failed unit's logs say nothing
    for u in st.units:
        if u.state != "done":
            _unit_state(u, hist.latest.get(u.id), view, mtimes[u.id], hist, now, disk, st.run_stop)
        _ran_out_of_time(u, sd, hist.latest.get(u.id) or {})
        if not u.submitted and u.state in ACTIVE and u.resumed:
            u.state, u.detail = REPLACED, GIVEN_TO_LATER
        elif not u.submitted and u.state in ACTIVE:
            u.detail = NOT_STARTED if st.run_stop else not_submitted(st)
    unit_leases(sd.root, st, hist)
    _covered(sd, st)
    for u in st.units:  # a stale marker or a partial of another sweep: said whatever runs the unit
        if u.id in notes:
            u.detail = f"{u.detail}; {notes[u.id]}" if u.detail else notes[u.id]
    st.merge_jobs, st.merge_refused = merge_jobs(sd, hist, view), hist.merge_refused
    _pace(st, hist)
    document(sd, st, partials)
    st.taken = now
    return st


def _runner(sd: SweepDir, st: SweepStatus, hist: History) -> None:
    """The ``tilesweep run`` that holds the sweep's run lease: live, stopped (Ctrl-Z, SIGSTOP),
    or none, and then why the last run here stopped, if a full disk stopped it."""
    holder = read_holder(run_lease_path(sd.root))
    st.runner_live = holder is not None and holder.live
    if holder is not None and st.runner_live:
        st.runner = holder.command()
    st.runner_stopped = stopped_process(holder.fields) if holder is not None and st.runner_live else None
    st.run_stop = None if st.runner_live else _run_stop(sd, hist)


def _pace(st: SweepStatus, hist: History) -> None:
    """Whose records set the ETA's pace, and since when: of the units the last resume submitted
    and those of the sweep's last round (a halving's round 2, a search's next round, whoever
    submitted it: the final merge job, ``wait``, ``resume``), the batch submitted last while one
    of its units waits or runs, since its submission (not round 1's pace, nor the gap between
    the rounds); else every unit since the first submission."""
    last_round = max((u.round for u in st.units if u.submitted), default=1)
    batches = [hist.last_resume, [u.id for u in st.units if u.round == last_round > 1]]
    active = {u.id for u in st.unsettled()}
    paced: tuple[float, list[str]] | None = None
    for units in batches:
        jobs = [hist.latest[uid] for uid in units if uid in hist.latest]
        stamps = [ts for job in jobs if (ts := submitted_ts(job)) is not None]
        if stamps and any(job["unit"] in active for job in jobs) and (paced is None or min(stamps) > paced[0]):
            paced = (min(stamps), units)
    if paced is not None:
        st.pace_from, st.paced = paced[0], frozenset(paced[1])
    else:
        st.paced, st.pace_from = None, st.first_submitted


def _run_stop(sd: SweepDir, hist: History) -> RunStop | None:
    """The last run's stop on a full disk, where no job of the sweep was submitted since (a
    resume ran after it)."""
    stop = read_stop(sd.root)
    if stop is None or any((submitted_ts(job) or 0.0) > stop.at for job in hist.latest.values()):
        return None
    return stop


def _covered(sd: SweepDir, st: SweepStatus) -> None:
    """Units never submitted (``never_submitted``: a live ``run`` starts none of these), or
    replaced by a resume, whose every item other units of their round recorded are replaced,
    not pending: nothing is left to them (``resume`` records them so). Only where there is such
    a unit are other units' unit files read, and the partials of those that recorded a part of
    their items."""
    shared = _rounds_sharing_items(st)
    replaced = [u for u in st.units if u.state == REPLACED]
    idle = {u.id: u for u in [*st.never_submitted(), *replaced] if u.done == 0 and (u.retry or u.round in shared)}
    try:
        wanted = {uid: {iid for _, iid in read_items(sd.root, uid)} for uid in idle}
        for round_ in {u.round for u in idle.values()}:
            left = set().union(*(wanted[uid] for uid, u in idle.items() if u.round == round_))
            for other in st.units:
                if not left:
                    break
                if other.id in idle or other.round != round_ or other.done == 0:
                    continue
                if other.complete or other.done >= other.total:
                    left -= {iid for _, iid in read_items(sd.root, other.id)}
                else:
                    left -= read_partial(sd.partial_path(other.id), warn=False).records.keys()
            for uid, u in idle.items():
                if u.round == round_ and not wanted[uid] & left:
                    u.state, u.detail, u.covered = REPLACED, RECORDED_ELSEWHERE, True
    except TilesweepError:  # a unit file damaged or edited: its unit stays as it reads (merge and resume say why)
        return


def _rounds_sharing_items(st: SweepStatus) -> set[int]:
    """The rounds whose units hold more items than the round planned (a resume's units hold
    items of the units they replace): only there can a unit's items be recorded by another.
    A sweep as planned (10,000 units never submitted) reads no unit file for it."""
    held: dict[int, int] = {}
    for u in st.units:
        if not u.retry:
            held[u.round] = held.get(u.round, 0) + u.total
    planned = {1: st.planned, **st.later_rounds}
    return {n for n, total in held.items() if total > planned.get(n, 0)}


@functools.lru_cache(maxsize=8)
def _time_limit(partition: str | None) -> tuple[str, float] | None:
    """``partitions.time_limit_of``, asked once a process (``wait`` builds a status every few seconds)."""
    return time_limit_of(partition)


def _ran_out_of_time(u: UnitStatus, sd: SweepDir, job: dict[str, Any]) -> None:
    """A unit out of time, said by SLURM's word alone (TIMEOUT) or by submitit's once the task's
    requeues ran out: what ran out, and the fixes ``resume`` takes. The time limit and requeues
    named are those its task was submitted with (``job``: its ``jobs.jsonl`` line; a later
    ``resume --spec`` may have changed the spec's), the spec's where the line does not say. Where
    that limit is all the spec's partition allows, the fix named is a partition that allows more."""
    limit = job.get("timeout_min") or sd.spec.executor.timeout_min
    timed_out = u.state == "timed out" and u.detail == "TIMEOUT"
    if not (timed_out or (u.state == "failed" and u.detail and REQUEUES_RAN_OUT in u.detail)):
        return
    most = None if queries_disabled() else _time_limit(sd.spec.executor.slurm_partition)
    full = most[0] if most is not None and limit >= most[1] else None  # no longer limit to be had there
    if timed_out:
        u.detail = out_of_time(limit, str(sd.root), sd.meta.get("spec_source"), full)
    else:
        requeues = job["max_requeues"] if type(job.get("max_requeues")) is int else sd.spec.executor.max_requeues
        u.detail = out_of_requeues(limit, requeues, str(sd.root), sd.meta.get("spec_source"), full)


REUSED = "reused: records carried from earlier documents (reuse.json)"  # the reuse unit (store.carried)


def not_submitted(st: SweepStatus) -> str:
    """What a unit never submitted waits for: the live run that starts it (stopped, and how to
    continue it, where it is), or nothing."""
    if st.runner_stopped is not None:
        return f"not submitted yet: the {st.runner} that starts it (pid {st.runner_stopped}) is " + stopped_line(
            st.runner_stopped
        )
    return f"not submitted yet: the running {st.runner} starts it" if st.runner_live else "not submitted"


# a unit never submitted because the last run stopped on the full disk
NOT_STARTED = "not started: the run stopped on the full disk"
# a unit never submitted whose items `tilesweep resume` handed to new units: nothing will start it
GIVEN_TO_LATER = "never submitted; `tilesweep resume` gave its items to later units"
# a unit never submitted whose every item other units recorded (a resume cut short before it
# submitted the unit, whose items the unit it replaced then finished)
RECORDED_ELSEWHERE = "never submitted; other units recorded every item of it"


def later_rounds(index: list[UnitEntry]) -> dict[int, int]:
    """Round -> the timings its strategy planned, for each round after the first: the items of
    the units it made of the round (origin "round<N>"; units resume regrouped them into, and
    retries, redo those items and count no more)."""
    out: dict[int, int] = {}
    for entry in index:
        n = int(entry.get("round", 1))
        if n > 1 and entry.get("origin") == f"round{n}":
            out[n] = out.get(n, 0) + int(entry["n_items"])
    return out


def _progress(
    sd: SweepDir, st: SweepStatus, hist: History, index: list[UnitEntry], keep_tally: bool
) -> tuple[dict[str, float | None], dict[str, str], dict[str, tuple[int, int]]]:
    """Each unit's records and errors as merge would count them (``count_unit``) into
    ``st.units``; return when each unit last showed a sign of life (its partial or its log
    written), why a marker or a partial was not trusted, per unit, and each partial's size and
    mtime (ns), for whether the document holds what they hold (``merged``)."""
    try:
        markers = {name[:-5] for name in os.listdir(sd.done) if name.endswith(".json")}
    except FileNotFoundError:
        markers = set()
    mtimes: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    partials: dict[str, tuple[int, int]] = {}
    fingerprint, env = sd.spec.fingerprint(), sd.recorded_env()
    book = Book(sd.root)
    for entry in index:
        uid = entry["id"]
        total = entry["n_items"]
        c = count_unit(sd, uid, total, uid in markers, fingerprint, env, book)
        job = hist.latest.get(uid)
        u = UnitStatus(
            id=uid,
            total=total,
            done=c.done,
            complete=c.complete,
            errors=c.errors,
            resumed=uid in hist.resumed and not c.complete,
            submissions=hist.submissions[uid],
            gpu=c.gpu,
            retry=entry.get("origin") == "retry",
            round=int(entry.get("round", 1)),
            detail=REUSED if entry.get("origin") == "reuse" else None,
            carried=entry.get("origin") == "reuse",
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
        if c.stat is not None:
            partials[uid] = c.stat
        mtimes[uid] = mtime
        st.units.append(u)
    if keep_tally:
        book.save()  # the next status, in any process, reads only what the partials gain meanwhile
    return mtimes, notes, partials


def _unit_state(
    u: UnitStatus,
    job: dict[str, Any] | None,
    view: SchedulerView | None,
    mtime: float | None,
    hist: History,
    now: float,
    disk: FullDisk,
    stop: RunStop | None = None,
) -> None:
    """State, detail, reason and log of a unit that is not done (``stop``: the last run's on a
    full disk, which a local worker it names failed on)."""
    if job is None:
        u.detail = "not submitted"
        return
    if u.executor == "slurm":
        u.state, u.detail = slurm_state(job, view, mtime, hist.cancelled, now, u.done)
        task = view.get(str(job["job_id"])) if view is not None and view.asked else None
        u.stuck = u.state in ACTIVE and task is not None and task.stuck
        u.held = task.reason if u.stuck and task is not None and task.reason in HELD_REASONS else ""
    else:
        u.state, u.detail = local_state(job, u.done)
        u.stopped = u.state == "running" and stopped_pid(job) is not None
        if u.state == "failed" and stop is not None and stop.failed.get(u.id) == u.job_id:
            u.detail = f"its worker could not write to the sweep directory: its disk was full ({stop.error})"
    if u.state in FAILED:
        u.log = existing(job.get("log"), job.get("stderr"))
        if u.state == "failed":
            u.detail = failure(u.id, job, u.detail, view, disk)
