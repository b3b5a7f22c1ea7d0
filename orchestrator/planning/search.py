"""A search across the problems of a sweep: rounds that measure, per problem, a small design
first and then what the other problems' winners and the grid around the problem's leaders
suggest, until nothing faster turns up. Pure: no I/O.

The one home of the search's rules (``timing.strategy: search``, the ``search`` section), used
by the planner of round 1 (``control.searchplan``: the design) and of every later round
(``control.searchrounds``: what each problem measures next, and when its search ends):

- A problem's planned forced configs are its grid (``Grid``): one axis per config field, in
  the order ``records.config_fields`` names them for the problem's mode and implementation, its
  values in order. Nothing here names a field, so a new implementation's tunables are new axes.
- Round 1 (``design``): the portfolio first (the configs that won the most problems of earlier
  documents of the same implementation and device kind, ``ranked``), then a space-filling
  choice over the grid (``space_filling``), until the problem has ``search.design`` configs,
  or one in ``DESIGN_SHARE`` of those it can run where that is fewer (``design_size``);
  carried (reused) records count as measured. Among equally spread choices a problem takes
  the configs the problems of its grid before it left out, so that together they cover the
  grid: what one of them finds, the others try in round 2.
- Each later round (``next_configs``): the configs that won other problems of the sweep so far,
  then the grid neighbours (one step along one axis) of the problem's leaders (``leaders``: its
  best and the configs whose q1-q3 overlaps the best's, at most ``search.leaders``), each not
  measured before: of every leader, the steps along each axis towards a value the problem's own
  timings rate at least as fast as the leader's (``searchmodel.leanings``), and the steps back
  only where none of those is left to measure (``_climb``). Of those, the ones the
  other problems found fastest first (``searchmodel.predicted``: how much slower than their own
  best the problems of its mode and implementation measured a config, weighted by how alike
  their timings are to the problem's; one no other problem measured counts as a best), at most
  ``search.per_round`` and what ``search.budget`` leaves.
  A capped round (``per_round`` set) skips a config the alike problems measured more than
  ``searchmodel.UNLIKELY`` slower than their best, or slower than the problem's own leader
  where they measured that too (``searchmodel.promising``): the family's model ends a problem
  whose leader it rates at least as fast as every candidate. It also skips a config the cost
  model (``planning.costs``, given as ``costs``) prices at more than ``searchmodel.COSTLY``
  typical configs of the problem, unless the alike problems rate it faster than the problem's
  best (``searchmodel.affordable``).
  This is where the problems learn from each other: a neighbour that was slow wherever it was
  measured waits behind those that were fast or never tried. A problem none of whose configs
  has a time yet (all failed) gets another space-filling design instead of neighbours.
- A problem's search ends (``step``) when a round found nothing faster beyond the noise
  (``improved``: the round's best median is not below the q1 of the best before it, the spread
  that best was measured with), when its budget is spent, when nothing is left to try, or once
  ``search.max_rounds`` rounds have run.

With ``search.screen`` each round of the search is two rounds of units (``halving.screens``):
a screen of its configs, then the full timing of the survivors (``search_round`` maps a unit's
round to the search's).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernels.spelling import as_json
from orchestrator.planning.searchmodel import Config, Timed, affordable, leanings, promising
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.search_section import SearchSettings

SEARCH = "search"  # timing.strategy

# Why a problem's search measures nothing more (``step``).
SEARCHING, IMPROVED_NOTHING, BUDGET, ROUNDS, EXHAUSTED = "searching", "converged", "budget", "max_rounds", "exhausted"
FINAL = (BUDGET, ROUNDS)  # the ends nothing reopens; a converged or exhausted problem still tries new winners


def _in_order(values: Iterable[Any]) -> tuple[Any, ...]:
    """An axis's distinct values, ascending where they compare, else in first-seen order."""
    distinct = list(dict.fromkeys(values))
    try:
        return tuple(sorted(distinct))
    except TypeError:
        return tuple(distinct)


