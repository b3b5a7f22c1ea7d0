"""Resuming a sweep: the items without a record, regrouped into new units and run again.

``plan_resume`` (``resume_plan``) reads every partial and says which planned items have no
record, which of them still belong to a unit that is pending or running, and how often each
item killed a worker so far. ``resume_sweep`` submits the missing items (SLURM) or runs them
here (local, debug), each in new units of its own round, and records which ended units they
replace; the units a plan made that nothing ever submitted or started (a plan never run) go
as they are, so status and their logs name them as the plan did. Nothing here prints;
``on_planned`` lets the caller speak before anything runs.

A sweep whose last round is complete and whose next round nobody planned (the merge job
could not submit it) gets that round planned and submitted (or run here) by resume.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import PROG, word
from orchestrator.control import dispatch
from orchestrator.control.arrays import SubmitOutcome, UnitsRollback, require_cluster_takes, submit_with_merge
from orchestrator.control.resume_plan import ResumePlan, plan_resume
from orchestrator.control.rounds import NextRound, advance, group, merge_hook, run_rounds_here
from orchestrator.control.scheduler import require_submit_tools
from orchestrator.control.status import sweep_status
from orchestrator.control.sweeps import check_interpreter_env, sweep_lock
from orchestrator.errors import DispatchError, MismatchError, SpecError
from orchestrator.planning import Unit, WorkItem
from orchestrator.spec.differences import spec_differences
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.store.sweep_paths import log_folder
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)


@dataclass
class Resumed:
    """What ``resume_sweep`` did. ``unit_ids`` is empty when nothing was missing; ``submission``
    (SLURM) or ``outcomes`` (local, debug) say how its units went."""

    plan: ResumePlan
    new_units: list[Unit] = field(default_factory=list)
    submission: SubmitOutcome | None = None
    outcomes: list[dispatch.UnitOutcome] = field(default_factory=list)
    items_submitted: int = 0
    retry_ids: set[str] = field(default_factory=set)  # of the new units, those redoing error records
    next_round: NextRound | None = None  # the next round, planned (and submitted on SLURM) by this resume
    started: list[str] = field(default_factory=list)  # local jobs started and left to run (``background``)
    prior: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # unit run -> deaths of its items elsewhere

    @property
    def unit_ids(self) -> list[str]:
        """The units this resume runs or submits: the plan's own never started (``plan.as_planned``),
        then the new ones."""
        return [*self.plan.as_planned, *(u.id for u in self.new_units)]


def resume_settings(sd: SweepDir, spec_path: str | None) -> ExecutorSettings:
    """The executor settings to resume with: the sweep's own, or those of ``spec_path``,
    which must be the sweep's spec (its executor section may differ: it is not hashed)."""
    from orchestrator.spec.files import load_spec, sweep_dir_given

    if spec_path is None:
        return sd.spec.executor
    given = sweep_dir_given(Path(spec_path))
    if given is not None:  # not the spec loading's advice: `resume DIR` is the command just typed
        what = "the sweep directory" if given == Path(spec_path) else "the plan of the sweep directory"
        source = sd.meta.get("spec_source")
        planned_from = f" (it was planned from {source})" if source else ""
        raise SpecError(
            f"--spec {spec_path} is {what} {given}, not a spec file; --spec takes a spec file of the sweep in "
            f"{sd.root}{planned_from}, whose executor settings resume uses, or resume without --spec to keep "
            "the sweep's own"
        )
    spec = load_spec(spec_path)
    if not spec.same_sweep(sd.spec):
        raise MismatchError(
            f"{spec_path} is not the spec of the sweep in {sd.root} ({spec_differences(spec, sd.spec)}); "
            "resume without --spec, or submit that spec to a new --sweep-dir"
        )
    if spec.replay is not None and sd.spec.replay is not None and spec.replay.pace != sd.spec.replay.pace:
        _set_pace(sd, spec.replay.pace)
    return spec.executor


