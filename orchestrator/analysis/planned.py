"""What a sweep planned and its document does not hold: the missing configs of each problem.

A document tilesweep merged carries the sweep's spec in its ``tilesweep`` block; expanding that
spec with the planner gives every item the sweep meant to measure, and an item with no record
in the document is missing (a unit still running, or one that died: ``resume`` redoes them).
A document without that block (the reference run's, or another tool's) cannot say what was
planned, so ``missing_records`` returns ``None`` and the report says nothing rather than guess.

Items are matched to records on their identity and config values as tuples, not on hashed
ids: the fields come from ``spec.records`` (the one home of the layout), read by name from the
work item and the record alike, then the normalised (causal, kv_heads, impl) of each
(``records.variant``): a causal record does not stand for its non-causal twin. The missing
items are grouped into problems by the report's own ``group_by_problem``, on the records they
would have written, so a problem here is keyed exactly as the page's problems are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Any

from orchestrator.analysis.report import group_by_problem
from orchestrator.errors import SpecError
from orchestrator.planning import expand
from orchestrator.planning.items import WorkItem
from orchestrator.spec.files import spec_from_data
from orchestrator.spec.records import IDENTITY_FIELDS, config_fields, variant
from orchestrator.store.document import ResultsDoc

log = logging.getLogger(__name__)


def planned_spec_data(doc: ResultsDoc) -> dict[str, Any] | None:
    """The spec of the sweep that wrote the document, as stored in its ``tilesweep`` block."""
    block = doc.extra.get("tilesweep")
    spec = block.get("spec") if isinstance(block, dict) else None
    return spec if isinstance(spec, dict) else None


def missing_records(doc: ResultsDoc) -> dict[tuple, list[dict[str, Any]]] | None:
    """Per problem (``group_by_problem``'s key), the identity and config fields of the planned
    items without a record, in plan order. ``None`` when the document does not say what was
    planned."""
    data = planned_spec_data(doc)
    if data is None:
        return None
    try:
        spec = spec_from_data(data, source=f"{doc.name}: tilesweep.spec")
    except SpecError as exc:  # written by another tilesweep version: say nothing rather than guess
        log.warning("%s; missing configs are not listed", exc.message)
        return None
    seen = _present(doc.results)
    ident = attrgetter(*IDENTITY_FIELDS)

    def key(item: WorkItem) -> tuple:
        return (
            ident(item) + item.params + (item.causal, None if item.kv_heads == item.heads else item.kv_heads, item.impl)
        )

    return group_by_problem(item.record_fields() for item in expand(spec) if key(item) not in seen)


def _present(results: list[dict[str, Any]]) -> set[tuple]:
    """Identity and config values of every record, then its variant, as tuples (one getter per
    mode and kind)."""
    getters: dict[tuple[str, str], Callable[[dict[str, Any]], tuple]] = {}
    seen = set()
    for rec in results:
        kind = (rec["mode"], rec["config"])
        get = getters.get(kind)
        if get is None:
            get = getters[kind] = itemgetter(*IDENTITY_FIELDS, *config_fields(*kind))
        try:
            seen.add(get(rec) + variant(rec))
        except KeyError:  # a record without some config field: it matches no planned item
            continue
    return seen
