"""Resuming a sweep: the items without a record, regrouped into new units and run again.

``plan_resume`` reads every partial (parsed: resume is rare) and says which planned items
have no record, which of them still belong to a unit that is pending or running, and how
often each item killed a worker so far (a config that keeps killing its worker must be
given up on even when it moves to a new unit). ``resume_sweep`` submits the missing items
(SLURM) or runs them here (local, debug) and records which ended units they replace.
Nothing here prints; ``on_planned`` lets the caller speak before anything runs.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.control import dispatch
from orchestrator.control.scheduler import require_submit_tools
from orchestrator.control.status import ACTIVE, SweepStatus, sweep_status
from orchestrator.control.submit import SubmitOutcome, UnitsRollback, submit_with_merge
from orchestrator.control.sweeps import sweep_lock
from orchestrator.errors import MismatchError
from orchestrator.planning import Unit, WorkItem
from orchestrator.spec.model import ExecutorSettings
from orchestrator.store.sweepdir import SweepDir, now_iso


@dataclass
class ResumePlan:
    """What ``resume`` would submit, computed from the partials (parsed: resume is rare)."""

    missing: list[WorkItem] = field(default_factory=list)  # items without a record, free to submit
    held: int = 0  # items without a record whose unit is still pending or running
    active: list[str] = field(default_factory=list)  # those units
    recorded: int = 0
    missing_of: dict[str, set[str]] = field(default_factory=dict)  # ended unit -> its missing item ids
    starts: Counter = field(default_factory=Counter)  # item id -> starts that died, over all partials
    starts_by_unit: dict[str, Counter] = field(default_factory=dict)

    def prior_starts(self, unit_id: str, item_ids: list[str]) -> dict[str, int]:
        """Deaths on each item in partials other than this unit's own (the worker reads its own)."""
        own = self.starts_by_unit.get(unit_id, Counter())
        out = {iid: self.starts[iid] - own[iid] for iid in item_ids}
        return {iid: n for iid, n in out.items() if n > 0}


@dataclass
class Resumed:
    """What ``resume_sweep`` did. ``new_units`` is empty when nothing was missing;
    ``submission`` (SLURM) or ``outcomes`` (local, debug) say how the new units went."""

    plan: ResumePlan
    new_units: list[Unit] = field(default_factory=list)
    submission: SubmitOutcome | None = None
    outcomes: list[dispatch.UnitOutcome] = field(default_factory=list)
    items_submitted: int = 0


def check_interpreter_env(sd: SweepDir) -> None:
    """Workers run this interpreter: its jax and jaxlib must be the ones the sweep was
    measured with (env.json), or new records would not mix with the old ones."""
    env = sd.recorded_env()
    if not env:
        return
    here = {}
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


def _read_partials(sd: SweepDir, plan: ResumePlan) -> set[str]:
    """Every recorded item id; deaths per item into ``plan``. Refuses partials of another
    spec or environment."""
    from orchestrator.store.partials import read_partial

    fingerprint = sd.spec.fingerprint()
    env = sd.recorded_env()
    recorded: set[str] = set()
    for entry in sd.unit_index():
        path = sd.partial_path(entry["id"])
        content = read_partial(path)
        for h in content.headers:
            if h.get("sweep") != fingerprint:
                raise MismatchError(f"{path} holds records of another spec (fingerprint {h.get('sweep')} != "
                                    f"{fingerprint}); resume refuses to mix them: move it out of {sd.partials}")
            if env is not None and h.get("env") != env:
                raise MismatchError(f"{path} was measured in another environment ({h.get('env')} vs {env} in "
                                    f"{sd.root / 'env.json'}); resume refuses to mix them: "
                                    f"move it out of {sd.partials}")
        recorded.update(content.records)
        died = Counter({iid: n for iid, n in content.starts.items() if n > 0 and iid not in content.records})
        plan.starts_by_unit[entry["id"]] = died
        plan.starts.update(died)
    return recorded


def plan_resume(sd: SweepDir, st: SweepStatus, *, force: bool = False) -> ResumePlan:
    """Every planned item without a record in any partial, less those of units still pending
    or running (unless ``force``). Refuses partials of another spec or environment."""
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
    for u in st.units:
        if (u.id in active and not force) or u.complete or u.done >= u.total:
            continue
        missing = {it.id for it in sd.unit_items(u.id)} - recorded
        if missing:
            plan.missing_of[u.id] = missing
    for it in sd.items():
        if it.id in recorded:
            continue
        if it.id in held:
            plan.held += 1
        else:
            plan.missing.append(it)
    return plan


