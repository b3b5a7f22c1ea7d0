"""A halving document's screened configs: which survived the screen and wait for round 2's full
timing (*not timed in full yet*: missing, as ``resume`` redoes them), and which were screened
out. Round 2's plan names its survivors (``round2.json``'s ``ids``, the document's
``tilesweep.rounds.survivor_ids``): a survivor whose only record is its screen waits. A
complete sweep has timed every survivor in full, so only a document merged before round 2 ended
(a stop, then ``merge``) has any waiting; a document that does not name its survivors (an
earlier tilesweep's) is read as having none."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.analysis.scan import ProblemScan
from orchestrator.spec.records import item_id
from orchestrator.store.document import ResultsDoc


@dataclass(frozen=True)
class Survivors:
    """The item ids round 2 of a halving sweep times in full."""

    ids: frozenset[str]

    def waiting(self, sc: ProblemScan) -> set[Any]:
        """The problem's configs that survived their screen and have no full timing yet."""
        return {cid for cid, rec in sc.screened.items() if cid not in sc.per_config and _id(rec) in self.ids}


def _id(rec: dict[str, Any]) -> str | None:
    try:
        return item_id(rec)
    except (KeyError, TypeError, ValueError):
        return None


def joined(rules: Iterable[Survivors | None]) -> Survivors | None:
    """The survivors several documents name, as one rule (None: none names any)."""
    named = [r.ids for r in rules if r is not None]
    return Survivors(frozenset().union(*named)) if named else None


def survivors_of(doc: ResultsDoc) -> Survivors | None:
    """Round 2's survivors as ``doc`` names them; None where it names none."""
    block = doc.extra.get("tilesweep")
    rounds = block.get("rounds") if isinstance(block, dict) else None
    ids = rounds.get("survivor_ids") if isinstance(rounds, dict) else None
    if not isinstance(ids, list) or not ids:
        return None
    return Survivors(frozenset(i for i in ids if isinstance(i, str)))
