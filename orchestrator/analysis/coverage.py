"""Planned versus recorded: which configs a document's plans have for a problem, and which of
those have no record. The one home of that comparison: the report's missing count (text,
markdown, ``--json``'s ``n_missing``) and the report page's list of missing configs are both
read from the ``Coverage`` that ``Plans.coverage`` makes, so they cannot disagree.

A document tilesweep wrote carries the spec of the sweep that wrote it (its ``tilesweep``
block), and the blocks of the sweeps appended into it (``earlier``, oldest first): an appended
document holds several plans, and a problem's planned configs are the union of what each plan
has for it, oldest plan first. The planner turns a spec into the forced configs it plans per
problem without expanding it (``planning.planned_configs``), so a document of a million
records is covered in one pass over its problems.

A planned config is recorded when the document holds any record of it: timed, failed, pruned,
or a halving sweep's screen (``resume`` redoes none of them). A planned config without a record
is *missing* (resume redoes it), unless a search (``timing.strategy: search``) chose never to
measure it: a search's block lists per problem the configs no round of it chose
(``tilesweep.search``), and those are *never measured*, a third state, neither missing nor
failed (a later sweep of the same spec measures them, and then they are recorded). ``auto`` is
the baseline of a problem, not one of its configs; whether its record is there is the summary's
``auto_status``, and the report's missing count adds it where it has none (every plan measures
it), so the count is what ``merge`` says is missing and ``resume`` redoes. A document without a
block (the reference run's) has no known plan: no coverage, and the report says nothing rather
than guess.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from kernels.impls import Value
from orchestrator.errors import SpecError
from orchestrator.planning import PlannedConfigs, planned_configs
from orchestrator.spec.files import spec_from_data
from orchestrator.spec.records import DEFAULT_IMPL, config_fields
from orchestrator.store.document import ResultsDoc

log = logging.getLogger(__name__)

Config = tuple[Value, ...]  # the values of ``records.config_fields(mode)``, in that order


@dataclass(frozen=True)
class Coverage:
    """One problem's planned forced configs and, of those without a record, the ones a search
    chose never to measure (``never_measured``) and the rest (``missing``); all in plan order."""

    mode: str
    planned: tuple[Config, ...]
    missing: tuple[Config, ...]
    impl: str = DEFAULT_IMPL
    never_measured: tuple[Config, ...] = ()
    searching: bool = False  # its search has not ended: what it never measured may be measured yet

    def missing_configs(self) -> list[dict[str, Value]]:
        """The missing configs as records name their fields (``report.config_label`` takes them)."""
        return self._named(self.missing)

    def never_measured_configs(self) -> list[dict[str, Value]]:
        """The configs a search never measured, as records name their fields."""
        return self._named(self.never_measured)

    def _named(self, configs: tuple[Config, ...]) -> list[dict[str, Value]]:
        fields = config_fields(self.mode, impl=self.impl)
        return [dict(zip(fields, c, strict=True)) for c in configs]


@dataclass(frozen=True)
class Plans:
    """The plans of the sweeps that wrote a document, oldest first (none: no plan known), and per
    problem the configs a search among them chose never to measure."""

    plans: tuple[PlannedConfigs, ...]
    never: dict[tuple[Any, ...], frozenset[Config]] = field(default_factory=dict)
    searching: frozenset[tuple[Any, ...]] = frozenset()  # problems whose search goes on (the newest block's)

    def problems(self) -> set[tuple[Any, ...]]:
        """Every problem some plan has (``records.problem_key`` tuples)."""
        return set().union(*(p.problems for p in self.plans))

    def coverage(self, problem: tuple[Any, ...], recorded: Container[Config]) -> Coverage | None:
        """What the plans have for ``problem`` and which of it is not in ``recorded`` (the
        configs the document holds a record of), or None where no plan has the problem."""
        grids = [grid for p in self.plans if (grid := p.of(problem)) is not None]
        if not grids:
            return None
        planned = tuple(dict.fromkeys(c for grid in grids for c in grid))
        never = self.never.get(problem, frozenset())
        unrecorded = [c for c in planned if c not in recorded]
        return Coverage(
            problem[5],
            planned,
            tuple(c for c in unrecorded if c not in never),
            problem[9],
            tuple(c for c in unrecorded if c in never),
            problem in self.searching,
        )


def joined(plans: Iterable[Plans]) -> Plans:
    """The plans of several documents as one (a document ``combine`` made has no block of its
    own): every plan of each, in the documents' order, their configs never measured and their
    problems whose search goes on."""
    plans = list(plans)
    never: dict[tuple[Any, ...], frozenset[Config]] = {}
    for p in plans:
        for problem, configs in p.never.items():
            never[problem] = never.get(problem, frozenset()) | configs
    searching = frozenset[tuple[Any, ...]]().union(*(p.searching for p in plans))
    return Plans(tuple(g for p in plans for g in p.plans), never, searching)


def searching_of(doc: ResultsDoc) -> frozenset[tuple[Any, ...]]:
    """The problems (``records.problem_key`` tuples) of the document's search that has not ended."""
    block = doc.extra.get("tilesweep")
    return _searching(block) if isinstance(block, dict) else frozenset()


def _searching(block: dict[str, Any]) -> frozenset[tuple[Any, ...]]:
    """The problems of a search that has not ended (its block's ``ended`` false): a later round
    may still measure what it has not (``resume`` plans it)."""
    search = block.get("search")
    if not isinstance(search, dict) or search.get("ended") is not False:
        return frozenset()
    problems = search.get("problems")
    return frozenset(
        tuple(p["problem"])
        for p in (problems if isinstance(problems, list) else [])
        if isinstance(p, dict) and isinstance(p.get("problem"), list) and p.get("state") == "searching"
    )


def _never_measured(block: dict[str, Any]) -> dict[tuple[Any, ...], set[Config]]:
    """A search's configs never measured, per problem, from its block (none for other strategies)."""
    search = block.get("search")
    problems = search.get("problems") if isinstance(search, dict) else None
    out: dict[tuple[Any, ...], set[Config]] = {}
    for p in problems if isinstance(problems, list) else []:
        if isinstance(p, dict) and isinstance(p.get("problem"), list) and isinstance(p.get("never_measured"), list):
            out[tuple(p["problem"])] = {tuple(c) for c in p["never_measured"] if isinstance(c, list)}
    return out


def plans_of(doc: ResultsDoc) -> Plans:
    """The plans of the document's tilesweep blocks: the ``earlier`` ones, then its own. A spec
    this tilesweep cannot read is no plan (a warning says so)."""
    block = doc.extra.get("tilesweep")
    if not isinstance(block, dict):
        return Plans(())
    earlier = block.get("earlier")
    blocks = [(f"tilesweep.earlier[{i}]", e) for i, e in enumerate(earlier if isinstance(earlier, list) else [])]
    plans = []
    never: dict[tuple[Any, ...], set[Config]] = {}
    for where, b in [*blocks, ("tilesweep", block)]:
        if not isinstance(b, dict) or not isinstance(b.get("spec"), dict):
            continue
        try:
            plans.append(planned_configs(spec_from_data(b["spec"], source=f"{doc.name}: {where}.spec")))
        except SpecError as exc:  # written by another tilesweep version: say nothing rather than guess
            log.warning("%s; its planned configs are not counted", exc.message)
            continue
        for problem, configs in _never_measured(b).items():
            never.setdefault(problem, set()).update(configs)
    return Plans(tuple(plans), {k: frozenset(v) for k, v in never.items()}, _searching(block))