def group_missing(sd: SweepDir, missing: list[WorkItem], n_units: int | None, default: int,
                  settings: ExecutorSettings | None = None) -> list[Unit]:
    """The missing items as units (``plan.shard``, cost model of the spec); by default as
    many as ``default``, rounded up to fill whole SLURM tasks (a unit per GPU)."""
    from orchestrator.planning import shard
    from orchestrator.planning.costs import item_costs, setup_estimate

    spec = sd.spec
    costs, scale = item_costs(missing, spec)
    setups = {it.shape: setup_estimate(it.shape, spec.modes, spec.causal) * scale for it in missing}
    n = n_units or (settings or spec.executor).fill_tasks(max(1, default))
    return shard(missing, min(n, len(missing)), costs=costs, setups=setups, strategy=spec.sharding.strategy)


def _record_resume(sd: SweepDir, plan: ResumePlan, new_units: list[Unit], submitted: set[str], force: bool) -> None:
    """The ended units whose every missing item went into a submitted new unit are replaced:
    status shows them as resumed, not as failures to act on."""
    items_in = {it.id for u in new_units if u.id in submitted for it in u.items}
    replaces = sorted(uid for uid, miss in plan.missing_of.items() if uid not in submitted and miss <= items_in)
    sd.record_jobs([{"event": "resume", "replaces": replaces, "units": sorted(submitted), "time": now_iso(),
                     "ts": round(time.time(), 3), "force": force}])


def resume_sweep(sd: SweepDir, settings: ExecutorSettings, *, force: bool, units: int | None,
                 max_array_size: int | None, on_planned: Callable[[Resumed], None] | None = None) -> Resumed:
    """Hand the missing items of a sweep to new units: submitted to SLURM (returns once
    sbatch took them), or run here to completion (local, debug). ``on_planned`` is called
    once the plan is known (new units empty when nothing is missing), before anything is
    written or run, so a failing print there changes nothing."""
    slurm = settings.kind == "slurm"
    if slurm:
        require_submit_tools()
    check_interpreter_env(sd)
    with sweep_lock(sd):
        plan = plan_resume(sd, sweep_status(sd), force=force)
        result = Resumed(plan)
        if plan.missing:
            result.new_units = group_missing(sd, plan.missing, units, default=len(plan.missing_of) or 1,
                                             settings=settings)
        if on_planned is not None:
            on_planned(result)
        if not result.new_units:
            return result
        new_ids = [u.id for u in result.new_units]
        prior = {u.id: plan.prior_starts(u.id, [it.id for it in u.items]) for u in result.new_units}
        if slurm:
            submitted = _submit_new_units(sd, result, settings, prior, max_array_size, force)
        else:
            sd.add_units(result.new_units, origin="resume")
            submitted = set(new_ids)
            _record_resume(sd, plan, result.new_units, submitted, force)
    if not slurm:
        result.outcomes = dispatch.run_units_locally(sd, new_ids, kind=settings.kind, prior_starts=prior)
    result.items_submitted = sum(len(u.items) for u in result.new_units if u.id in submitted)
    return result


def _submit_new_units(sd: SweepDir, result: Resumed, settings: ExecutorSettings, prior: dict[str, dict[str, int]],
                      max_array_size: int | None, force: bool) -> set[str]:
    """Add the new units and submit them. Never half-undone: whatever stops the submission
    (a refusal, Ctrl-C, a closed pipe) takes out of ``units.json`` only the units no
    accepted array runs; those that sbatch accepted stay, and are recorded as resumed."""
    rollback = UnitsRollback(sd)
    sd.add_units(result.new_units, origin="resume")
    new_ids = [u.id for u in result.new_units]
    try:
        result.submission = submit_with_merge(sd, new_ids, settings, origin="resume",
                                              max_array_size=max_array_size, prior=prior)
    except BaseException:
        accepted = rollback.submitted_since(new_ids)
        rollback.undo([u for u in new_ids if u not in accepted])
        if accepted:
            _record_resume(sd, result.plan, result.new_units, accepted, force)
        raise
    submitted = {e["unit"] for e in result.submission.submission.entries}
    _record_resume(sd, result.plan, result.new_units, submitted, force)
    return submitted