def keep_settings(sd: SweepDir, settings: ExecutorSettings, spec_path: str) -> bool:
    """Make ``settings`` (those of the spec ``spec_path`` a resume was given, which resumed the
    sweep) the sweep's own, for the resumes, rounds and merge jobs after it; whether they changed.
    Called once the resume has submitted or run its units: a refused one changes nothing. SLURM
    settings the cluster would refuse (an unknown partition: ``require_cluster_takes``) are refused
    here too, naming the file, where the resume submitted nothing that checked them (its units
    still pending or running)."""
    if settings == sd.spec.executor:
        return False
    if settings.kind == "slurm":
        require_cluster_takes(settings, sd.spec, spec_file=spec_path)
    with sweep_lock(sd):
        sd.rewrite_meta(spec={**sd.meta["spec"], "executor": settings.model_dump(mode="json")})
    return True


def _set_pace(sd: SweepDir, pace: str) -> None:
    """A replay resumed with a spec of the other pace (not part of the fingerprint) replays at
    that pace from now on: sweep.json says so, for every worker and command after it."""
    with sweep_lock(sd):
        spec = sd.meta["spec"]
        sd.rewrite_meta(spec={**spec, "replay": {**spec["replay"], "pace": pace}})
    log.warning("%s replays at pace %s from now on (the spec given to resume says so)", sd.root, pace)


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
    settings = settings or sd.spec.executor
    return group(sd, missing, n_units or settings.fill_tasks(max(1, default)), round_, settings)


def _record_resume(sd: SweepDir, plan: ResumePlan, new_units: list[Unit], submitted: set[str], force: bool) -> None:
    """The ended units whose every missing item went into a submitted new unit are replaced, and
    so are the units never submitted whose items other units recorded since: status shows them
    as resumed, not as failures to act on (or units for ``wait`` to ask ``resume`` for)."""
    items_in = {it.id for u in new_units if u.id in submitted for it in u.items}
    replaces = sorted(uid for uid, miss in plan.missing_of.items() if uid not in submitted and miss <= items_in)
    replaces = sorted({*replaces, *plan.moot})
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
    wait_lowering: Callable[[Path], None] | None = None,
    on_round: Callable[[NextRound], None] | None = None,
    spec_file: str | None = None,
) -> Resumed:
    """Hand the missing items of a sweep to new units (the units a plan made that nothing ever
    started go as they are, unless ``units`` asks for new ones): submitted to SLURM (returns once
    sbatch took them), or run here to completion (local, debug; ``on_poll`` is called whenever
    a unit may have moved on), or with ``background`` started here and left to run (local:
    at most one unit per worker slot; the rounds they make due are not run). ``retry``: also redo the
    error records of that kind, in units of their own (origin "retry": their records supersede
    the errors, newest wins, so status does not count those items twice). ``on_planned`` is
    called once the plan is known (new units empty when nothing is to do), before anything is
    written or run, so a failing print there changes nothing. A halving sweep whose round 1
    is complete gets round 2 planned here if nobody has (``on_planned`` is then told of it).
    ``wait_lowering``: what a resume here does before a round its units make due is planned, and
    ``on_round`` once it is (``rounds.run_rounds_here``); the caller waited before this resume began.
    ``spec_file``: the spec given to ``resume --spec``, whose executor settings ``settings`` are, named
    where the cluster would refuse them."""
    slurm = settings.kind == "slurm"
    _refused_before(sd, slurm)
    # all started at once: at most as many as run here at a time (``run``'s workers)
    cap = dispatch.local_slots(sd.spec, settings.local_workers) if background and not slurm else None
    with sweep_lock(sd):
        plan = _plan(sd, force, retry, units, cap)
        if not include_missing:  # `run --retry-errors`: run itself redoes what is missing
            plan.missing, plan.later, plan.missing_of, plan.unreplaced, plan.as_planned = [], {}, {}, [], {}
        result = Resumed(plan=plan)
        _new_units(sd, result, units, settings, None if cap is None else cap - len(plan.as_planned))
        if not result.unit_ids and plan.moot:  # nothing to submit: they are settled all the same
            _record_resume(sd, plan, [], set(), force)
        if result.unit_ids:
            if slurm:  # what the cluster would refuse, refused before the plan is said, as submit refuses it
                require_cluster_takes(settings, sd.spec, spec_file=spec_file, sweep=sd)
            if on_planned is not None:
                on_planned(result)
            _hand_over(sd, result, settings, max_array_size, force)
    if not result.unit_ids:
        if not plan.held and include_missing:
            result.next_round = advance(sd, settings)
        if on_planned is not None:
            on_planned(result)
    if not slurm:
        _run_here(sd, settings, result, background, on_poll, wait_lowering, on_round)
    return result