@dataclass(frozen=True)
class Grid:
    """One problem's planned forced configs as named axes (``names``: the config fields), each
    axis's values in order; ``configs`` in plan order. Clamping to seq may leave points of the
    full product out: a neighbour is one of ``configs`` or none."""

    names: tuple[str, ...]
    configs: tuple[Config, ...]
    values: tuple[tuple[Any, ...], ...] = ()
    _places: tuple[dict[Any, int], ...] = field(default=(), repr=False, compare=False)
    _planned: frozenset[Config] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def of(cls, names: Sequence[str], configs: Iterable[Config]) -> Grid:
        planned = tuple(dict.fromkeys(configs))
        values = tuple(_in_order(c[i] for c in planned) for i in range(len(names)))
        places = tuple({v: k for k, v in enumerate(axis)} for axis in values)
        return cls(tuple(names), planned, values, places, frozenset(planned))

    def __contains__(self, config: object) -> bool:
        return config in self._planned

    def coords(self, config: Config) -> tuple[float, ...]:
        """Where a config lies: each axis's step scaled to [0, 1] (an axis of one value: 0)."""
        return tuple(
            places[v] / (len(axis) - 1) if len(axis) > 1 else 0.0
            for v, axis, places in zip(config, self.values, self._places, strict=True)
        )

    def neighbours(self, config: Config) -> list[Config]:
        """The planned configs one step along one axis from ``config``, axis by axis, the lower
        step first."""
        return [c for ways in self.steps(config) for c in ways]

    def steps(self, config: Config, lean: Mapping[tuple[int, Any], float] | None = None) -> list[list[Config]]:
        """``neighbours`` axis by axis; with ``lean`` (``searchmodel.leanings``), along each axis
        the step to the value it rates faster first (a tie: the lower)."""
        out = []
        for i, (axis, places) in enumerate(zip(self.values, self._places, strict=True)):
            k = places[config[i]]
            ways = [(*config[:i], axis[j], *config[i + 1 :]) for j in (k - 1, k + 1) if 0 <= j < len(axis)]
            if lean is not None:
                ways.sort(key=lambda c: lean.get((i, c[i]), 0.0))
            out.append([c for c in ways if c in self._planned])
        return out


def ranked(wins: Iterable[Config]) -> list[Config]:
    """Configs by how many problems each won, most first (a tie: the first seen first)."""
    return [c for c, _ in Counter(wins).most_common()]


def _distance(a: Sequence[float], b: Sequence[float]) -> float:
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


def space_filling(
    grid: Grid, candidates: Sequence[Config], chosen: Sequence[Config], n: int, apart: Sequence[Config] = ()
) -> list[Config]:
    """Up to ``n`` of ``candidates``, each in turn the one that adds most to what ``chosen`` and
    the configs picked before it cover: first the most axis values not covered yet (a few
    configs then cover every value of every axis, as a Latin hypercube does), then the largest
    distance to the nearest config taken (maximin, in axis steps scaled to [0, 1]), then the
    largest to the nearest of ``apart`` (what other problems measure: among equally good
    picks, the one that covers what they leave out), then the nearest to the grid's centre,
    then plan order. With nothing chosen nor apart, the first pick is the grid's centre."""
    taken = list(dict.fromkeys(chosen))
    covered = [{c[i] for c in taken} for i in range(len(grid.names))]
    left = [c for c in dict.fromkeys(candidates) if c not in set(taken)]
    others = [c for c in dict.fromkeys(apart) if c in grid]
    where = {c: grid.coords(c) for c in (*left, *taken, *others)}
    centre = tuple(0.5 if len(axis) > 1 else 0.0 for axis in grid.values)

    def nearest(c: Config, among: Sequence[Config]) -> float:
        return round(min((_distance(where[c], where[t]) for t in among), default=math.inf), 9)

    picked: list[Config] = []
    while left and len(picked) < n:

        def score(pos: int) -> tuple[int, float, float, float, int]:
            c = left[pos]
            gain = sum(v not in seen for v, seen in zip(c, covered, strict=True))
            return gain, nearest(c, taken), nearest(c, others), -round(_distance(where[c], centre), 9), -pos

        best = left.pop(max(range(len(left)), key=score))
        picked.append(best)
        taken.append(best)
        for seen, v in zip(covered, best, strict=True):
            seen.add(v)
    return picked


# Round 1 measures at most one config in this many of those a problem can run: the share the
# default design (6) takes of the reference grid (48 to 54 configs). A smaller grid needs fewer
# configs to cover its axes' values, and its later rounds' neighbours reach more of it.
DESIGN_SHARE = 8


def design_size(size: int, runnable: int) -> int:
    """How many configs round 1 measures of a problem that can run ``runnable`` configs:
    ``size`` (``search.design``), or one in ``DESIGN_SHARE`` of them where that is fewer (at
    least 2)."""
    return min(size, max(2, math.ceil(runnable / DESIGN_SHARE)))


