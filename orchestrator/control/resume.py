"""Resuming a sweep: the items without a record, regrouped into new units and run again.

``plan_resume`` reads every partial (parsed: resume is rare) and says which planned items
have no record, which of them still belong to a unit that is pending or running, and how
often each item killed a worker so far (a config that keeps killing its worker must be
given up on even when it moves to a new unit). ``resume_sweep`` submits the missing items
(SLURM) or runs them here (local, debug) and records which ended units they replace.
Nothing here prints; ``on_planned`` lets the caller speak before anything runs.

A halving sweep resumes either round: an item of round 1 is missing while it has no record
at all; a survivor of round 2 while it has no record timed in full (its screened one does not
count). Missing items go to new units of their own round. A sweep whose round 1 is complete
and whose round 2 nobody planned (the merge job could not submit it) gets round 2 planned and
submitted (or run here) by resume.
"""

from __future__ import annotations

import importlib.metadata
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.control import dispatch
from orchestrator.control.arrays import SubmitOutcome, UnitsRollback, submit_with_merge
from orchestrator.control.rounds import NextRound, advance, group, merge_hook, run_rounds_here
from orchestrator.control.scheduler import require_submit_tools
from orchestrator.control.status import ACTIVE, SweepStatus, sweep_status
from orchestrator.control.sweeps import sweep_lock
from orchestrator.errors import MismatchError
from orchestrator.planning import Unit, WorkItem
from orchestrator.spec.sections import ExecutorSettings
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)


@dataclass
class ResumePlan:
    """What ``resume`` would submit, computed from the partials (parsed: resume is rare)."""

    missing: list[WorkItem] = field(default_factory=list)  # items without a record, free to submit
    missing2: list[WorkItem] = field(default_factory=list)  # round-2 survivors without a full record
    held: int = 0  # items without a record whose unit is still pending or running
    active: list[str] = field(default_factory=list)  # those units
    recorded: int = 0
    missing_of: dict[str, set[str]] = field(default_factory=dict)  # ended unit -> its missing item ids
    # item id -> [starts that died with it in flight, deaths while it was alone, of those hung],
    # over all partials and per unit
    died: dict[str, list[int]] = field(default_factory=dict)
    died_by_unit: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    retry: list[WorkItem] = field(default_factory=list)  # error records of the kind asked to redo

    def prior_starts(self, unit_id: str, item_ids: list[str]) -> dict[str, list[int]]:
        """Deaths on each item in partials other than this unit's own (the worker reads its own),
        as [starts, deaths, hangs]. A retried item starts afresh: none."""
        own = self.died_by_unit.get(unit_id, {})
        fresh = {it.id for it in self.retry}
        out = {}
        for iid in item_ids:
            total, mine = self.died.get(iid), own.get(iid)
            if total is None or iid in fresh:
                continue
            counts = [t - m for t, m in zip(total, mine or [0, 0, 0], strict=True)]
            if counts[0] > 0:
                out[iid] = counts
        return out


@dataclass
class Resumed:
    """What ``resume_sweep`` did. ``new_units`` is empty when nothing was missing;
    ``submission`` (SLURM) or ``outcomes`` (local, debug) say how the new units went."""

    plan: ResumePlan
    new_units: list[Unit] = field(default_factory=list)
    submission: SubmitOutcome | None = None
    outcomes: list[dispatch.UnitOutcome] = field(default_factory=list)
    items_submitted: int = 0
    retry_ids: set[str] = field(default_factory=set)  # of the new units, those redoing error records
    next_round: NextRound | None = None  # the next round, planned (and submitted on SLURM) by this resume
    started: list[str] = field(default_factory=list)  # local jobs started and left to run (``background``)
    prior: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # new unit -> deaths of its items elsewhere