def _hand_over(
    sd: SweepDir, result: Resumed, settings: ExecutorSettings, max_array_size: int | None, force: bool
) -> None:
    """The resume's units handed on, with the deaths of their items in other units: submitted
    (SLURM) or put in the unit index to run here, and the resume recorded."""
    plan = result.plan
    result.prior = {uid: plan.prior_starts(uid, [it.id for it in sd.unit_items(uid)]) for uid in plan.as_planned}
    result.prior |= {u.id: plan.prior_starts(u.id, [it.id for it in u.items]) for u in result.new_units}
    if settings.kind == "slurm":
        submitted = _submit_new_units(sd, result, settings, result.prior, max_array_size, force)
    else:
        _add_units(sd, result)
        submitted = set(result.unit_ids)
        _record_resume(sd, plan, result.new_units, submitted, force)
    sizes = {**plan.as_planned, **{u.id: len(u.items) for u in result.new_units}}
    result.items_submitted = sum(n for uid, n in sizes.items() if uid in submitted)


def _plan(sd: SweepDir, force: bool, retry: str | None, units: int | None, cap: int | None) -> ResumePlan:
    """What the resume redoes. The units a plan made that nothing ever started run as they are,
    unless ``--units`` asks for new units of every missing item, or they and the units of the
    other items it redoes would start more at once than ``cap`` (``resume --no-wait``): then
    they are regrouped with the rest."""
    st = sweep_status(sd)  # read once: the second plan, if any, is of the same sweep at the same moment
    plan = plan_resume(sd, st, force=force, retry=retry, keep_planned=units is None)
    kinds = bool(plan.missing) + len(plan.later) + bool(plan.retry)
    if plan.as_planned and cap is not None and len(plan.as_planned) + kinds > cap:
        plan = plan_resume(sd, st, force=force, retry=retry, keep_planned=False)
    return plan


def _refused_before(sd: SweepDir, slurm: bool) -> None:
    """What a resume refuses before it plans or writes anything: SLURM's tools missing (on
    SLURM), another interpreter than the sweep's workers', a logs folder its units' workers
    cannot write into."""
    if slurm:
        require_submit_tools()
    check_interpreter_env(sd)
    log_folder(sd.logs)


def _run_here(
    sd: SweepDir,
    settings: ExecutorSettings,
    result: Resumed,
    background: bool,
    on_poll: Callable[[], None] | None,
    wait_lowering: Callable[[Path], None] | None,
    on_round: Callable[[NextRound], None] | None,
) -> None:
    """The new units run here (local, debug), and the rounds they make due; with
    ``background`` started and left to run."""
    ids = result.unit_ids
    if background:
        result.started = dispatch.start_units_locally(sd, ids, prior_starts=result.prior)
        return
    result.outcomes = dispatch.run_units_locally(
        sd, ids, kind=settings.kind, workers=settings.local_workers, prior_starts=result.prior, on_poll=on_poll
    )
    result.outcomes += _run_next_rounds(sd, settings, result, on_poll, wait_lowering, on_round)


