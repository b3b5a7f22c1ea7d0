"""What ``tilesweep resume`` would redo, read from a sweep's partials: the items without the
record their round gives them, those still held by units that are pending or running, the
error records asked to redo, and how often each item killed a worker so far (a config that
keeps killing its worker must be given up on even when it moves to a new unit).

Every partial is parsed (resume is rare). An item of round 1 is missing while it has no record
at all; an item of a later round that times in full (halving's survivors, a screened search's)
while it has no record timed in full. A search resumes only what its rounds chose: the configs
no round chose are never measured, not missing. ``resume`` hands what is missing to new units.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kernels.spelling import as_json
from orchestrator.control.status import ACTIVE, SweepStatus, UnitStatus
from orchestrator.errors import MismatchError
from orchestrator.planning import WorkItem
from orchestrator.planning.search import SEARCH
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)


@dataclass
class ResumePlan:
    """What ``resume`` would submit, computed from the partials (parsed: resume is rare)."""

    missing: list[WorkItem] = field(default_factory=list)  # items without a record, free to submit
    # items of a later round without the record it gives them, by round: halving's survivors
    # without a full record, a search's configs of that round
    later: dict[int, list[WorkItem]] = field(default_factory=dict)
    held: int = 0  # items without a record whose unit is still pending or running
    active: list[str] = field(default_factory=list)  # those units
    recorded: int = 0
    missing_of: dict[str, set[str]] = field(default_factory=dict)  # ended unit -> its missing item ids
    # of those, the units no earlier resume replaced: one new unit each by default
    unreplaced: list[str] = field(default_factory=list)
    # units never submitted whose every item has a record from another unit: nothing left to them
    moot: list[str] = field(default_factory=list)
    # units nothing ever submitted or started (a plan never run): run as the plan made them, unit id ->
    # its items; their items are in none of the lists above
    as_planned: dict[str, int] = field(default_factory=dict)
    # item id -> [starts that died with it in flight, deaths while it was alone, of those hung],
    # over all partials and per unit
    died: dict[str, list[int]] = field(default_factory=dict)
    died_by_unit: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    retry: list[WorkItem] = field(default_factory=list)  # error records of the kind asked to redo

    @property
    def missing2(self) -> list[WorkItem]:
        """Halving's round-2 survivors without a full record."""
        return self.later.get(2, [])

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


def _fingerprints(theirs: object, ours: str) -> str:
    """A partial's spec fingerprint against the sweep's, as a refusal says them: in words where
    its header names none, as JSON spells a value that is not one (a number, an object)."""
    if theirs is None:
        return f"its header names no spec fingerprint; the sweep's is {ours}"
    shown = theirs if isinstance(theirs, str) and theirs else as_json(theirs)
    return f"fingerprint {shown} != {ours}"


