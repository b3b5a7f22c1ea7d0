"""Which of a unit's items ``tilesweep resume`` gave to later units: what a worker of that unit
leaves to them.

``resume`` regroups the items an ended unit left without a record into new units of the same
round (origin ``resume``; ``retry`` for error records it redoes), appended to ``units.json`` after
it; the old unit's file still lists them. A worker started on the old unit afterwards (by hand,
``python -m jobs.worker SWEEP UNIT``, or a task SLURM requeued) would measure them a second time:
the merge keeps one record of each, and the other unit's work is wasted. The worker leaves them to
the later units instead, and says so.
"""

from __future__ import annotations

from collections.abc import Collection

from orchestrator.store import unitfile
from orchestrator.store.sweepdir import SweepDir

# the origins in units.json of the units `resume` makes of earlier units' items
RESUMED_ORIGINS = ("resume", "retry")


def later_holders(sd: SweepDir, unit: str, item_ids: Collection[str]) -> dict[str, str]:
    """Item id -> the latest unit of ``unit``'s round that ``resume`` gave it to after ``unit``,
    for those of ``item_ids`` (items of ``unit``) such a unit holds. Reads only the unit files
    of such units: none where ``resume`` made no unit after ``unit``."""
    index = sd.unit_index()
    at = next((n for n, e in enumerate(index) if e["id"] == unit), None)
    if at is None or not item_ids:
        return {}
    number = index[at].get("round", 1)
    out: dict[str, str] = {}
    for entry in index[at + 1 :]:
        if entry.get("origin") in RESUMED_ORIGINS and entry.get("round", 1) == number:
            for _, iid in unitfile.read_items(sd.root, entry["id"]):
                if iid in item_ids:
                    out[iid] = entry["id"]
    return out
