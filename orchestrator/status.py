"""Progress of a sweep, rebuilt from its directory alone.

The partial files are the truth for progress (a record line is a finished config); the
scheduler's view is a hint layered on top by dispatch. Counting is done on bytes, without
parsing JSON, so a sweep of thousands of units is read in well under a second.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .partials import count_records
from .sweepdir import SweepDir


@dataclass
class UnitStatus:
    id: str
    total: int
    done: int
    complete: bool
    state: str = "pending"  # pending | running | done | failed | cancelled | timed out | requeued
    errors: int | None = None
    log: str | None = None


@dataclass
class SweepStatus:
    sweep_dir: str
    planned: int
    units: list[UnitStatus] = field(default_factory=list)

    @property
    def done(self) -> int:
        return sum(min(u.done, u.total) for u in self.units)

    @property
    def complete(self) -> bool:
        return all(u.complete or u.done >= u.total for u in self.units)

    def to_json(self) -> dict[str, Any]:
        return {"sweep_dir": self.sweep_dir, "planned": self.planned, "done": self.done,
                "complete": self.complete, "units": [asdict(u) for u in self.units]}


def sweep_status(sd: SweepDir) -> SweepStatus:
    index = sd.unit_index()
    markers = {p.stem for p in sd.done.glob("*.json")} if sd.done.is_dir() else set()
    st = SweepStatus(str(sd.root), planned=sd.planned)
    for entry in index:
        uid = entry["id"]
        n = count_records(sd.partial_path(uid))
        complete = uid in markers
        state = "done" if complete or n >= entry["n_items"] else ("running" if n else "pending")
        st.units.append(UnitStatus(uid, entry["n_items"], n, complete, state))
    return st
