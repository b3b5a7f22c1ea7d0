"""What a results document's plan says it should hold: the configs planned per problem.

A document tilesweep wrote carries the spec of the sweep that wrote it (its ``tilesweep``
block), and the specs of sweeps appended into it (the ``earlier`` blocks); the planner turns
each into the forced configs it plans per problem without expanding it
(``planning.planned_configs``). The report compares them with the records to say how many
configs are missing. A document without a block (the reference run's) has no known plan.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SpecError
from orchestrator.planning import PlannedConfigs, planned_configs
from orchestrator.spec.files import spec_from_data
from orchestrator.store.document import ResultsDoc


def plans_of(doc: ResultsDoc) -> list[PlannedConfigs]:
    """The plans of the sweeps that wrote the document: its tilesweep block's spec and those
    of the blocks of sweeps appended into it. A spec this tilesweep cannot read is no plan."""
    block = doc.extra.get("tilesweep")
    if not isinstance(block, dict):
        return []
    plans = []
    for b in [block, *(e for e in block.get("earlier") or [] if isinstance(e, dict))]:
        if isinstance(b.get("spec"), dict):
            try:
                plans.append(planned_configs(spec_from_data(b["spec"], source="the document's tilesweep block")))
            except SpecError:
                continue
    return plans


def planned(plans: list[PlannedConfigs], problem: tuple[Any, ...]) -> set[tuple[int, ...]] | None:
    """The configs the plans have for ``problem`` (their union), or None where none plans it."""
    found = [c for p in plans if (c := p.of(problem)) is not None]
    return set().union(*found) if found else None
