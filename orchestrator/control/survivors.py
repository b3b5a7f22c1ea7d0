"""The halving strategy's second round, read from the sweep directory: which screened configs survive.

With ``timing.strategy: halving`` round 1 screens every forced config once (and times each
problem's ``auto`` in full). Once every planned item has a record, the screened records are
read back from the partials and the survivors of each problem chosen by
``orchestrator.planning.halving.survivors`` (the rule and how it judges noise live there);
``control.rounds`` makes them the units of round 2 (``units.json`` entries and unit files say
``"round": 2``), whose workers time them in full. ``round2.json`` (``store.round2``) records
the decision, per problem, so status, the document and a user can see it; its presence means
round 2 is planned (it is written last). Halving has no round after the second.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from orchestrator import counted
from orchestrator.control.strategy import RoundChoice
from orchestrator.planning import RUN, Unit, WorkItem
from orchestrator.planning.halving import survivors
from orchestrator.spec.records import problem_key
from orchestrator.store.partials import read_partial
from orchestrator.store.round2 import round2_path
from orchestrator.store.sweepdir import SweepDir, atomic_write_json, now_iso

log = logging.getLogger(__name__)

SECOND = 2  # the round that times the survivors in full: halving's last


def recorded(sd: SweepDir) -> dict[str, dict[str, Any]]:
    """Item id -> its record, over every partial of the sweep (a later unit in the index, and a
    later line of one partial, wins: the order ``merge`` ranks equal start times in)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in sd.unit_index():
        for iid, (_, rec) in read_partial(sd.partial_path(entry["id"])).records.items():
            out[iid] = rec
    return out


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


class HalvingRounds:
    """``strategy.RoundPlanner`` of ``timing.strategy: halving``: round 2, once."""

    def pending(self, sd: SweepDir) -> int | None:
        return None if round2_path(sd).exists() else SECOND

    def choose(self, sd: SweepDir) -> RoundChoice | None:
        records = recorded(sd)
        missing = sum(1 for it in sd.items() if it.id not in records)
        if missing:
            log.info(
                "round 2 of %s not planned: %s of round 1 %s no record yet",
                sd.root,
                counted(missing, "item"),
                "has" if missing == 1 else "have",
            )
            return None
        chosen, problems = choose(sd, records)
        summary = {"screened": sum(p["screened"] for p in problems), "survivors": len(chosen), "problems": problems}
        return RoundChoice(number=SECOND, items=chosen, summary=summary)

    def record(self, sd: SweepDir, choice: RoundChoice, units: list[Unit]) -> None:
        decided = {
            "created": now_iso(),
            "screened": choice.summary["screened"],
            "survivors": choice.summary["survivors"],
            "planned": len(choice.items),
            "units": [u.id for u in units],
            "ids": [it.id for it in choice.items],
            "problems": choice.summary["problems"],
        }
        atomic_write_json(round2_path(sd), decided, indent=1)
        log.info(
            "round 2 of %s: %d of %d screened configs survive, in %d units",
            sd.root,
            len(choice.items),
            decided["screened"],
            len(units),
        )

    def forget(self, sd: SweepDir, number: int) -> None:
        round2_path(sd).unlink(missing_ok=True)
