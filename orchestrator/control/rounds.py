"""The second round of a halving sweep: which configs survive their screening, as new units.

With ``timing.strategy: halving`` round 1 screens every forced config once (and times each
problem's ``auto`` in full). Once every planned item has a record, round 2 is planned here:
the screened records are read back from the partials, the survivors of each problem chosen by
``orchestrator.planning.halving.survivors`` (the rule and how it judges noise live there), and
sharded into units of round 2 (``units.json`` entries and unit files say ``"round": 2``) whose
workers time them in full. ``round2.json`` records the decision, per problem, so status, the
document and a user can see it; its presence means round 2 is planned (it is written last).

Who plans it, so that nobody has to wait: on SLURM the final merge job of round 1 (or of a
resume of round 1), ``wait`` and ``resume``; locally ``run`` and ``resume``. Planning is done
once, under the sweep's lock; whoever comes second finds ``round2.json`` and does nothing.
Nothing here prints or submits (``control.submit.next_round`` submits).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planning import RUN, Unit, WorkItem
from orchestrator.planning.halving import HALVING, survivors
from orchestrator.spec.records import problem_key
from orchestrator.store.partials import read_partial
from orchestrator.store.round2 import read_round2, round2_path
from orchestrator.store.sweepdir import SweepDir, atomic_write_json, now_iso

log = logging.getLogger(__name__)


def recorded(sd: SweepDir) -> dict[str, dict[str, Any]]:
    """Item id -> its record, over every partial of the sweep (a later unit in the index, and a
    later line of one partial, wins: the order ``merge`` ranks equal start times in)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in sd.unit_index():
        for iid, (_, rec) in read_partial(sd.partial_path(entry["id"])).records.items():
            out[iid] = rec
    return out


@dataclass
class Round2:
    """What planning round 2 decided: its units (none when nothing survived) and the summary
    written to ``round2.json``."""

    units: list[Unit] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def choose(sd: SweepDir, records: dict[str, dict[str, Any]]) -> tuple[list[WorkItem], list[dict[str, Any]]]:
    """The surviving items in plan order, and one line per problem saying what was kept. A forced
    config with a full record already (reused from an earlier document) ranks with the screens
    (its median is a better estimate than a screen) but is never timed again."""
    timing = sd.spec.timing
    screens: dict[tuple, list[tuple[str, float]]] = defaultdict(list)
    autos: dict[tuple, dict[str, Any]] = {}
    counts: dict[tuple, int] = defaultdict(int)
    full: set[str] = set()  # forced configs timed in full already (reused): they rank, need no round 2
    for it in sd.items():
        rec = records.get(it.id)
        if rec is None:
            continue
        key = problem_key(rec)
        if it.config == "auto":
            autos[key] = rec
        elif rec.get("screened") or "error" not in rec:
            counts[key] += 1
            if "error" not in rec:
                screens[key].append((it.id, float(rec["median_ms"])))
            if not rec.get("screened"):
                full.add(it.id)
    kept: set[str] = set()
    problems = []
    for key, n in counts.items():
        ids = [
            i
            for i in survivors(screens[key], keep=timing.keep, noise=timing.noise, auto=autos.get(key))
            if i not in full
        ]
        kept.update(ids)
        best = min((ms for _, ms in screens[key]), default=None)
        reused = sum(1 for i, _ in screens[key] if i in full)
        problems.append(
            {
                "problem": list(key),
                "screened": n - reused,
                "failed": n - len(screens[key]),
                "kept": len(ids),
                "best_screen_ms": best,
                **({"full": reused} if reused else {}),
            }
        )
    return [it for it in sd.items() if it.id in kept and it.kind == RUN], problems


def plan_round2(sd: SweepDir) -> Round2 | None:
    """Plan round 2 of a halving sweep whose round 1 is complete (the caller holds the sweep's
    lock). None when there is nothing to plan: not a halving sweep, round 2 planned already,
    or round 1 still lacks records (``resume`` redoes those first)."""
    if sd.spec.timing.strategy != HALVING or read_round2(sd) is not None:
        return None
    records = recorded(sd)
    missing = sum(1 for it in sd.items() if it.id not in records)
    if missing:
        log.info("round 2 of %s not planned: %d items of round 1 have no record yet", sd.root, missing)
        return None
    chosen, problems = choose(sd, records)
    planned = sum(1 for u in sd.unit_index() if u.get("origin") == "plan")
    units = group(sd, chosen, max(1, planned), 2) if chosen else []
    sd.add_units(units, origin="round2")
    summary = {
        "created": now_iso(),
        "screened": sum(p["screened"] for p in problems),
        "survivors": len(chosen),
        "planned": len(chosen),
        "units": [u.id for u in units],
        "problems": problems,
    }
    atomic_write_json(round2_path(sd), summary, indent=1)
    log.info(
        "round 2 of %s: %d of %d screened configs survive, in %d units",
        sd.root,
        len(chosen),
        summary["screened"],
        len(units),
    )
    return Round2(units, summary)


def group(sd: SweepDir, items: list[WorkItem], n_units: int, round_: int) -> list[Unit]:
    """Items as at most ``n_units`` units of ``round_``, packed by that round's cost model
    (resume regroups missing items with it too)."""
    from orchestrator.planning import shard
    from orchestrator.planning.costs import item_costs, setup_estimate

    spec = sd.spec
    costs, scale = item_costs(items, spec, round_=round_)
    setups = {it.shape: setup_estimate(it.shape, spec.modes, spec.causal) * scale for it in items}
    return shard(
        items, min(n_units, len(items)), costs=costs, setups=setups, strategy=spec.sharding.strategy, round_=round_
    )


def undo_round2(sd: SweepDir) -> None:
    """Forget a round 2 whose units could not be submitted (the caller restores units.json):
    the next ``wait``, ``resume`` or merge job plans it again."""
    round2_path(sd).unlink(missing_ok=True)


def pending_round2(sd: SweepDir) -> bool:
    """Whether the sweep still has a round 2 to plan (halving, not planned yet): cheap, from
    the files alone; whether round 1 is complete is ``plan_round2``'s to find out."""
    return sd.spec.timing.strategy == HALVING and not round2_path(sd).exists()