def _new_units(
    sd: SweepDir, result: Resumed, units: int | None, settings: ExecutorSettings, cap: int | None = None
) -> None:
    """The plan's items as new units: the missing of each round in units of that round, the
    error records to retry in units of their own; ``cap``: at most that many units of each
    kind. Each new unit gets an id of its own (``unit_id`` tagged with this resume), even where
    it holds every item of the unit it replaces, or items retried before, so the records it
    makes say they are this resume's."""
    plan = result.plan
    default = len(plan.unreplaced) or 1  # a unit an earlier resume replaced is its new unit's, counted there
    rounds = ([(1, plan.missing)] if plan.missing else []) + sorted(plan.later.items())
    shares = _shares(
        sd,
        cap,
        [f"round {number}'s missing items" for number, _ in rounds]
        + (["the error records to retry"] if plan.retry else []),
    )
    if cap is not None:
        units = min(units or settings.fill_tasks(default), cap)
    for k, (number, items) in enumerate(rounds):
        n_units = min(units, shares[k]) if units is not None and shares else units
        result.new_units += group_missing(sd, items, n_units, default=default, settings=settings, round_=number)
    n, sweep = len(sd.unit_index()), sd.spec.fingerprint()
    for u in result.new_units:
        u.finalize(sweep, tag=f"resume-{n}" + (f"-round{u.round}" if u.round != 1 else ""))
    if plan.retry:
        n_units = min(units, shares[-1]) if units is not None and shares else units
        retry_units = group_missing(sd, plan.retry, n_units, default=1, settings=settings)
        for u in retry_units:
            u.finalize(sweep, tag=f"retry-{n}")
        result.retry_ids = {u.id for u in retry_units}
        result.new_units += retry_units


def _shares(sd: SweepDir, cap: int | None, kinds: list[str]) -> list[int]:
    """How many new units each kind of them (a round's missing items, the retries: units of
    their own) may have where at most ``cap`` start at once (``resume --no-wait``); none where
    there is no cap. More kinds than ``cap`` are refused, before anything is written: a unit
    each would run more units here at a time than ``run`` does."""
    if cap is None or not kinds:
        return []
    if len(kinds) > cap:
        here = word(sd.root)
        raise DispatchError(
            f"`{PROG} resume --no-wait` starts its new units at once and {cap} run{'s' if cap == 1 else ''} here at a "
            f"time (executor.local_workers, else one per visible GPU), but the items of {sd.root} it redoes need "
            f"{len(kinds)} units of their own ({', '.join(kinds)}): `{PROG} resume {here}` with the same options "
            f"but --no-wait runs them {cap} at a time here and merges"
        )
    return [cap // len(kinds) + (1 if k < cap % len(kinds) else 0) for k in range(len(kinds))]


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
    rollback = UnitsRollback(sd)  # undoes only the units it adds: the plan's own stay
    _add_units(sd, result)
    new_ids = result.unit_ids
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
    sd: SweepDir,
    settings: ExecutorSettings,
    result: Resumed,
    on_poll: Callable[[], None] | None,
    wait_lowering: Callable[[Path], None] | None,
    on_round: Callable[[NextRound], None] | None,
) -> list[dispatch.UnitOutcome]:
    """Run here the rounds this resume planned, or that the units it ran made due; ``on_round``
    hears of each but the one it planned (``on_planned`` said that one)."""
    planned = result.next_round

    def run(unit_ids: list[str]) -> list[dispatch.UnitOutcome]:
        return dispatch.run_units_locally(
            sd, unit_ids, kind=settings.kind, workers=settings.local_workers, on_poll=on_poll
        )

    def ran(nxt: NextRound) -> None:
        result.next_round = nxt
        if on_round is not None and nxt is not planned:
            on_round(nxt)

    return run_rounds_here(sd, settings, run, planned=planned, on_round=ran, wait_lowering=wait_lowering)