@dataclass(frozen=True)
class Design:
    """Round 1 of one problem: the portfolio's configs it measures, then the space-filling ones."""

    portfolio: list[Config]
    space_filling: list[Config]

    @property
    def configs(self) -> list[Config]:
        return [*self.portfolio, *self.space_filling]


def design(
    grid: Grid,
    runnable: Sequence[Config],
    portfolio: Sequence[Config],
    carried: Collection[Config],
    size: int,
    apart: Sequence[Config] = (),
) -> Design:
    """Round 1 of a problem: ``runnable`` (plan order) are the configs it can measure, ``carried``
    those it holds records of already (they count towards ``size``). The portfolio's configs
    first, in its order, then a space-filling choice away from ``apart`` (what the problems of
    the same grid before it measure in round 1)."""
    room = max(0, size - len(carried))
    can = set(runnable)
    picks = [c for c in dict.fromkeys(portfolio) if c in can and c not in carried][:room]
    rest = [c for c in runnable if c not in carried and c not in picks]
    return Design(picks, space_filling(grid, rest, [*carried, *picks], room - len(picks), apart))


def leaders(times: Sequence[Timed], most: int) -> list[Timed]:
    """The best (lowest median; a tie: the first) and the configs whose q1-q3 overlaps its own,
    fastest first, at most ``most``."""
    ranked_times = sorted(times, key=lambda t: t.median_ms)
    if not ranked_times:
        return []
    best = ranked_times[0]
    return [best, *(t for t in ranked_times[1:] if t.q1_ms <= best.q3_ms)][:most]


def improved(new: Sequence[Timed], before: Sequence[Timed]) -> bool:
    """Whether a round found something faster beyond the noise: its best median lies below the
    q1 of the best config before it (outside the spread that config was measured with)."""
    if not new:
        return False
    if not before:
        return True
    old = min(before, key=lambda t: t.median_ms)
    return min(t.median_ms for t in new) < old.q1_ms


def _climb(
    grid: Grid, leads: Sequence[Config], lean: Mapping[tuple[int, Any], float] | None, fresh: Collection[Config]
) -> list[Config]:
    """The neighbours of ``leads`` a round climbs to: without ``lean``, every step; with it
    (``searchmodel.leanings``), the forward steps of every leader (to a value along one axis the
    problem's timings rate at least as fast as the leader's), and the steps back only where no
    forward step is left to measure (none of them in ``fresh``)."""
    steps = [(lead, grid.steps(lead, lean)) for lead in leads]
    if lean is None:
        return [c for _, axes in steps for ways in axes for c in ways]
    forward: list[Config] = []
    back: list[Config] = []
    for lead, axes in steps:
        for i, ways in enumerate(axes):
            here = lean.get((i, lead[i]), 0.0)
            for c in ways:
                (forward if lean.get((i, c[i]), 0.0) <= here else back).append(c)
    return forward if any(c in fresh for c in forward) else back


def next_configs(
    grid: Grid,
    runnable: Collection[Config],
    measured: Collection[Config],
    leads: Sequence[Config],
    winners: Sequence[Config],
    room: int | None,
    outlook: Mapping[Config, float] | None = None,
    lean: Mapping[tuple[int, Any], float] | None = None,
) -> list[Config]:
    """What a problem measures next: the other problems' winners (``winners``, in their order),
    then the neighbours of its leaders it climbs to (``_climb``: with ``lean``, the forward
    steps, the steps back only once none is left), none measured before, reordered by
    ``outlook`` (``predicted``: the least slowdown first, one it says nothing of as a best; a
    tie keeps that order), at most ``room`` (None: no cap)."""
    fresh = {c for c in runnable if c not in measured}
    out: dict[Config, None] = {}
    for c in (*winners, *_climb(grid, leads, lean, fresh)):
        if c in fresh:
            out[c] = None
    said = outlook or {}
    chosen = sorted(out, key=lambda c: max(0.0, said.get(c, 0.0)))
    return chosen if room is None else chosen[: max(0, room)]


