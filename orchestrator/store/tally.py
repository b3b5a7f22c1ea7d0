"""What a growing partial records, read incrementally: the records and headers that ``status``
(and ``wait``, ``run``'s progress line, which ask again and again) count, where a repeated
count reads only the bytes appended since the last one, in this process or in another.

A partial is appended to by its worker only, a whole line at a time, so what its first ``n``
complete lines say never changes while the file is the same file: the tally keeps, per path,
what those lines said (their records' ids and whether each is an error, the worker headers,
whether the file is foreign) and the offset after them, and the next count classifies only
what follows. Each line is classified by the one classifier every reader uses
(``partials.classify``), so the tally and ``read_partial`` agree on every line. An unfinished
last line is classified each time and never kept.

A tally is dropped, and the file read from its start, when the path is another file (another
inode), is shorter than when it was counted, was written without growing (same size, another
mtime), or its first line or the last line counted differ (a file copied over in place).

A process keeps its tallies in memory; the ``tilesweep status`` command also leaves them in the
sweep directory (``tally_file``: a ``Book`` reads them where this process holds none, and
writes back what the status counted), so the next status, a new process, starts from there
too. An entry of the file is held to the same checks before it is used.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from orchestrator.errors import PartialError
from orchestrator.store import tally_file
from orchestrator.store.files import open_file
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

# A line's length (newline included) and digest: enough to tell a line from the one counted.
Seal = tuple[int, str]
_NO_LINE: Seal = (0, "")


def seal(line: bytes) -> Seal:
    return len(line), hashlib.blake2b(line, digest_size=16).hexdigest()


@dataclass
class Tally:
    """What the complete lines up to ``offset`` of one partial say, as ``read_partial`` reads
    them: ``records`` item id -> whether its (last) record is an error; ``foreign`` why nothing
    in the file counts. ``size`` and ``mtime_ns``: the file's when it was counted."""

    ino: tuple[int, int]
    items: UnitItems
    offset: int = 0
    lineno: int = 1
    size: int = 0
    mtime_ns: int = 0
    first: Seal = _NO_LINE  # the first line, with its newline
    last: Seal = _NO_LINE  # the last complete line read, with its newline
    headers: list[ReadHeader] = field(default_factory=list)
    records: dict[str, bool] = field(default_factory=dict)
    foreign: str | None = None

    def stamp(self) -> tuple[tuple[int, int], int, int, int]:
        """What a tally file must say of the partial to hold this count of it."""
        return self.ino, self.offset, self.size, self.mtime_ns


@dataclass
class Counts:
    """A partial's records and error records as ``read_partial`` would give them, its worker
    headers, and ``foreign``: why nothing in it counts (None: it counts)."""

    records: int
    errors: int
    headers: list[ReadHeader]
    foreign: str | None


_TALLIES: dict[str, Tally] = {}
# Per sweep directory, what its tally file holds as this process last read or wrote it.
_SAVED: dict[Path, dict[str, tuple[tuple[int, int], int, int, int]]] = {}


class Book:
    """One status's share of a sweep's tally file: its entries, read when a partial this
    process holds no tally of is first counted, and the tallies the status counted
    (``counted``), written back by ``save`` where they differ from what the file holds."""

    def __init__(self, sweep_root: Path) -> None:
        self.root = sweep_root
        self.counted: dict[str, Tally] = {}
        self._stored: dict[str, Tally] | None = None

    def stored(self, unit: str) -> Tally | None:
        """The tally file's count of ``unit``'s partial (to be checked against the partial)."""
        if self._stored is None:
            self._stored = {u: _from_entry(e, self.root, u) for u, e in tally_file.read(self.root).items()}
            _SAVED[self.root] = {u: t.stamp() for u, t in self._stored.items()}
        return self._stored.get(unit)

    def save(self) -> None:
        """Leave what this status counted (the unfinished partials only) in the tally file."""
        stamps = {u: t.stamp() for u, t in self.counted.items()}
        known = _SAVED.get(self.root)
        if known is None and not stamps and not tally_file.tally_path(self.root).exists():
            return  # nothing counted, nothing to replace
        if known == stamps:
            return
        if tally_file.write(self.root, {u: _to_entry(t) for u, t in self.counted.items()}):
            _SAVED[self.root] = stamps


def _from_entry(e: tally_file.Entry, sweep_root: Path, unit: str) -> Tally:
    return Tally(
        ino=(e["ino"][0], e["ino"][1]),
        items=UnitItems(sweep_root, unit),
        offset=e["offset"],
        lineno=e["lineno"],
        size=e["size"],
        mtime_ns=e["mtime_ns"],
        first=(e["first"][0], e["first"][1]),
        last=(e["last"][0], e["last"][1]),
        headers=e["headers"],
        records=e["records"],
        foreign=e["foreign"],
    )


