"""What a growing partial records, read incrementally: the records and headers that ``status``
(and ``wait``, ``run``'s progress line, which ask again and again) count, where a repeated
count reads only the bytes appended since the last one.

A partial is appended to by its worker only, a whole line at a time, so what its first ``n``
complete lines say never changes while the file is the same file: the tally keeps, per path,
what those lines said (their records' ids and whether each is an error, the worker headers,
whether the file is foreign) and the offset after them, and the next count classifies only
what follows. Each line is classified by the one classifier every reader uses
(``partials.classify``), so the tally and ``read_partial`` agree on every line. An unfinished
last line is classified each time and never kept. The tally is dropped, and the file read
from its start, when the path is another file (another inode), is shorter than what was read,
or its first line or the last line read differ (a file copied over in place).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from orchestrator.errors import PartialError
from orchestrator.store.lines import ReadHeader
from orchestrator.store.partials import (
    FOREIGN,
    HEADER,
    RECORD,
    VERSION,
    Line,
    UnitItems,
    classify,
    iter_lines,
    read_header,
)

# Partials tallied at most (one sweep's running units fit many times over); the oldest go first.
MAX_TALLIES = 20_000


@dataclass
class Tally:
    """What the complete lines up to ``offset`` of one partial say, as ``read_partial`` reads
    them: ``records`` item id -> whether its (last) record is an error; ``foreign`` why nothing
    in the file counts."""

    ino: tuple[int, int]
    items: UnitItems
    offset: int = 0
    lineno: int = 1
    first: bytes = b""  # the first line, with its newline
    last: bytes = b""  # the last complete line read, with its newline
    headers: list[ReadHeader] = field(default_factory=list)
    records: dict[str, bool] = field(default_factory=dict)
    foreign: str | None = None


@dataclass
class Counts:
    """A partial's records and error records as ``read_partial`` would give them, its worker
    headers, and ``foreign``: why nothing in it counts (None: it counts)."""

    records: int
    errors: int
    headers: list[ReadHeader]
    foreign: str | None


_TALLIES: dict[str, Tally] = {}


def count_partial(path: str, sweep_root: Path, unit: str) -> Counts:
    """The partial at ``path`` of ``unit`` of the sweep at ``sweep_root``, counted as the
    module docstring says. A partial of another schema version raises
    ``PartialError``, as ``read_partial`` does."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())  # the file opened, even where the path was replaced meanwhile
            tally = _still_valid(_TALLIES.get(path), f, st)
            if tally is None:
                tally = Tally(ino=(st.st_dev, st.st_ino), items=UnitItems(sweep_root, unit))
            f.seek(tally.offset)
            data = f.read()
    except FileNotFoundError:  # moved away meanwhile (to quarantine): empty, as read_partial says
        _TALLIES.pop(path, None)
        return Counts(0, 0, [], None)
    _TALLIES.pop(path, None)
    tail = _advance(tally, data, path)
    if len(_TALLIES) >= MAX_TALLIES:
        del _TALLIES[next(iter(_TALLIES))]
    _TALLIES[path] = tally
    if tally.foreign is not None:
        return Counts(0, 0, [], tally.foreign)
    records, headers = tally.records, tally.headers
    if tail is not None:  # the unfinished last line: counted now, classified again next time
        kind, reason, iid, _, body = tail
        if kind == FOREIGN:
            return Counts(0, 0, [], f"line {tally.lineno}: {reason}")
        if kind == RECORD and body is not None:
            records = {**records, iid: "error" in body}
        elif kind == HEADER and body is not None:
            headers = [*headers, read_header(body, tally.lineno)]
    return Counts(len(records), sum(records.values()), headers, None)


def _still_valid(tally: Tally | None, f: BinaryIO, st: os.stat_result) -> Tally | None:
    """``tally`` where it still describes the first ``offset`` bytes of the open file ``f``."""
    if tally is None or tally.ino != (st.st_dev, st.st_ino) or st.st_size < tally.offset:
        return None
    f.seek(0)
    if f.read(len(tally.first)) != tally.first:
        return None
    f.seek(tally.offset - len(tally.last))
    return tally if f.read(len(tally.last)) == tally.last else None


def _advance(tally: Tally, data: bytes, path: str) -> Line | None:
    """Classify the complete lines of ``data`` (what follows ``tally.offset``) into ``tally``;
    return the unfinished last line's classification (None: there is none)."""
    base = tally.offset
    if tally.foreign is not None:
        tally.offset = base + data.rfind(b"\n") + 1
        return None
    for lineno, end, raw, terminated in iter_lines(data, tally.lineno):
        line = classify(raw, terminated, bool(tally.headers), tally.items)
        kind, reason, iid, _, body = line
        if kind == VERSION:
            raise PartialError(f"{path} line {lineno}: {reason}")
        if not terminated:
            return line
        tally.offset, tally.lineno, tally.last = base + end, lineno + 1, raw + b"\n"
        if lineno == 1:
            tally.first = tally.last
        if kind == RECORD and body is not None:
            tally.records[iid] = "error" in body
        elif kind == HEADER and body is not None:
            tally.headers.append(read_header(body, lineno))
        elif kind == FOREIGN:
            tally.foreign = f"line {lineno}: {reason}"
            tally.records.clear()
            tally.headers.clear()
            tally.offset = base + data.rfind(b"\n") + 1
            return None
    return None
