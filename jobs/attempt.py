"""One attempt at a unit, as every measurer sees it: where its lines go, the suspects earlier
attempts left, and what it has recorded; what its summary counts is kept apart (``counts``).

A measurer (``jobs.measurer``) writes through the attempt only: ``start`` before a window of
configs is compiled (their start lines, each config then in flight), ``record`` for each
finished config. Writes go through ``jobs.in_flight``, so a stop signal that arrives mid-line
waits for the line to be whole.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planning import WorkItem
from orchestrator.store.lines import PartialLine, PartialWriter, record_line, start_line
from orchestrator.store.markers import UnitCounts

from . import in_flight

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One attempt at a unit. ``starts``, ``deaths`` and ``hangs`` count per item the starts that
    died with it in flight (here and in other units' partials), those while it was alone in
    flight (what counts against it), and those the time limit found hung."""

    unit_id: str
    number: int  # the attempt's number: its header and every line it writes carry it
    writer: PartialWriter
    todo: int  # items without a record when the attempt began
    starts: Counter[str]
    deaths: Counter[str]
    hangs: Counter[str]
    round: int = 1  # the unit's round (halving has two)
    stop_check: Callable[[], bool] | None = None  # the caller's: polled between configs
    counts: UnitCounts = field(default_factory=UnitCounts)
    recorded: dict[str, bool] = field(default_factory=dict)  # item id -> is an error, of what it wrote

    def should_stop(self) -> bool:
        return in_flight.stop_requested() or (self.stop_check is not None and self.stop_check())

    def write(self, line: PartialLine, *, started: str | None = None, sync: bool = True) -> None:
        """Append a line (``in_flight.write``: ``started``, the item now in flight)."""
        in_flight.write(self.writer, line, started=started, sync=sync)

    def start(self, window: Sequence[WorkItem]) -> None:
        """The start lines of a window about to be compiled (``alone`` when it holds one config)."""
        alone = len(window) == 1
        for it in window:
            self.write(start_line(it.id, self.number, alone=alone), started=it.id)

    def record(self, it: WorkItem, rec: dict[str, Any], *, sync: bool = True) -> None:
        """Write ``it``'s record; ``sync=False``: fsynced with a later line (a replay's)."""
        self.write(record_line(it.id, self.number, rec), sync=sync)
        error = "error" in rec
        self.recorded[it.id] = error
        self.counts.done += 1
        self.counts.errors += error
        self.counts.screened += bool(rec.get("screened"))
        log.info("unit %s: %d/%d %s", self.unit_id, self.counts.done, self.todo, "error" if error else "ok")
