"""Advancing a sweep to its next round: one function, whoever calls it.

A strategy with rounds (``timing.strategy: halving`` or ``search``; ``strategy.RoundPlanner`` says what a
strategy adds) plans each round once the rounds before it have their records. ``advance``
does it for every caller alike: under the sweep's lock it asks the strategy for the round
still to plan, makes its items units of that round (``group``: the round's cost model), adds
them to the index, lets the strategy write its record last, and on SLURM submits them with
their own final merge job; a submission sbatch refuses plans nothing (the units no accepted
array runs go, and so does the round's record when none was accepted). A round with nothing
to measure is recorded and the next one planned at once (no merge job would follow it).
Whoever comes second finds the round planned and does nothing.

Who calls it, so that nobody has to wait: on SLURM the final merge job (``after_merge``,
pickled by reference, so the merge job of a round advances the sweep to the next), ``wait``
and ``resume``; here ``run`` and ``resume`` (``run_rounds_here``, which runs each round the
one before it made due, each once no ``plan --lower`` of the sweep runs). Nothing here prints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import PROG
from orchestrator.control.arrays import SubmitOutcome, UnitsRollback, submit_with_merge
from orchestrator.control.dispatch import UnitOutcome
from orchestrator.control.scheduler import require_submit_tools
from orchestrator.control.searchrounds import SearchRounds
from orchestrator.control.strategy import RoundPlanner
from orchestrator.control.survivors import HalvingRounds
from orchestrator.control.sweeps import sweep_lock
from orchestrator.errors import DispatchError
from orchestrator.planning import Unit, WorkItem
from orchestrator.planning.halving import HALVING
from orchestrator.planning.search import SEARCH
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.store.leases import live_lowering
from orchestrator.store.sweepdir import SweepDir, now_iso

if TYPE_CHECKING:
    from orchestrator.control.dispatch.tasks import MergeHook

log = logging.getLogger(__name__)

# timing.strategy -> its rounds; a strategy not named here has one round.
PLANNERS: dict[str, RoundPlanner] = {HALVING: HalvingRounds(), SEARCH: SearchRounds()}


@dataclass
class NextRound:
    """What ``advance`` did: the round planned (its units: none when nothing went on; the
    strategy's account of it) and how its units were submitted (SLURM; None where they run
    here, or there are none)."""

    number: int
    units: list[Unit] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    outcome: SubmitOutcome | None = None


def planner_of(sd: SweepDir) -> RoundPlanner | None:
    """The sweep's strategy's rounds, or None for a strategy of one round."""
    return PLANNERS.get(sd.spec.timing.strategy)


def pending_round(sd: SweepDir) -> int | None:
    """The number of the round the sweep's strategy has still to plan (None: none); cheap,
    from the files alone. Whether the rounds before it are complete is ``advance``'s to find."""
    planner = planner_of(sd)
    return None if planner is None else planner.pending(sd)


def merge_hook(sd: SweepDir) -> MergeHook | None:
    """What a final merge job submitted now calls after merging: ``after_merge`` while the
    sweep has a round to come, else nothing."""
    return after_merge if pending_round(sd) is not None else None


def group(
    sd: SweepDir, items: list[WorkItem], n_units: int, round_: int, settings: ExecutorSettings | None = None
) -> list[Unit]:
    """Items as at most ``n_units`` units of ``round_``, packed by that round's cost model
    (resume regroups missing items with it too), tapered for the tasks of ``settings`` (default:
    the sweep's executor; ``ExecutorSettings.unit_shares``)."""
    from orchestrator.planning import shard
    from orchestrator.planning.costs import item_costs, setup_estimate

    spec = sd.spec
    costs, scale = item_costs(items, spec, round_=round_)
    setups = {it.shape: setup_estimate(it.shape, spec.modes, spec.causal) * scale for it in items}
    return shard(
        items,
        min(n_units, len(items)),
        costs=costs,
        setups=setups,
        strategy=spec.sharding.strategy,
        round_=round_,
        sweep=spec.fingerprint(),
        shares=(settings or spec.executor).unit_shares(),
    )


def _plan(sd: SweepDir, planner: RoundPlanner) -> NextRound | None:
    """Under the sweep's lock: the strategy's next round as units in the index, as many as the
    plan had, and the strategy's record of it last (where that cannot be written, the units are
    taken out of the index again: the round is planned whole or not at all); None when no round
    can be planned now."""
    if planner.pending(sd) is None:
        return None
    choice = planner.choose(sd)
    if choice is None:
        return None
    n_units = max(1, sum(1 for u in sd.unit_index() if u.get("origin") == "plan"))
    units = group(sd, choice.items, n_units, choice.number) if choice.items else []
    rollback = UnitsRollback(sd)
    sd.add_units(units, origin=f"round{choice.number}")
    try:
        planner.record(sd, choice, units)
    except BaseException:  # a full disk: units of a round not planned would be planned again beside it
        rollback.undo([u.id for u in units])
        raise
    return NextRound(number=choice.number, units=units, summary=choice.summary)