def _read_partials(sd: SweepDir, plan: ResumePlan) -> dict[str, tuple[tuple[str, int], dict[str, Any]]]:
    """Every recorded item id -> its newest record (by its attempt's start, then the later
    unit, as merge picks it); deaths per item into ``plan``. Refuses partials of another spec
    or environment."""
    from orchestrator.store.envfile import ENV_FILE, measured_in
    from orchestrator.store.partials import read_partial

    fingerprint = sd.spec.fingerprint()
    env = sd.recorded_env()
    sweeps = f"the sweep's in {sd.root / ENV_FILE}"
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
                    f"{path} holds records of another spec ({_fingerprints(h.get('sweep'), fingerprint)}); "
                    f"resume refuses to mix them: move it out of {sd.partials}"
                )
            if env is not None and h.get("env") != env:
                raise MismatchError(
                    f"{path} was measured in {measured_in(h.get('env'), env, sweeps)}; "
                    f"resume refuses to mix them: move it out of {sd.partials}"
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


def plan_resume(
    sd: SweepDir, st: SweepStatus, *, force: bool = False, retry: str | None = None, keep_planned: bool = True
) -> ResumePlan:
    """Every planned item without a record in any partial, and every survivor of round 2
    without a record timed in full, less those of units still pending or running (unless
    ``force``); with ``retry`` (``errorkinds.RETRY_KINDS``) also the measured
    items whose newest record is an error of that kind (``plan.retry``; never one the plan
    decides: pruned or invalid). With ``keep_planned``, the units nothing ever submitted or
    started go as they are (``plan.as_planned``), not as missing items for new units: a plan never
    run runs its own units, as status and their logs name them. Refuses partials of another spec
    or environment."""
    from orchestrator.planning import RUN
    from orchestrator.spec.errorkinds import retried

    plan = ResumePlan()
    recorded = _read_partials(sd, plan)
    plan.recorded = len(recorded)
    # pending, running or requeued; a unit never submitted is "pending" too, but nothing runs it,
    # unless a live worker holds its lease (one run by hand)
    active = {u.id for u in st.units if u.state in ACTIVE and (u.submitted or u.leased)}
    held: set[str] = set()
    if not force:
        plan.active = sorted(active)
        for uid in plan.active:
            held.update(it.id for it in sd.unit_items(uid))
    full = {iid for iid, (_, rec) in recorded.items() if not rec.get("screened")}  # newest: round 2's if done
    later = _later_rounds(sd, st)
    kept: set[str] = set()  # the items of the units run as planned
    for u in st.units:
        if (u.id in active and not force) or u.complete or u.done >= u.total:
            continue
        own = {it.id for it in sd.unit_items(u.id)}
        missing = own - (full if _times_in_full(sd, u.round) else recorded.keys())
        if keep_planned and missing == own and _never_started(sd, u):
            plan.as_planned[u.id] = len(own)
            kept.update(own)
        elif missing:
            plan.missing_of[u.id] = missing
            if not u.resumed:
                plan.unreplaced.append(u.id)
        elif (u.state in ACTIVE or u.covered) and not u.submitted and not u.resumed:
            plan.moot.append(u.id)
    for it in _universe(sd, st):
        number = later.get(it.id, 1)
        if it.id in (full if _times_in_full(sd, number) else recorded):
            if retry and it.kind == RUN and it.id not in held and retried(recorded[it.id][1], retry):
                plan.retry.append(it)
            continue
        if it.id in kept:
            continue
        if it.id in held:
            plan.held += 1
        elif number == 1:
            plan.missing.append(it)
        else:
            plan.later.setdefault(number, []).append(it)
    return plan


def _never_started(sd: SweepDir, u: UnitStatus) -> bool:
    """Whether nothing ever ran the unit, one of round 1's: never submitted or started here, no
    worker on it (its partial is the first thing a worker writes), its items handed to no later
    unit, and not a retry of other units' error records."""
    if u.round != 1 or u.submitted or u.leased or u.resumed or u.covered or u.retry or u.carried:
        return False
    return not sd.partial_path(u.id).exists()


def _later_rounds(sd: SweepDir, st: SweepStatus) -> dict[str, int]:
    """Item id -> the latest round after the first whose units hold it."""
    out: dict[str, int] = {}
    for u in st.units:
        if u.round > 1:
            for it in sd.unit_items(u.id):
                out[it.id] = max(u.round, out.get(it.id, 0))
    return out


def _times_in_full(sd: SweepDir, number: int) -> bool:
    """Whether an item of a round after the first lacks its record until it is timed in full
    (halving's survivors, a screened search's survivors); round 1's needs any record."""
    from orchestrator.planning.halving import measurement

    return number > 1 and not measurement("forced", sd.spec, number).screened


def _universe(sd: SweepDir, st: SweepStatus) -> list[WorkItem]:
    """The items resume may find missing: every item of the plan, or for a search only those
    its rounds chose (its units hold them: the rest of the grid is never measured, not missing)."""
    if sd.spec.timing.strategy != SEARCH:
        return sd.items()
    chosen = {it.index for u in st.units for it in sd.unit_items(u.id)}
    return [it for it in sd.items() if it.index in chosen]