@dataclass(frozen=True)
class Problem:
    """What a problem's search knows after a round: its grid, the configs it can measure
    (``runnable``, plan order), every config it measured or chose (carried ones included), and
    the configs timed in full by each round of the search (carried ones in round 1)."""

    grid: Grid
    runnable: tuple[Config, ...]
    measured: frozenset[Config]
    rounds: Mapping[int, Sequence[Timed]]

    def times(self, before: int | None = None) -> list[Timed]:
        """Every config timed in full, or only those of the rounds before ``before``."""
        return [t for r, ts in sorted(self.rounds.items()) if before is None or r < before for t in ts]

    def best(self) -> Timed | None:
        return min(self.times(), key=lambda t: t.median_ms, default=None)


def step(
    problem: Problem,
    last: int,
    winners: Sequence[Config],
    settings: SearchSettings,
    outlook: Mapping[Config, float] | None = None,
    costs: Mapping[Config, float] | None = None,
) -> tuple[list[Config], str]:
    """What ``problem`` measures in the round after the search's round ``last``, and why it goes
    on (``SEARCHING``) or why its search ended (the other reasons above; a converged one still
    measures the other problems' winners it has not, ``winners``, and no neighbours). ``outlook``
    is what the other problems say of its configs (``predicted``); with ``per_round`` set, the
    configs it rates slow, or slower than the problem's best (``promising``), and those the cost
    model's seconds (``costs``) price at more than two typical configs unless it rates them
    faster than the best (``affordable``), are left out, and a problem none of whose candidates
    is left ends as exhausted."""
    if last >= settings.max_rounds:
        return [], ROUNDS
    room = None if settings.budget is None else settings.budget - len(problem.measured)
    if room is not None and room <= 0:
        return [], BUDGET
    if settings.per_round is not None:
        room = settings.per_round if room is None else min(room, settings.per_round)
    best = problem.best()
    lead = None if best is None else best.config
    can = set(problem.runnable)
    if settings.per_round is not None:
        can = promising(problem.runnable, outlook, lead) & affordable(problem.runnable, costs, outlook, lead)
    if last > 1 and not improved(problem.rounds.get(last, ()), problem.times(before=last)):
        # its climb ended, but what other problems won since may lie beyond its neighbourhood
        # (another hill): measured here, one faster beyond the noise starts the climb again
        return next_configs(problem.grid, can, problem.measured, [], winners, room, outlook), IMPROVED_NOTHING
    leads = [t.config for t in leaders(problem.times(), settings.leaders)]
    configs = next_configs(
        problem.grid, can, problem.measured, leads, winners, room, outlook, leanings(problem.times())
    )
    if not leads:  # nothing timed yet: cover more of the grid instead of climbing it
        left = [c for c in problem.runnable if c not in problem.measured and c not in configs]
        more = space_filling(problem.grid, left, [*problem.measured, *configs], settings.design)
        configs = [*configs, *more] if room is None else [*configs, *more][:room]
    return configs, SEARCHING if configs else EXHAUSTED


def search_round(unit_round: int, screen: bool) -> int:
    """The round of the search a unit's round belongs to (with ``search.screen``, rounds of units
    2k - 1 and 2k, the screen and its survivors, are round k)."""
    return (unit_round + 1) // 2 if screen else unit_round


def idle_settings(spec: SweepSpec) -> str | None:
    """The note a spec gets that sets ``search`` without searching (its settings then do nothing):
    the one thing a user who forgot ``timing.strategy`` needs to hear."""
    if spec.timing.strategy == SEARCH or spec.search == SearchSettings():
        return None
    return (
        f"the search section is set but timing.strategy is {as_json(spec.timing.strategy)}: it does nothing; "
        'set "timing": {"strategy": "search"} to search'
    )


def screen_keeps_all(spec: SweepSpec) -> str | None:
    """The note a screened search gets whose screen drops nothing after round 1 (or in any
    round): halving's rule times at least ``timing.keep`` configs of a problem in full, and a
    round after the first measures at most ``search.per_round`` of them (round 1 its design)."""
    s, keep = spec.search, spec.timing.keep
    if spec.timing.strategy != SEARCH or not s.screen or s.per_round is None or keep < s.per_round:
        return None
    when = "in any round" if keep >= s.design else "after round 1"
    return (
        f"search.screen: true screens nothing out {when}: timing.keep ({keep}) times at least {keep} configs of "
        f"a problem in full, and each round after the first measures at most search.per_round ({s.per_round}) "
        "of them"
        + (f" (round 1 at most search.design, {s.design})" if keep >= s.design else "")
        + f"; set timing.keep below {s.per_round} for the screen to drop the configs that cannot win, or drop "
        "search.screen"
    )
