"""Where a search stands, read from its plan and its sweep directory: per problem its grid and
items, which configs the rounds chose and in which round, the newest record of each, and what
each round timed in full (``planning.search.Problem``, what the search's rules take).

Read the same way for round 1 (at plan time: nothing chosen but the carried records) and for
every later round (``control.searchrounds``: the units of every round, their partials). A
config's timing counts for the round whose units last held it (a carried record's is round 1,
the plan's), never by its record's own ``round`` field, which names the round of the sweep that
measured it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planning import RUN, WorkItem
from orchestrator.planning.costs import item_costs
from orchestrator.planning.search import Grid, Problem, ranked, search_round
from orchestrator.planning.searchmodel import Config, Timed, predicted, timed
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import problem_key
from orchestrator.store.partials import read_partial
from orchestrator.store.searchrounds import ProblemState
from orchestrator.store.sweepdir import SweepDir

Key = tuple[Any, ...]  # records.problem_key


@dataclass
class ProblemItems:
    """One problem of the plan: its forced items by config (plan order, every kind), its grid
    (the config fields are the axes: ``WorkItem.param_names``) and its ``auto`` item."""

    key: Key
    mode: str
    impl: str
    grid: Grid
    items: dict[Config, WorkItem]
    auto: WorkItem | None = None

    @property
    def runnable(self) -> tuple[Config, ...]:
        """The configs the worker would compile and time (not pruned, not invalid)."""
        return tuple(c for c, it in self.items.items() if it.kind == RUN)


def problems_of(items: Iterable[WorkItem]) -> dict[Key, ProblemItems]:
    """The plan's problems in plan order."""
    forced: dict[Key, dict[Config, WorkItem]] = defaultdict(dict)
    autos: dict[Key, WorkItem] = {}
    last: tuple[Any, ...] | None = None
    key: Key = ()
    for it in items:
        shape = (it.shape, it.mode, it.causal, it.tag, it.impl)
        if shape != last:  # items come grouped by problem: its key once per run
            key, last = problem_key(it.record_fields()), shape
        if it.config == "auto":
            autos[key] = it
        else:
            forced[key][it.params] = it
    out = {}
    for key in dict.fromkeys([*autos, *forced]):
        configs = forced.get(key, {})
        first = next(iter(configs.values()), None) or autos[key]
        names = first.param_names if first.config == "forced" else ()
        out[key] = ProblemItems(key, first.mode, first.impl, Grid.of(names, configs), configs, autos.get(key))
    return out


@dataclass
class Observed:
    """What the sweep directory says of its items: the latest round of units that holds each
    (``chosen``: a retry unit of ``resume --retry-errors`` is of round 1 and changes none), the
    round of the search that first chose it (``first``), the carried ones, and each item's
    newest record."""

    chosen: dict[str, int] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)
    carried: set[str] = field(default_factory=set)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def unrecorded(self, screen: bool) -> list[str]:
        """Items chosen by a round that lack its record: any record, or for the survivors of a
        screen (a screened search's even rounds) the full timing their round gives them."""
        return [
            iid
            for iid, r in self.chosen.items()
            if iid not in self.records or (screen and r % 2 == 0 and self.records[iid].get("screened"))
        ]


def observe(sd: SweepDir, screen: bool) -> Observed:
    """Every unit of the index (later units win, as merge ranks equal start times) read once."""
    obs = Observed()
    for entry in sd.unit_index():
        uid = entry["id"]
        number = int(entry.get("round", 1))
        for it in sd.unit_items(uid):
            obs.chosen[it.id] = max(number, obs.chosen.get(it.id, 0))
            obs.first.setdefault(it.id, search_round(number, screen))
            if entry.get("origin") == "reuse":
                obs.carried.add(it.id)
        for iid, (_, rec) in read_partial(sd.partial_path(uid)).records.items():
            obs.records[iid] = rec
    return obs


def as_problem(p: ProblemItems, obs: Observed, screen: bool) -> Problem:
    """The problem as the search's rules see it: what it measured and what each round timed (a
    config's timing counts for the round that last chose it)."""
    rounds: dict[int, list[Timed]] = defaultdict(list)
    for c, it in p.items.items():
        rec = obs.records.get(it.id)
        t = timed(c, rec) if rec is not None and it.kind == RUN else None
        if t is not None:
            rounds[search_round(obs.chosen.get(it.id, 1), screen)].append(t)
    measured = frozenset(c for c, it in p.items.items() if it.id in obs.first and it.kind == RUN)
    return Problem(p.grid, p.runnable, measured, dict(rounds))


def winners(problems: Mapping[Key, Problem], of: Mapping[Key, ProblemItems]) -> dict[Key, list[Config]]:
    """For each problem, the configs that won the other problems of its mode and implementation
    so far, most wins first (``planning.search.ranked``)."""
    best = {k: b.config for k, p in problems.items() if (b := p.best()) is not None}
    out = {}
    for key, p in of.items():
        family = (p.mode, p.impl)
        out[key] = ranked(c for k, c in best.items() if k != key and (of[k].mode, of[k].impl) == family)
    return out


def outlooks(problems: Mapping[Key, Problem], of: Mapping[Key, ProblemItems]) -> dict[Key, dict[Config, float]]:
    """For each problem, what the other problems of its mode and implementation say of its
    configs so far (``planning.search.predicted``)."""
    out = {}
    for key, p in of.items():
        family = (p.mode, p.impl)
        others = [q.times() for k, q in problems.items() if k != key and (of[k].mode, of[k].impl) == family]
        out[key] = predicted(problems[key].times(), others)
    return out


def costs_of(of: Mapping[Key, ProblemItems], spec: SweepSpec) -> dict[Key, dict[Config, float]]:
    """For each problem, the seconds the cost model (``planning.costs``) says compiling and
    timing each of its runnable configs takes (what ``searchmodel.affordable`` weighs)."""
    out = {}
    for key, p in of.items():
        items = list(p.items.values())
        seconds, _ = item_costs(items, spec)
        out[key] = {c: s for (c, it), s in zip(p.items.items(), seconds, strict=True) if it.kind == RUN}
    return out


def account(
    p: ProblemItems, problem: Problem, obs: Observed, new: list[Config], number: int, state: str
) -> ProblemState:
    """One problem's search after round ``number`` (of the search) was planned with ``new``."""
    counts: dict[str, int] = defaultdict(int)
    for it in p.items.values():
        if it.id in obs.first and it.kind == RUN:
            counts[str(obs.first[it.id])] += 1
    if new:
        counts[str(number)] += len(new)
    chosen = problem.measured | set(new)
    best = problem.best()
    return {
        "problem": list(p.key),
        "fields": list(p.grid.names),
        "measured": len(chosen),
        "measured_in": dict(sorted(counts.items(), key=lambda kv: int(kv[0]))),
        "new": len(new),
        "state": state,
        "best": None if best is None else {"config": list(best.config), "median_ms": best.median_ms},
        "never_measured": [list(c) for c in p.runnable if c not in chosen],
    }
