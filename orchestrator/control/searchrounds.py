"""The rounds of a search after the first, read from the sweep directory (``timing.strategy: search``).

Round 1 is the plan (``control.searchplan``). Once every item of the rounds planned so far has
its record, ``SearchRounds.choose`` reads them back (``searchstate``) and asks the search's rules
(``planning.search.step``) what each problem measures next: the configs that won other problems
of the sweep so far and the grid neighbours of its leaders, or nothing once its search ended.
``control.rounds`` makes those items the units of the next round; the round's record
(``store.searchrounds``) is written last. When no problem has anything left to measure, the
search ends: ``search/end.json`` holds every problem's final account and no round is pending.

With ``search.screen`` each round of the search is a screening round of units (one short sample
per config) followed by a round that times its survivors in full (``planning.halving.survivors``,
with ``timing.keep`` and ``timing.noise``), whose records supersede the screens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from orchestrator import counted
from orchestrator.control.searchstate import (
    Key,
    Observed,
    ProblemItems,
    account,
    as_problem,
    costs_of,
    observe,
    outlooks,
    problems_of,
)
from orchestrator.control.searchstate import winners as winners_of
from orchestrator.control.strategy import RoundChoice
from orchestrator.planning import Unit, WorkItem
from orchestrator.planning.halving import survivors
from orchestrator.planning.search import FINAL, SEARCHING, Problem, search_round, step
from orchestrator.store.files import now_iso
from orchestrator.store.searchrounds import (
    END,
    SEARCH_STEP,
    SURVIVORS,
    ProblemState,
    SearchRound,
    forget_round,
    latest,
    pending,
    write_round,
)
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)


def _screens(p: ProblemItems, obs: Observed, number: int) -> tuple[list[tuple[str, float]], dict[str, Any] | None]:
    """A problem's screens of round ``number`` (item id, median), and its auto record."""
    out = []
    for it in p.items.values():
        rec = obs.records.get(it.id)
        if rec is not None and obs.chosen.get(it.id) == number and rec.get("screened") and "error" not in rec:
            out.append((it.id, float(rec["median_ms"])))
    return out, obs.records.get(p.auto.id) if p.auto is not None else None


@dataclass
class _Read:
    """What choosing a round reads: the plan's problems, each as the rules see it, the sweep
    directory's items and records, and each problem's state after the round before (a problem
    whose search ended keeps its reason)."""

    of: dict[Key, ProblemItems]
    problems: dict[Key, Problem]
    obs: Observed
    before: dict[Key, str]

    def ended(self, key: Key) -> str | None:
        state = self.before.get(key, SEARCHING)
        return None if state == SEARCHING else state


def _read(sd: SweepDir, screen: bool) -> _Read | None:
    """The sweep's search as the last round left it; None while an item of a round has no record."""
    obs = observe(sd, screen)
    missing = obs.unrecorded(screen)
    if missing:
        log.info(
            "next round of %s not planned: %s of the rounds before %s no record",
            sd.root,
            counted(len(missing), "item"),
            "has" if len(missing) == 1 else "have",
        )
        return None
    of = problems_of(sd.items())
    last = latest(sd)
    before = {tuple(s["problem"]): s["state"] for s in last["problems"]} if last is not None else {}
    return _Read(of, {k: as_problem(p, obs, screen) for k, p in of.items()}, obs, before)


class SearchRounds:
    """``strategy.RoundPlanner`` of ``timing.strategy: search``: round after round until it ends."""

    def pending(self, sd: SweepDir) -> int | None:
        return pending(sd)

    def choose(self, sd: SweepDir) -> RoundChoice | None:
        number = pending(sd)
        screen = sd.spec.search.screen
        read = _read(sd, screen) if number is not None else None
        if number is None or read is None:
            return None
        if screen and number % 2 == 0:
            return _survivors(sd, number, read)
        last = search_round(number - 1, screen)
        wins, seen = winners_of(read.problems, read.of), outlooks(read.problems, read.of)
        costs = costs_of(read.of, sd.spec)
        chosen: list[WorkItem] = []
        states: list[ProblemState] = []
        for key, p in read.of.items():
            ended = read.ended(key)
            settings = sd.spec.search
            configs, why = (
                ([], ended)
                if ended in FINAL
                else step(read.problems[key], last, wins[key], settings, seen[key], costs[key])
            )
            if ended is not None and not configs:  # nothing new to try: its search ended as it did
                why = ended
            chosen += [p.items[c] for c in configs]
            states.append(account(p, read.problems[key], read.obs, configs, last + 1, why))
        items = sorted(chosen, key=lambda it: it.index)
        kind, reached = (SEARCH_STEP, last + 1) if items else (END, last)
        return RoundChoice(number=number, items=items, summary=_summary(kind, reached, items, read.obs, states))

    def record(self, sd: SweepDir, choice: RoundChoice, units: list[Unit]) -> None:
        s = choice.summary
        record: SearchRound = {
            "round": choice.number,
            "search_round": s["search_round"],
            "kind": s["kind"],
            "created": now_iso(),
            "units": [u.id for u in units],
            "planned": len(choice.items),
            "new": s["new"],
            "problems": s["problems"],
        }
        write_round(sd, record)
        if s["kind"] == END:
            log.info("the search of %s ended after %s", sd.root, counted(s["search_round"], "round"))
        else:
            log.info(
                "round %d of %s: %s (%d new) in %s",
                choice.number,
                sd.root,
                counted(len(choice.items), "item"),
                s["new"],
                counted(len(units), "unit"),
            )

    def forget(self, sd: SweepDir, number: int) -> None:
        forget_round(sd, number)


def _survivors(sd: SweepDir, number: int, read: _Read) -> RoundChoice:
    """The full timing of the configs of the screening round before that can still win."""
    timing = sd.spec.timing
    chosen: list[WorkItem] = []
    states: list[ProblemState] = []
    for key, p in read.of.items():
        screens, auto = _screens(p, read.obs, number - 1)
        ids = set(survivors(screens, keep=timing.keep, noise=timing.noise, auto=auto))
        chosen += [it for it in p.items.values() if it.id in ids]
        state = read.ended(key) or SEARCHING
        states.append(account(p, read.problems[key], read.obs, [], search_round(number, True), state))
    items = sorted(chosen, key=lambda it: it.index)
    return RoundChoice(
        number=number, items=items, summary=_summary(SURVIVORS, search_round(number, True), items, read.obs, states)
    )


def _summary(
    kind: str, number: int, items: list[WorkItem], obs: Observed, states: list[ProblemState]
) -> dict[str, Any]:
    """A round's account, for its record and the CLI: what it measures, how much of it no round
    measured before, and how many problems still search."""
    return {
        "kind": kind,
        "search_round": number,
        "new": sum(1 for it in items if it.id not in obs.first),
        "searching": sum(1 for s in states if s["state"] == SEARCHING),
        "problems": states,
    }
