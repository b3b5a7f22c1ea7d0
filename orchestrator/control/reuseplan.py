"""Planning a sweep with reuse: which items earlier documents already hold (``store.reuse``),
the units of the rest, sharded with the sources' measured costs.

The environment reused records are checked against is the one the workers will measure in.
Where that can be known before any worker ran, it is: the sweep directory's ``env.json`` (a
sweep reopened), this interpreter's jax and device for a local or in-process run (the workers
are this machine), the replay source's for a replay. On SLURM the login node is not the GPU
node, so the environment is taken from the output document (the sweep appends to it, and
merging refuses another device there anyway), else from the first ``--reuse`` document. A
guess that proves wrong costs measurements, never a mixed document: the merger quarantines the
reuse unit's partial when the workers' ``env.json`` differs, and resume measures its items.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import counted
from orchestrator.control.searchplan import DesignRound, design_round
from orchestrator.planning import Unit, WorkItem, expand, say_if_large, shard_items
from orchestrator.planning.costs import CostTable
from orchestrator.planning.search import SEARCH
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.model import SweepSpec
from orchestrator.store import lowering
from orchestrator.store.carried import reuse_unit
from orchestrator.store.portfolio import portfolio
from orchestrator.store.reuse import Found, document_env, find_reuse
from orchestrator.store.reuse_sources import Source, load_sources

log = logging.getLogger(__name__)

REMEASURE = ("all", "errors")


@dataclass
class ReuseRequest:
    """What the command line asks of reuse, on top of the spec's ``reuse`` section."""

    documents: list[str] = field(default_factory=list)  # --reuse
    remeasure: str | None = None  # --remeasure all|errors
    errors: bool = False  # --reuse-errors
    replays: bool = False  # --include-replays: a measured sweep reuses replayed records too
    keep_index: bool = True  # write a key index built for a document beside it (not in a dry run)


@dataclass
class Planned:
    """A plan with reuse: every item, the units that measure, the unit of reused items (None
    when nothing is reused) and what reuse found; for a search, its round 1 (the units measure
    its items only)."""

    items: list[WorkItem]
    units: list[Unit]
    reused: Unit | None
    found: Found
    search: DesignRound | None = None

    @property
    def size(self) -> int:
        """The items the plan records: every item, or a search's round 1 and what it carries."""
        return len(self.items) if self.search is None else len(self.search.items) + self.found.reused


def local_env(spec: SweepSpec) -> dict[str, Any]:
    """The environment the workers of a run on this machine record (``env.json``)."""
    from jobs import worker

    if spec.kernel.impl == "replay":
        from jobs import replay
        from orchestrator.store.replaysource import load_source

        return env_fingerprint(replay.device_block(load_source(spec)))
    return env_fingerprint(worker.device_block())


def target_env(spec: SweepSpec, root: Path, sources: list[Source], kind: str) -> tuple[dict[str, Any] | None, str]:
    """The environment reused records must match, and where it was read (see the module doc)."""
    env_json = root / "env.json"
    if env_json.is_file():
        from orchestrator.store.sweepdir import SweepDir

        recorded = SweepDir(root).recorded_env()
        if recorded:
            return env_fingerprint(recorded), str(env_json)
    if not sources:
        return None, ""
    if kind != "slurm" or spec.kernel.impl == "replay":
        try:
            return local_env(spec), "this machine" if spec.kernel.impl != "replay" else "the replay source"
        except ImportError:  # planning where jax is not installed: the documents say
            log.info("jax is not importable here; the environment of reuse is taken from the documents")
    for src in sources:
        env = document_env(src.doc)
        if env is not None:
            return env, f"{src.path} (the workers are assumed to run where it was measured)"
    return None, ""


def plan_with_reuse(
    spec: SweepSpec,
    root: Path,
    output: Path,
    units: int | None,
    costs: CostTable | None,
    request: ReuseRequest | None,
    kind: str | None = None,
) -> Planned:
    """Expand the spec, set aside what the sources hold, shard the rest (``costs`` first, then the
    sources' measured costs, then the model)."""
    request = request or ReuseRequest()
    say_if_large(spec)
    items = expand(spec)
    lowering.apply_from(items, root, spec)  # what pre-flight lowering of this sweep directory refused is pruned
    sources = load_sources(output, request.documents, spec.reuse.documents, request.keep_index)
    env, env_from = target_env(spec, root, sources, kind or spec.executor.kind)
    errors = (spec.reuse.errors or request.errors) and request.remeasure != "errors"
    found = find_reuse(
        spec,
        items,
        sources,
        env,
        env_from,
        errors=errors,
        records=request.remeasure != "all",
        replays=spec.reuse.replays or request.replays,
    )
    table = _combined(costs, found.costs)
    todo = [it for it in items if it.index not in found.records] if found.records else items
    search = None
    if spec.timing.strategy == SEARCH:  # round 1 measures the design; reuse carries what it found
        search = design_round(spec, items, set(found.records), portfolio(sources, spec.measured_impl, env))
        todo = search.items
    del sources  # their key indexes and heads: not held while the rest is sharded
    planned = shard_items(spec, todo, units, table)
    reused = reuse_unit(items, found, len(planned), spec.fingerprint()) if found.records else None
    log.info(
        "planned %s: %d reused, %d in %s",
        counted(len(items), "item"),
        found.reused,
        len(todo),
        counted(len(planned), "unit"),
    )
    return Planned(items=items, units=planned, reused=reused, found=found, search=search)


def _combined(first: CostTable | None, then: CostTable | None) -> CostTable | None:
    """Measured costs of ``first`` (``--costs``), filled in from ``then`` (the reuse sources)."""
    if first is None or then is None:
        return first or then
    return CostTable({**then.costs, **first.costs}, source=f"{first.source}, {then.source}")