def _to_entry(t: Tally) -> tally_file.Entry:
    return {
        "ino": list(t.ino),
        "size": t.size,
        "mtime_ns": t.mtime_ns,
        "offset": t.offset,
        "lineno": t.lineno,
        "first": list(t.first),
        "last": list(t.last),
        "headers": t.headers,
        "records": t.records,
        "foreign": t.foreign,
    }


def count_partial(path: str, sweep_root: Path, unit: str, book: Book | None = None) -> Counts:
    """The partial at ``path`` of ``unit`` of the sweep at ``sweep_root``, counted as the
    module docstring says, starting where ``book`` (the sweep's tally file) counted to when
    this process holds no tally of it. A partial of another schema version raises
    ``PartialError``, as ``read_partial`` does."""
    try:
        with open_file(Path(path)) as f:
            st = os.fstat(f.fileno())  # the file opened, even where the path was replaced meanwhile
            tally = _still_valid(_TALLIES.get(path), f, st)
            if tally is None and book is not None:
                tally = _still_valid(book.stored(unit), f, st)
            if tally is None:
                tally = Tally(ino=(st.st_dev, st.st_ino), items=UnitItems(sweep_root, unit))
            f.seek(tally.offset)
            data = f.read()
    except FileNotFoundError:  # moved away meanwhile (to quarantine): empty, as read_partial says
        _TALLIES.pop(path, None)
        return Counts(0, 0, [], None)
    _TALLIES.pop(path, None)
    tail = _advance(tally, data, path)
    tally.size, tally.mtime_ns = st.st_size, st.st_mtime_ns
    if len(_TALLIES) >= MAX_TALLIES:
        del _TALLIES[next(iter(_TALLIES))]
    _TALLIES[path] = tally
    if book is not None:
        book.counted[unit] = tally
    return _counts(tally, tail)


def _counts(tally: Tally, tail: Line | None) -> Counts:
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


def _still_valid(tally: Tally | None, f: IO[bytes], st: os.stat_result) -> Tally | None:
    """``tally`` where it still describes the first ``offset`` bytes of the open file ``f``."""
    if tally is None or tally.ino != (st.st_dev, st.st_ino) or st.st_size < tally.size:
        return None
    if st.st_size == tally.size and st.st_mtime_ns != tally.mtime_ns:  # written without growing
        return None
    f.seek(0)
    if tally.first != _NO_LINE and seal(f.read(tally.first[0])) != tally.first:
        return None
    f.seek(tally.offset - tally.last[0])
    if tally.last != _NO_LINE and seal(f.read(tally.last[0])) != tally.last:
        return None
    return tally


def _advance(tally: Tally, data: bytes, path: str) -> Line | None:
    """Classify the complete lines of ``data`` (what follows ``tally.offset``) into ``tally``;
    return the unfinished last line's classification (None: there is none)."""
    base = tally.offset
    if tally.foreign is not None:
        _to_last_newline(tally, data, base)
        return None
    last = -1  # where the last complete line read now starts in ``data``
    for lineno, end, raw, terminated in iter_lines(data, tally.lineno):
        line = classify(raw, terminated, bool(tally.headers), tally.items)
        kind, reason, iid, _, body = line
        if kind == VERSION:
            raise PartialError(f"{path} line {lineno}: {reason}")
        if not terminated:
            _seal_last(tally, data, base, last)
            return line
        tally.offset, tally.lineno, last = base + end, lineno + 1, end - len(raw) - 1
        if lineno == 1:
            tally.first = seal(raw + b"\n")
        if kind == RECORD and body is not None:
            tally.records[iid] = "error" in body
        elif kind == HEADER and body is not None:
            tally.headers.append(read_header(body, lineno))
        elif kind == FOREIGN:
            tally.foreign = f"line {lineno}: {reason}"
            tally.records.clear()
            tally.headers.clear()
            _to_last_newline(tally, data, base)
            return None
    _seal_last(tally, data, base, last)
    return None


def _to_last_newline(tally: Tally, data: bytes, base: int) -> None:
    """Move a foreign file's tally past its last complete line (nothing in it is read)."""
    end = data.rfind(b"\n") + 1
    if end:
        tally.offset = base + end
        _seal_last(tally, data, base, data.rfind(b"\n", 0, end - 1) + 1)


def _seal_last(tally: Tally, data: bytes, base: int, start: int) -> None:
    """Seal the last complete line: the one of ``data`` (read from ``base``) from ``start`` to
    ``tally.offset``; ``start`` -1: none was read now, the seal stays that of the one before."""
    if start >= 0:
        tally.last = seal(data[start : tally.offset - base])
