"""Planning: a spec expanded into work items and packed into units by cost. Pure: no I/O.

``items`` expands a spec into work items in the reference run's record order, each classified
by ``classify`` (runnable, invalid, pruned by the shared-memory model), its grids as ``grids``
makes them from the kernel implementation's tunables; ``costs`` says what an
item costs a worker; ``shard`` packs items into units. ``plan`` does all three.
"""

from __future__ import annotations

import itertools

from orchestrator.planning.classify import INVALID, PRUNED, RUN
from orchestrator.planning.costs import CostTable, item_costs, setup_estimate
from orchestrator.planning.grids import Verdicts, notes, prunes_by_lowering
from orchestrator.planning.items import (
    PlannedConfigs,
    WorkItem,
    bulk,
    expand,
    plan_line,
    planned_configs,
    say_if_large,
)
from orchestrator.planning.shard import Unit, default_units, shard
from orchestrator.spec.model import SweepSpec

__all__ = [
    "INVALID",
    "PRUNED",
    "RUN",
    "CostTable",
    "PlannedConfigs",
    "Unit",
    "Verdicts",
    "WorkItem",
    "expand",
    "notes",
    "plan",
    "plan_line",
    "planned_configs",
    "prunes_by_lowering",
    "say_if_large",
    "shard",
    "shard_items",
]


def plan(
    spec: SweepSpec, units: int | None = None, costs: CostTable | None = None
) -> tuple[list[WorkItem], list[Unit]]:
    """Expand and shard a spec. ``costs`` (``costs.cost_table``) replaces the cost model
    with an earlier sweep's measurements where it has them."""
    with bulk():
        say_if_large(spec)
        items = expand(spec)
        return items, shard_items(spec, items, units, costs)


def shard_items(
    spec: SweepSpec, items: list[WorkItem], units: int | None = None, costs: CostTable | None = None
) -> list[Unit]:
    """Shard ``items`` of ``spec`` (all of its items, or those left to measure once reused
    records are set aside: none left, no unit) into units of round 1."""
    if not items:
        return []
    with bulk():
        shapes = [
            (dtype, head_dim, seq, spec.batch, spec.heads, None if kv == spec.heads else kv)
            for dtype, head_dim, seq, kv in itertools.product(spec.dtypes, spec.head_dims, spec.seq_lens, spec.kv_heads)
        ]
        item_cost, scale = item_costs(items, spec, costs)
        setups = {sh: setup_estimate(sh, spec.modes, spec.causal) * scale for sh in shapes}
        n = units if units is not None else default_units(spec, len(shapes))
        return shard(
            items,
            n,
            costs=item_cost,
            setups=setups,
            strategy=spec.sharding.strategy,
            sweep=spec.fingerprint(),
            shares=spec.executor.unit_shares(),
        )
