"""Dedupe: of the records of one item, the newest wins.

"Newest" is the record of the attempt that started last (by its header's start time), then
the later unit in the unit index, then the later line of the partial. Each record is ranked
by one integer, (attempt rank << 32) | line, so picking the winners of a million records is
one comparison each. Appending into an existing document applies the same rule against that
document's records (``append``), which is why the winners keep their attempt's start time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from orchestrator.store.segments import Segment


@dataclass
class Slots:
    """The winning record of each plan position."""

    text: list[bytes | None]
    ids: list[str | None]
    err: bytearray
    found: int = 0
    superseded: int = 0
    key: list[int] = field(default_factory=list)  # (attempt rank << 32) | line of each winner
    started: list[str] = field(default_factory=list)  # attempt rank -> its start time

    def texts(self) -> list[bytes]:
        """The winners' texts in plan order: ``text`` itself where every position has one."""
        if self.found == len(self.text):
            return cast("list[bytes]", self.text)
        return [t for t in self.text if t is not None]

    def winner_ids(self) -> list[str]:
        """The winners' item ids in plan order, as ``texts``."""
        if self.found == len(self.ids):
            return cast("list[str]", self.ids)
        return [i for i in self.ids if i is not None]

    def started_of(self, pi: int) -> str:
        """When the attempt that measured the record at plan position ``pi`` started."""
        return self.started[self.key[pi] >> 32]


def pick_newest(segs: list[Segment], planned: int) -> Slots:
    """Dedupe by plan position: the record of the latest-started attempt wins (then the later
    unit in the index, then the later line)."""
    size = max([planned, *(max(s.idx) + 1 for s in segs if s.idx)])
    attempts = sorted(
        (str(h.get("started") or ""), pos, h.get("attempt")) for pos, s in enumerate(segs) for h in s.headers
    )
    rank = {(pos, a): r + 1 for r, (_, pos, a) in enumerate(attempts)}
    key = [-1] * size
    slots = Slots([None] * size, [None] * size, bytearray(size), key=key, started=["", *(a[0] for a in attempts)])
    text = slots.text  # the winners' columns, as locals for the loop below
    ids = slots.ids
    err = slots.err
    for pos, s in enumerate(segs):
        ranks = {a: rank.get((pos, a), 0) << 32 for a in set(s.att)}
        for pi, a, ln, t, e, iid in zip(s.idx, s.att, s.ln, s.texts, s.err, s.ids, strict=True):
            k = ranks[a] | ln
            old = key[pi]
            if k > old:
                if old >= 0:
                    slots.superseded += 1
                key[pi] = k
                text[pi] = t
                ids[pi] = iid
                err[pi] = e
            else:
                slots.superseded += 1
    slots.found = size - key.count(-1)
    return slots