def advance(sd: SweepDir, settings: ExecutorSettings) -> NextRound | None:
    """Plan the sweep's next round once the rounds before it are complete and, on SLURM, submit
    its units with their own final merge job; None when there is nothing to plan (a strategy
    of one round, every round planned, or the rounds before still lack records). A refused
    submission plans nothing: the next ``wait``, ``resume`` or merge job retries."""
    planner = planner_of(sd)
    if planner is None or planner.pending(sd) is None:
        return None
    slurm = settings.kind == "slurm"
    if slurm:
        require_submit_tools()
    with sweep_lock(sd):
        rollback = UnitsRollback(sd)
        planned = _plan(sd, planner)
        while planned is not None and not planned.units and planner.pending(sd) is not None:
            following = _plan(sd, planner)  # a round with nothing to measure: the next one at once
            if following is None:
                break
            planned = following
        if planned is None:
            return None
        ids = [u.id for u in planned.units]
        if slurm and ids:
            origin = f"round{planned.number}"
            try:
                planned.outcome = submit_with_merge(
                    sd, ids, settings, origin=origin, max_array_size=None, then=merge_hook(sd)
                )
            except BaseException:  # as resume: units an accepted array runs stay, and so does the round
                accepted = rollback.submitted_since(ids)
                rollback.undo([u for u in ids if u not in accepted])
                if not accepted:
                    planner.forget(sd, planned.number)
                raise
    return planned


def run_rounds_here(
    sd: SweepDir,
    settings: ExecutorSettings,
    run: Callable[[list[str]], list[UnitOutcome]],
    *,
    planned: NextRound | None = None,
    on_round: Callable[[NextRound], None] | None = None,
    wait_lowering: Callable[[Path], None] | None = None,
) -> list[UnitOutcome]:
    """Run here (``run``: the units given, to completion) each round that comes due, starting
    with ``planned`` if the caller advanced already, until no round is left to plan or one
    lacks records; ``on_round`` hears of each round before its units run. Before each round it
    plans, ``wait_lowering`` returns once no ``plan --lower`` of the sweep runs (as ``wait``
    waits before it submits one): a unit started meanwhile could compile configs it refuses."""

    def next_round() -> NextRound | None:
        if wait_lowering is not None and pending_round(sd) is not None:
            wait_lowering(sd.root)  # before the sweep's lock, which other commands take meanwhile
        return advance(sd, settings)

    outcomes: list[UnitOutcome] = []
    nxt = planned or next_round()
    while nxt is not None:
        if nxt.units:
            if on_round is not None:
                on_round(nxt)
            outcomes += run([u.id for u in nxt.units])
        nxt = next_round()
    return outcomes


def after_merge(sweep_dir: str) -> dict[str, Any] | None:
    """The final merge job's hook (on a compute node): advance the sweep to its next round.
    Where sbatch cannot be run from a compute node, say so in the job's log and in the sweep's
    history; ``tilesweep wait`` or ``tilesweep resume`` then submits the round from a login node.
    The same where a ``plan --lower`` of the sweep runs (its units could compile configs it is
    about to refuse): ``wait`` waits for it, then submits the round.
    A round planned with nothing to measure, and no round after it, ended the rounds: the merge
    job is asked to merge again (``merge_again``), since no other merge job will."""
    sd = SweepDir.open(sweep_dir)
    number = pending_round(sd)
    if number is None:
        return None
    lowering = live_lowering(sd.root)
    if lowering is not None:  # its units could compile configs it is about to refuse
        return _deferred(sd, number, f"a `plan --lower` of the sweep was lowering its configs: {lowering.describe()}")
    try:
        done = advance(sd, sd.spec.executor)
    except DispatchError as exc:
        return _deferred(sd, number, exc.message)
    if done is None:
        return None
    out: dict[str, Any] = {f"round{done.number}": len(done.units), "survivors": done.summary.get("survivors")}
    if not done.units and pending_round(sd) is None:  # the last round measured nothing: no merge job follows
        out["merge_again"] = True
    return out


def _deferred(sd: SweepDir, number: int, why: str) -> dict[str, Any]:
    """Round ``number`` left to ``wait`` or ``resume`` by the merge job, because ``why``: said in
    the job's log and in the sweep's history (which ``status`` reads)."""
    log.warning(
        "round %d of %s not submitted from the merge job: %s; `%s wait %s` or `%s resume %s` submits it",
        number,
        sd.root,
        why,
        PROG,
        sd.root,
        PROG,
        sd.root,
    )
    event = {"event": f"round{number}_deferred", "why": why, "time": now_iso(), "ts": round(time.time(), 3)}
    sd.record_jobs([event])
    return {f"round{number}": "deferred", "why": why}
