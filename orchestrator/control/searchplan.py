"""Round 1 of a search, chosen at plan time: per problem, the design (``planning.search.design``).

The plan of a search (``timing.strategy: search``) is not the whole grid: its units measure,
per problem, the ``auto`` baseline and ``search.design`` forced configs, fewer on a small grid
(``planning.search.design_size``): the portfolio's first (``store.portfolio``: what won the
most problems of the reuse documents of this implementation and device kind), then a
space-filling choice; and they record the pruned and invalid configs as the worker does (they
cost a record line). Every compatible record reuse found is carried as it is
in a full sweep, whichever config it is of, and counts as measured. The rest of the grid is left
to the later rounds (``control.searchrounds``), which may never need it.

``design_round`` returns the round's items and its record (``store.searchrounds``; the caller
adds the units' ids and writes it once they are in the index).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from orchestrator.control.searchstate import Observed, ProblemItems, account, as_problem, problems_of
from orchestrator.planning import RUN, WorkItem
from orchestrator.planning.search import DESIGN_SHARE, SEARCHING, Design, design, design_size
from orchestrator.planning.searchmodel import Config
from orchestrator.spec.model import SweepSpec
from orchestrator.store.files import now_iso
from orchestrator.store.portfolio import Portfolio
from orchestrator.store.searchrounds import DESIGN, ProblemState, SearchRound

log = logging.getLogger(__name__)


@dataclass
class DesignRound:
    """Round 1 of a search: the items its units measure (plan order) and its record (units: none yet)."""

    items: list[WorkItem]
    record: SearchRound


def _design_of(
    p: ProblemItems, spec: SweepSpec, portfolio: Portfolio, carried: set[str], apart: list[Config]
) -> Design:
    """The configs round 1 measures of one problem (its carried configs count towards the size),
    covering where it can what the problems of its grid before it leave out (``apart``: those
    problems' configs, forgotten once they cover the grid, so that the sweep's problems together
    cover it and their winners, tried by each other in round 2, come from all of it)."""
    kept = {c for c, it in p.items.items() if it.id in carried}
    if len(set(apart)) >= len(p.runnable):
        apart.clear()
    size = design_size(spec.search.design, len(p.runnable))
    chosen = design(p.grid, p.runnable, portfolio.of(p.mode, p.impl), kept, size, apart)
    apart += [*kept, *chosen.configs]
    return chosen


def _say_capped(spec: SweepSpec, runnable: list[int]) -> None:
    """A ``search.design`` the user set that round 1 measures fewer of, on a small grid (one in
    ``DESIGN_SHARE`` of the configs a problem can run), is said once, not cut silently."""
    asked = spec.search.design
    sizes = [design_size(asked, n) for n in runnable]
    if "design" in spec.search.model_fields_set and sizes and min(sizes) < asked:
        # a budget below the default design is the design too (``SearchSettings``): name what was set
        said = "search.budget (round 1's design too)" if spec.search.budget == asked else "search.design"
        log.warning(
            "%s is %d, and round 1 measures %d of a problem's configs where its grid is small: at most "
            "one in %d of those it can run (at least 2), so that later rounds have neighbours left to try",
            said,
            asked,
            min(sizes),
            DESIGN_SHARE,
        )


def _portfolio_record(portfolio: Portfolio) -> dict[str, Any]:
    """The portfolio as round 1's record shows it: its sources and, per mode and implementation,
    each config with the number of problems it won."""
    configs = {
        f"{mode} {impl}": [{"config": list(c), "wins": portfolio.wins[(mode, impl)][c]} for c in ranked_configs]
        for (mode, impl), ranked_configs in portfolio.configs.items()
    }
    return {"sources": portfolio.sources, "ignored": portfolio.ignored, "configs": configs}


def design_round(spec: SweepSpec, items: list[WorkItem], carried: set[int], portfolio: Portfolio) -> DesignRound:
    """Round 1 of a search over ``items`` (the whole plan), ``carried`` the plan indices reuse
    carries: each problem's design, its ``auto`` and its configs that are not run (pruned,
    invalid), less what is carried."""
    ids = {it.id for it in items if it.index in carried}
    obs = Observed(first={iid: 1 for iid in ids}, carried=ids)
    todo: set[int] = set()
    states: list[ProblemState] = []
    apart: dict[tuple[str, str], list[Config]] = {}
    problems = problems_of(items)
    for p in problems.values():
        chosen = _design_of(p, spec, portfolio, ids, apart.setdefault((p.mode, p.impl), []))
        configs = chosen.configs
        if p.auto is not None and p.auto.index not in carried:
            todo.add(p.auto.index)
        todo.update(it.index for it in p.items.values() if it.kind != RUN)
        todo.update(p.items[c].index for c in configs)
        state = account(p, as_problem(p, obs, spec.search.screen), obs, configs, 1, SEARCHING)
        state["portfolio"] = len(chosen.portfolio)
        state["space_filling"] = len(chosen.space_filling)
        state["carried"] = sum(1 for it in p.items.values() if it.id in ids)
        states.append(state)
    _say_capped(spec, [len(p.runnable) for p in problems.values()])
    round_items = [it for it in items if it.index in todo]
    record: SearchRound = {
        "round": 1,
        "search_round": 1,
        "kind": DESIGN,
        "created": now_iso(),
        "units": [],
        "planned": len(round_items),
        "new": len(round_items),
        "problems": states,
        "portfolio": _portfolio_record(portfolio),
        "grid": len(items),
    }
    log.info(
        "search round 1: %d items (%d problems, design of up to %d configs each)",
        len(round_items),
        len(states),
        spec.search.design,
    )
    return DesignRound(round_items, record)