def check_interpreter_env(sd: SweepDir) -> None:
    """Workers run this interpreter: its jax and jaxlib must be the ones the sweep was
    measured with (env.json), or new records would not mix with the old ones."""
    env = sd.recorded_env()
    if not env or sd.spec.kernel.impl == "replay":  # a replay runs no jax: its env is the source's
        return
    here: dict[str, str | None] = {}
    for dist in ("jax", "jaxlib"):
        try:
            here[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            here[dist] = None
    diff = [f"{k} {here[k]} here vs {env.get(k)}" for k in here if env.get(k) is not None and here[k] != env.get(k)]
    if diff:
        raise MismatchError(
            f"the sweep in {sd.root} was measured with another stack ({', '.join(diff)}; see {sd.root / 'env.json'}); "
            "resume it from the environment that made it, or start a new sweep directory"
        )


def resume_settings(sd: SweepDir, spec_path: str | None) -> ExecutorSettings:
    """The executor settings to resume with: the sweep's own, or those of ``spec_path``,
    which must be the sweep's spec (its executor section may differ: it is not hashed)."""
    from orchestrator.spec.files import load_spec

    if spec_path is None:
        return sd.spec.executor
    spec = load_spec(spec_path)
    if spec.fingerprint() != sd.spec.fingerprint():
        raise MismatchError(
            f"{spec_path} is not the spec of the sweep in {sd.root} (fingerprint {spec.fingerprint()} != "
            f"{sd.spec.fingerprint()}); resume without --spec, or submit that spec to a new --sweep-dir"
        )
    return spec.executor


def _read_partials(sd: SweepDir, plan: ResumePlan) -> dict[str, tuple[tuple[str, int], dict[str, Any]]]:
    """Every recorded item id -> its newest record (by its attempt's start, then the later
    unit, as merge picks it); deaths per item into ``plan``. Refuses partials of another spec
    or environment."""
    from orchestrator.store.partials import read_partial

    fingerprint = sd.spec.fingerprint()
    env = sd.recorded_env()
    recorded: dict[str, tuple[tuple[str, int], dict[str, Any]]] = {}
    for pos, entry in enumerate(sd.unit_index()):
        path = sd.partial_path(entry["id"])
        content = read_partial(path)
        if entry.get("origin") == "reuse" and env is not None and any(h.get("env") != env for h in content.headers):
            log.warning(
                "%s: reused records checked against another environment than the workers' (%s); "
                "their items are measured",
                path,
                sd.root / "env.json",
            )
            continue
        for h in content.headers:
            if h.get("sweep") != fingerprint:
                raise MismatchError(
                    f"{path} holds records of another spec (fingerprint {h.get('sweep')} != "
                    f"{fingerprint}); resume refuses to mix them: move it out of {sd.partials}"
                )
            if env is not None and h.get("env") != env:
                raise MismatchError(
                    f"{path} was measured in another environment ({h.get('env')} vs {env} in "
                    f"{sd.root / 'env.json'}); resume refuses to mix them: "
                    f"move it out of {sd.partials}"
                )
        started = {h.get("attempt"): str(h.get("started") or "") for h in content.headers}
        for iid, (attempt, rec) in content.records.items():
            rank = (started.get(attempt, ""), pos)
            if iid not in recorded or recorded[iid][0] <= rank:
                recorded[iid] = (rank, rec)
        died = {
            iid: [n, content.deaths[iid], content.hangs[iid]]
            for iid, n in content.starts.items()
            if n > 0 and iid not in content.records
        }
        plan.died_by_unit[entry["id"]] = died
        for iid, counts in died.items():
            plan.died[iid] = [a + b for a, b in zip(plan.died.get(iid, [0, 0, 0]), counts, strict=True)]
    return recorded


def plan_resume(sd: SweepDir, st: SweepStatus, *, force: bool = False, retry: str | None = None) -> ResumePlan:
    """Every planned item without a record in any partial, and every survivor of round 2
    without a record timed in full, less those of units still pending or running (unless
    ``force``); with ``retry`` (``records.RETRY_KINDS``) also the measured
    items whose newest record is an error of that kind (``plan.retry``; never one the plan
    decides: pruned or invalid). Refuses partials of another spec or environment."""
    from orchestrator.planning import RUN
    from orchestrator.spec.records import retried

    plan = ResumePlan()
    recorded = _read_partials(sd, plan)
    plan.recorded = len(recorded)
    # pending, running or requeued; a unit never submitted is "pending" too, but nothing runs it
    active = {u.id for u in st.units if u.state in ACTIVE and u.submitted}
    held: set[str] = set()
    if not force:
        plan.active = sorted(active)
        for uid in plan.active:
            held.update(it.id for it in sd.unit_items(uid))
    full = {iid for iid, (_, rec) in recorded.items() if not rec.get("screened")}  # newest: round 2's if done
    survivors = {it.id for u in st.units if u.round == 2 for it in sd.unit_items(u.id)}
    for u in st.units:
        if (u.id in active and not force) or u.complete or u.done >= u.total:
            continue
        missing = {it.id for it in sd.unit_items(u.id)} - (full if u.round == 2 else recorded.keys())
        if missing:
            plan.missing_of[u.id] = missing
    for it in sd.items():
        if it.id in (full if it.id in survivors else recorded):
            if retry and it.kind == RUN and it.id not in held and retried(recorded[it.id][1], retry):
                plan.retry.append(it)
            continue
        if it.id in held:
            plan.held += 1
        else:
            (plan.missing2 if it.id in survivors else plan.missing).append(it)
    return plan


def group_missing(
    sd: SweepDir,
    missing: list[WorkItem],
    n_units: int | None,
    default: int,
    settings: ExecutorSettings | None = None,
    round_: int = 1,
) -> list[Unit]:
    """The missing items as units of round ``round_`` (``rounds.group``: ``plan.shard`` with the
    cost model of the spec and round); by default as many as ``default``, rounded up to fill
    whole SLURM tasks (a unit per GPU)."""
    n = n_units or (settings or sd.spec.executor).fill_tasks(max(1, default))
    return group(sd, missing, n, round_)


def _record_resume(sd: SweepDir, plan: ResumePlan, new_units: list[Unit], submitted: set[str], force: bool) -> None:
    """The ended units whose every missing item went into a submitted new unit are replaced:
    status shows them as resumed, not as failures to act on."""
    items_in = {it.id for u in new_units if u.id in submitted for it in u.items}
    replaces = sorted(uid for uid, miss in plan.missing_of.items() if uid not in submitted and miss <= items_in)
    sd.record_jobs(
        [
            {
                "event": "resume",
                "replaces": replaces,
                "units": sorted(submitted),
                "time": now_iso(),
                "ts": round(time.time(), 3),
                "force": force,
            }
        ]
    )


def resume_sweep(
    sd: SweepDir,
    settings: ExecutorSettings,
    *,
    force: bool,
    units: int | None,
    max_array_size: int | None,
    on_planned: Callable[[Resumed], None] | None = None,
    retry: str | None = None,
    include_missing: bool = True,
    on_poll: Callable[[], None] | None = None,
    background: bool = False,
) -> Resumed:
    """Hand the missing items of a sweep to new units: submitted to SLURM (returns once
    sbatch took them), or run here to completion (local, debug; ``on_poll`` is called whenever
    a unit may have moved on), or with ``background`` started here and left to run (local:
    at most one unit per worker slot; the rounds they make due are not run). ``retry``: also redo the
    error records of that kind, in units of their own (origin "retry": their records supersede
    the errors, newest wins, so status does not count those items twice). ``on_planned`` is
    called once the plan is known (new units empty when nothing is to do), before anything is
    written or run, so a failing print there changes nothing. A halving sweep whose round 1
    is complete gets round 2 planned here if nobody has (``on_planned`` is then told of it)."""
    slurm = settings.kind == "slurm"
    if slurm:
        require_submit_tools()
    check_interpreter_env(sd)
    with sweep_lock(sd):
        plan = plan_resume(sd, sweep_status(sd), force=force, retry=retry)
        if not include_missing:  # `run --retry-errors`: run itself redoes what is missing
            plan.missing, plan.missing2, plan.missing_of = [], [], {}
        result = Resumed(plan=plan)
        cap = dispatch.local_slots(sd.spec) if background and not slurm else None  # all started at once
        _new_units(sd, result, units, settings, cap)
        if result.new_units:
            if on_planned is not None:
                on_planned(result)
            new_ids = [u.id for u in result.new_units]
            result.prior = {u.id: plan.prior_starts(u.id, [it.id for it in u.items]) for u in result.new_units}
            if slurm:
                submitted = _submit_new_units(sd, result, settings, result.prior, max_array_size, force)
            else:
                _add_units(sd, result)
                submitted = set(new_ids)
                _record_resume(sd, plan, result.new_units, submitted, force)
            result.items_submitted = sum(len(u.items) for u in result.new_units if u.id in submitted)
    if not result.new_units:
        if not plan.held and include_missing:
            result.next_round = advance(sd, settings)
        if on_planned is not None:
            on_planned(result)
    if not slurm:
        ids = [u.id for u in result.new_units]
        if background:
            result.started = dispatch.start_units_locally(sd, ids, prior_starts=result.prior)
            return result
        result.outcomes = dispatch.run_units_locally(
            sd, ids, kind=settings.kind, prior_starts=result.prior, on_poll=on_poll
        )
        result.outcomes += _run_next_rounds(sd, settings, result, on_poll)
    return result


def _new_units(
    sd: SweepDir, result: Resumed, units: int | None, settings: ExecutorSettings, cap: int | None = None
) -> None:
    """The plan's items as new units: the missing of each round in units of that round, the
    error records to retry in units of their own; ``cap``: at most that many units of each
    kind. Each new unit gets an id of its own (``unit_id`` tagged with this resume), even where
    it holds every item of the unit it replaces, or items retried before, so the records it
    makes say they are this resume's."""
    plan = result.plan
    default = len(plan.missing_of) or 1
    if cap is not None:
        units = min(units or settings.fill_tasks(default), cap)
    if plan.missing:
        result.new_units = group_missing(sd, plan.missing, units, default=default, settings=settings)
    if plan.missing2:
        result.new_units += group_missing(sd, plan.missing2, units, default=default, settings=settings, round_=2)
    n, sweep = len(sd.unit_index()), sd.spec.fingerprint()
    for u in result.new_units:
        u.finalize(sweep, tag=f"resume-{n}" + (f"-round{u.round}" if u.round != 1 else ""))
    if plan.retry:
        retry_units = group_missing(sd, plan.retry, units, default=1, settings=settings)
        for u in retry_units:
            u.finalize(sweep, tag=f"retry-{n}")
        result.retry_ids = {u.id for u in retry_units}
        result.new_units += retry_units


def _add_units(sd: SweepDir, result: Resumed) -> None:
    """The new units into the unit index: the missing items' as "resume", retries as "retry"."""
    for origin, units in (
        ("resume", [u for u in result.new_units if u.id not in result.retry_ids]),
        ("retry", [u for u in result.new_units if u.id in result.retry_ids]),
    ):
        if units:
            sd.add_units(units, origin=origin)


def _submit_new_units(
    sd: SweepDir,
    result: Resumed,
    settings: ExecutorSettings,
    prior: dict[str, dict[str, Any]],
    max_array_size: int | None,
    force: bool,
) -> set[str]:
    """Add the new units and submit them. Never half-undone: whatever stops the submission
    (a refusal, Ctrl-C, a closed pipe) takes out of ``units.json`` only the units no
    accepted array runs; those that sbatch accepted stay, and are recorded as resumed."""
    rollback = UnitsRollback(sd)
    _add_units(sd, result)
    new_ids = [u.id for u in result.new_units]
    try:
        result.submission = submit_with_merge(
            sd, new_ids, settings, origin="resume", max_array_size=max_array_size, then=merge_hook(sd), prior=prior
        )
    except BaseException:
        accepted = rollback.submitted_since(new_ids)
        rollback.undo([u for u in new_ids if u not in accepted])
        if accepted:
            _record_resume(sd, result.plan, result.new_units, accepted, force)
        raise
    submitted = {e["unit"] for e in result.submission.submission.entries}
    _record_resume(sd, result.plan, result.new_units, submitted, force)
    return submitted


def _run_next_rounds(
    sd: SweepDir, settings: ExecutorSettings, result: Resumed, on_poll: Callable[[], None] | None
) -> list[dispatch.UnitOutcome]:
    """Run here the rounds this resume planned, or that the units it ran made due."""

    def run(unit_ids: list[str]) -> list[dispatch.UnitOutcome]:
        return dispatch.run_units_locally(sd, unit_ids, kind=settings.kind, on_poll=on_poll)

    def ran(nxt: NextRound) -> None:
        result.next_round = nxt

    return run_rounds_here(sd, settings, run, planned=result.next_round, on_round=ran)
