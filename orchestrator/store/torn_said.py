"""Which incomplete lines of the partials a merge has warned of already, so each is said once.

A partial whose last line was cut off (its worker stopped mid-write, its disk full) keeps that
line until the unit is resumed, and every merge meanwhile reads it again (an unterminated tail
is never cached: ``segments``). The first merge that finds it says so; the later ones stay
quiet about the same line of the same file (its inode and line number), kept in
``SWEEP/merge-cache/torn-said.json``. A line cut off anew (a new file, another line) is said
again. Derived data like the rest of the cache: where it cannot be written, or was deleted,
the line is said once more. The line itself is never read as a record, whatever is said.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from orchestrator.store.files import atomic_write_json, read_text
from orchestrator.store.segments import CACHE_DIR, Segment

log = logging.getLogger(__name__)

SAID_FILE = "torn-said.json"


class TornSaid:
    """The incomplete lines said by earlier merges (unit -> [inode, line] pairs), and those
    found by this one."""

    def __init__(self, sweep_root: Path, *, use: bool = True) -> None:
        self.path = sweep_root / CACHE_DIR / SAID_FILE
        self.use = use
        self.before: dict[str, list[list[int]]] = self._read() if use else {}
        self.now: dict[str, list[list[int]]] = {}

    def _read(self) -> dict[str, list[list[int]]]:
        try:
            data: Any = json.loads(read_text(self.path))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def to_say(self, seg: Segment, skipped: list[list[Any]]) -> list[list[Any]]:
        """The lines of ``skipped`` (``seg``'s open ones) to warn of: every invalid line, and
        each incomplete one no earlier merge said of this file."""
        torn = [[seg.ino, s[0]] for s in skipped if len(s) > 3 and s[3]]
        if torn:
            self.now[seg.unit] = torn
        said = self.before.get(seg.unit) or []
        return [s for s in skipped if not (len(s) > 3 and s[3] and [seg.ino, s[0]] in said)]

    def save(self) -> None:
        """Keep the incomplete lines open now for the next merge (where it changed)."""
        if not self.use or self.now == self.before:
            return
        try:
            atomic_write_json(self.path, self.now)
        except OSError as exc:  # a full disk, a read-only cache: the next merge says them again
            log.debug("%s not written: %s", self.path, exc)
