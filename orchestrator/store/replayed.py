"""Which records of a results document were replayed rather than measured: the one home of that rule.

A replayed sweep (``kernel.impl: replay``, ``jobs.replay``) writes the records a real worker
would have written, with samples drawn from another document's spread and seconds counted on a
virtual clock. They look like measurements (same fields, the source's device block with backend
``replay``), so every reader that takes a record for a measurement asks here first: combining and
exporting (a replayed record never supersedes a measured one and enters a tuned table only when
asked), compare, the report and its page (they say which numbers are replayed), and reuse (a
measured sweep never carries a replayed record unless asked).

A record is replayed when

- its ``timer`` is ``virtual`` (what a replay's worker writes on every timed record);
- or the tilesweep block whose ``attempts`` hold its ``unit`` measured on a virtual clock (its
  ``measurement.clock``) or is a replay's (its spec's ``kernel.impl``): this covers a replay's
  error records, which carry no timer;
- or no block names its unit and the document's own sweep was a replay, or, for a document
  without any block, its device block's backend is ``replay``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.spec.sections import REPLAY
from orchestrator.store.document import ResultsDoc
from orchestrator.store.provenance import TilesweepBlock, attempts_of, blocks

VIRTUAL = "virtual"  # a replay's clock (``measurement.clock``) and its timed records' ``timer``


def block_replayed(block: Mapping[str, Any]) -> bool:
    """Whether a tilesweep block is a replay's: its clock was virtual, or its spec replays."""
    measurement = block.get("measurement")
    clock = measurement.get("clock") if isinstance(measurement, Mapping) else None
    if isinstance(clock, list) and VIRTUAL in clock:
        return True
    spec = block.get("spec")
    kernel = spec.get("kernel") if isinstance(spec, Mapping) else None
    return isinstance(kernel, Mapping) and kernel.get("impl") == REPLAY


def replay_source(block: Mapping[str, Any]) -> str | None:
    """The document a replay's block answered from (its spec's ``replay.source``), if it says."""
    spec = block.get("spec")
    replay = spec.get("replay") if isinstance(spec, Mapping) else None
    source = replay.get("source") if isinstance(replay, Mapping) else None
    return source if isinstance(source, str) else None


@dataclass(frozen=True)
class Replayed:
    """The rule of the module docstring for one document: call it with a record."""

    units: frozenset[str]  # units of the replays' blocks
    measured_units: frozenset[str]  # units of the other blocks
    by_default: bool  # a record no block names: the document's own sweep (or device block) is a replay's
    sources: tuple[str, ...]  # the documents its replays answered from

    @property
    def possible(self) -> bool:
        """Whether any record of the document can be replayed on its unit alone (else only a
        record's own ``timer`` can say so)."""
        return bool(self.units) or self.by_default

    def __call__(self, rec: Mapping[str, Any]) -> bool:
        if rec.get("timer") == VIRTUAL:
            return True
        unit = rec.get("unit")
        if unit in self.units:
            return True
        if unit in self.measured_units:
            return False
        return self.by_default


def replayed_of(doc: ResultsDoc) -> Replayed:
    """The rule for ``doc``, read from its tilesweep blocks and its device block."""
    every: list[TilesweepBlock] = blocks(doc.extra.get("tilesweep"))
    units: set[str] = set()
    measured: set[str] = set()
    sources: list[str] = []
    for block in every:
        replay = block_replayed(block)
        (units if replay else measured).update(attempts_of(block))
        source = replay_source(block) if replay else None
        if source is not None and source not in sources:
            sources.append(source)
    own = block_replayed(every[-1]) if every else doc.device.get("backend") == REPLAY
    return Replayed(frozenset(units), frozenset(measured - units), own, tuple(sources))


def count_replayed(doc: ResultsDoc, replayed: Replayed | None = None) -> int:
    """How many of the document's records are replayed."""
    rule = replayed if replayed is not None else replayed_of(doc)
    return sum(1 for rec in doc.results if rule(rec))


def describe(doc: ResultsDoc, replayed: Replayed | None = None) -> str | None:
    """One phrase for a document with replayed records ("every record replayed from S: ..." or
    "N of M records replayed ..."), None for a document of measurements only."""
    rule = replayed if replayed is not None else replayed_of(doc)
    n = count_replayed(doc, rule)
    if not n:
        return None
    source = f" from {', '.join(rule.sources)}" if rule.sources else ""
    share = "every record" if n == len(doc.results) else f"{n} of {len(doc.results)} records"
    return f"{share} replayed{source}: times drawn on a virtual clock, not measured"
