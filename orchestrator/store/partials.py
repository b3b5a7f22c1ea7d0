"""Partial files: one per unit, appended line by line by that unit's worker only.

Each line is one JSON object, flushed and fsynced when written:

    {"header": {...}}                    a worker attempt started (device, env, attempt, job)
    {"start": ITEM_ID, "attempt": N}     a config is about to be compiled and timed;
                                         ``"alone": true`` when no other config was in flight
                                         (or its compile process died with it: it starts again)
    {"abandon": ITEM_ID, "attempt": N}   the worker gave that config up on purpose (Ctrl-C,
                                         SIGTERM, preemption, time-limit warning), not its fault
    {"hung": ITEM_ID, "attempt": N}      the time limit came while the config was in flight and
                                         the worker did not reach a stop (it counts as a death)
    {"id": ITEM_ID, "attempt": N, "record": {...}}   a finished record

One classifier (``classify``) says what each line is, for every reader: ``read_partial``
(the worker skipping what is recorded, resume finding what is missing) and the merger's
incremental reader (``segments``), so resume and merge never disagree on what is recorded.

A worker stopped mid-write, or one whose disk filled, leaves a torn last line; readers skip
it with a warning naming the file and line (a merge says it once: ``torn_said``), and the
item is redone. A record line whose record does not fit the
schema's record layout (a field missing, unknown or of the wrong type, or an id that is not
the hash of its identity), whose attempt is not an integer, or whose item is not one of its
unit's, is skipped the same way, so the worker redoes that item too rather than trusting
it. A file whose first line is not a (possibly torn) worker header, or with a header that
is not a worker's, was not written by a tilesweep worker: nothing in it counts, and the
merger moves it to quarantine. ``start`` lines without a record or an ``abandon`` are the
attempts that died with a config in flight: each such config is a suspect (the next attempt
runs it alone); only a death while it was alone counts against it (``deaths``), so a config
that keeps killing its worker is given up on, and one that merely shared a window with the
culprit, or was in flight when someone killed the worker, is not.

What a valid record is, ``layouts.check_record`` says; how each line is written (its typed
form, its one builder, the appending writer), ``lines``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from kernels.spelling import as_json
from orchestrator.errors import PartialError
from orchestrator.spec.schema import SCHEMA_VERSION
from orchestrator.store import unitfile
from orchestrator.store.envfile import measured_in
from orchestrator.store.files import read_file
from orchestrator.store.jsonline import loads
from orchestrator.store.layouts import check_record
from orchestrator.store.lines import ReadHeader
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- line parsing


def is_torn_fragment(raw: bytes) -> bool:
    """Whether an unparsable line looks like a cut-off line of ours (not foreign bytes)."""
    return raw.startswith(b'{"')


def iter_lines(data: bytes, lineno: int = 1) -> Iterator[tuple[int, int, bytes, bool]]:
    """(line number, end offset, bytes, terminated) for each line of ``data``."""
    pos = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        if nl < 0:
            yield lineno, n, data[pos:], False
            return
        yield lineno, nl + 1, data[pos:nl], True
        pos = nl + 1
        lineno += 1


# ---------------------------------------------------------------------------- the classifier

# What a line is. Every reader of partials (``read_partial`` for the worker and resume, the
# merger's ``segments``) classifies lines with ``classify`` alone, so they always agree on
# what a partial records, what they skip, and which files they refuse.
HEADER = "header"  # a worker attempt started: ``body`` is the header object
START = "start"  # a config is about to be compiled and timed: ``id``
ABANDON = "abandon"  # the worker gave that config up on purpose: ``id``
HUNG = "hung"  # the time limit came while that config was in flight: ``id``
ALONE = "alone"  # the ``reason`` of a start line whose config was the only one in flight
RECORD = "record"  # a finished record: ``id``, ``attempt``, ``body`` (canonical key order)
BLANK = "blank"  # an empty line: nothing
TORN = "torn"  # a cut-off line (its writer stopped mid-write, its disk full, or still writing it): skipped, redone
# what a reader says of a torn line: the file's last (no newline yet), or one a later writer ended
INCOMPLETE_LAST = (
    "the last line, incomplete: the writer was stopped or the disk was full (or it is still being written)"
)
INCOMPLETE = "an incomplete line: the writer was stopped or the disk was full"
INVALID = "invalid"  # a line that cannot be trusted (a record off the layout, ...): skipped, redone
FOREIGN = "foreign"  # the file is not a tilesweep worker's partial: nothing in it counts
VERSION = "version"  # a header of another partial schema version: nothing in it counts

_HEADER_START = b'{"header":'


# One classified line: (kind, reason, item id, attempt, body). ``reason`` says why a torn,
# invalid, foreign or version line is one; ``id`` is set for record, start and abandon lines,
# ``attempt`` for records, ``body`` for records and headers. A plain tuple, not a NamedTuple:
# building one per line is a fifth of the cost of a NamedTuple's, on millions of lines.
Line = tuple[str, str, str, int, dict[str, Any] | None]

_BLANK: Line = (BLANK, "", "", 0, None)


class UnitItems:
    """The items of one unit (id -> plan index): a record of any other item is invalid, so
    resume never counts as recorded what the merger will not merge."""

    def __init__(self, sweep_root: Path, unit: str) -> None:
        self.unit = unit
        self.path = SweepDir(sweep_root).unit_path(unit)

    @cached_property
    def positions(self) -> dict[str, int]:
        """Read from the unit file when first needed (a partial without records never reads
        it); a missing one, or one that does not match ``units.json``, means a damaged sweep
        directory (``unitfile``)."""
        return {iid: index for index, iid in unitfile.read_items(self.path.parent.parent, self.unit)}

    @classmethod
    def of_partial(cls, path: Path) -> UnitItems | None:
        """The items of the unit whose partial ``path`` is, where it lies in a sweep directory
        (``SWEEP/partials/<unit>.jsonl`` next to ``SWEEP/units/``); None elsewhere."""
        sd = SweepDir(path.parent.parent)
        unit = path.name.removesuffix(".jsonl")
        if sd.partial_path(unit) != path or not sd.unit_path(unit).parent.is_dir():
            return None
        return cls(sd.root, unit)


def classify(raw: bytes, terminated: bool, seen_header: bool, items: UnitItems | None = None) -> Line:
    """What the line ``raw`` (without its newline) of a partial is.

    ``terminated``: its newline was written (an unterminated last line that parses is a finished
    line whose newline is not written yet). ``seen_header``: a worker header precedes it in the
    file; only a (possibly torn) header may come first, anything else there means the file was
    not written by a tilesweep worker. ``items``: the unit's items, when known.
    """
    try:
        obj = loads(raw)
    except ValueError:  # blank lines too: checked only here, off the path of the millions of good lines
        obj = None
    if type(obj) is not dict:
        return _not_an_object(raw, terminated, seen_header)
    if "record" in obj:
        if not seen_header:
            return (FOREIGN, "a record line precedes any worker header: not written by a tilesweep worker", "", 0, None)
        iid: Any = obj.get("id")
        rec: Any = obj["record"]
        attempt: Any = obj.get("attempt")
        why, order = check_record(iid, rec)
        if why is None and type(attempt) is not int:
            why = "attempt is not an integer"
        if why is None and items is not None and iid not in items.positions:
            why = f"item {iid} is not an item of unit {items.unit}"
        if why is not None:
            return (INVALID, f"invalid record ({why})", "", 0, None)
        return (RECORD, "", iid, attempt, rec if order is None else {k: rec[k] for k in order})
    if "header" in obj:
        return _header(obj["header"])
    kind = START if "start" in obj else ABANDON if "abandon" in obj else HUNG if "hung" in obj else None
    if not seen_header:
        what = "not a tilesweep partial line" if kind is None else f"a {kind} line"
        return (FOREIGN, f"{what} precedes any worker header: not written by a tilesweep worker", "", 0, None)
    if kind is None:
        return (INVALID, "not a tilesweep partial line", "", 0, None)
    if type(obj[kind]) is not str:
        return (INVALID, f"the item id of a {kind} line is not a string", "", 0, None)
    at = obj.get("attempt")
    return (
        kind,
        ALONE if kind == START and obj.get("alone") is True else "",
        obj[kind],
        at if type(at) is int else 0,
        None,
    )


# A line that opens as a start line but is not one as the worker writes it (``lines.start_line``),
# newline included: what ``classify`` calls ``START``. ``starts_checked`` looks for one in one scan.
_ODD_START = re.compile(rb'\n\{"start":(?!"[0-9a-f]{16}","attempt":(?:0|[1-9][0-9]{0,17})(?:,"alone":true)?\}\n)')


def starts_checked(data: bytes) -> bool:
    """Whether every line of ``data`` after its first that opens as a start line is a start
    line as the worker writes it, newline included: ``classify`` (after a worker header) calls
    each of them ``START``, so a reader that keeps nothing of a start line (the merger) may
    skip them unparsed. One regex scan for all of them instead of a parse each: about half a
    partial's lines are start lines."""
    return _ODD_START.search(data) is None


def _not_an_object(raw: bytes, terminated: bool, seen_header: bool) -> Line:
    if not raw.strip():
        return _BLANK
    if not seen_header and not (_HEADER_START.startswith(raw) or raw.startswith(_HEADER_START)):
        # only a worker's first line, its header, can be torn before any header
        return (FOREIGN, "neither JSON nor a torn worker header, and no worker header precedes it", "", 0, None)
    if not terminated:
        return (TORN, INCOMPLETE_LAST, torn_item(raw), 0, None)
    if is_torn_fragment(raw):
        return (TORN, INCOMPLETE, torn_item(raw), 0, None)
    return (INVALID, "not a tilesweep partial line", "", 0, None)


_TORN_ITEM = re.compile(rb'\{"(?:id|start|abandon|hung)":"([0-9a-f]{16})"')


def torn_item(raw: bytes) -> str:
    """The item a torn line was about, where the cut left its id whole ("" otherwise)."""
    m = _TORN_ITEM.match(raw)
    return m.group(1).decode() if m else ""


def moot(iid: str, recorded: Collection[str], unit_items: int | None) -> bool:
    """Whether a torn line no longer matters: its item has been redone (a record of it follows),
    or, where the cut hid which item it was, every item of its unit is recorded. Warnings about
    such lines would only alarm: they stop once the item is redone."""
    if iid:
        return iid in recorded
    return unit_items is not None and len(recorded) >= unit_items


def _header(header: Any) -> Line:
    if type(header) is not dict:
        return (INVALID, "header is not an object", "", 0, None)
    if header.get("schema") != SCHEMA_VERSION:
        why = f"partial schema version {as_json(header.get('schema'))}, this tilesweep reads {SCHEMA_VERSION}"
        return (VERSION, f"{why}; merge it with the tilesweep version that wrote it", "", 0, None)
    if type(header.get("attempt")) is not int or not isinstance(header.get("started"), (str, type(None))):
        return (FOREIGN, "a worker header without an integer attempt and a start time", "", 0, None)
    return (HEADER, "", "", 0, header)


def read_header(body: dict[str, Any], lineno: int) -> ReadHeader:
    """The body of a header line (``classify``'s ``HEADER``) as readers hold it, with its line."""
    return cast(ReadHeader, {"line": lineno, **body})


def check_headers(
    headers: Sequence[ReadHeader], unit: str, fingerprint: str, env: Mapping[str, Any] | None
) -> str | None:
    """Why a partial's worker headers say it is not this sweep's unit's, or None: written for
    another spec, another unit, or measured in another environment. (Whether a header is a
    worker's header of this schema at all, ``classify`` already said.) The merger quarantines
    such a partial; status counts nothing in it; the worker moves it aside before appending."""
    for h in headers:
        where = f"line {h.get('line')}" if "line" in h else f"the header of attempt {h.get('attempt')}"
        if h.get("sweep") != fingerprint:
            theirs, ours = as_json(h.get("sweep")), as_json(fingerprint)
            return f"{where}: written for another spec (fingerprint {theirs}, this sweep's is {ours})"
        if h.get("unit") != unit:
            return f"{where}: written for unit {as_json(h.get('unit'))}, not {as_json(unit)}"
        if env is not None and h.get("env") != env:
            return f"{where}: measured in {measured_in(h.get('env'), env, "this sweep's")}"
    return None


def log_skipped(path: Path, lineno: int, why: str) -> None:
    """The one warning for a skipped line, whichever reader skipped it."""
    log.warning("%s line %d: %s; skipped (resume redoes its item where no other line records it)", path, lineno, why)


# ---------------------------------------------------------------------------- reading one partial


@dataclass
class PartialContent:
    """What a partial records, as the worker and resume see it (the merger sees the same)."""

    path: Path
    headers: list[ReadHeader] = field(default_factory=list)
    records: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # id -> (attempt, record)
    starts: Counter[str] = field(default_factory=Counter)  # starts neither recorded nor abandoned
    deaths: Counter[str] = field(default_factory=Counter)  # of those, the ones alone in flight
    hangs: Counter[str] = field(default_factory=Counter)  # of those, the ones the time limit found hung
    torn: list[int] = field(default_factory=list)  # 1-based line numbers skipped (torn or invalid)
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line, why) for each skipped line
    torn_items: dict[int, str] = field(default_factory=dict)  # torn line -> its item ("" where the cut hid it)
    foreign: str | None = None  # why nothing in the file counts (the merger quarantines it)

    @property
    def attempts(self) -> int:
        return len(self.headers)


def read_partial(path: Path, items: UnitItems | None = None, *, warn: bool = True) -> PartialContent:
    """Parse a partial file; a missing file is an empty partial.

    Torn and invalid lines are skipped with a warning naming the file and line (``warn``), so
    their items count as not done (the worker redoes them); a torn line whose item has been
    redone since is skipped without a word (``moot``). A record of an item not in ``items``
    (default: the unit's items, where the partial lies in a sweep directory) is invalid too.
    A file that is not a worker's partial counts as empty, with ``foreign`` saying why and a
    warning (the merger quarantines it). Another schema version raises ``PartialError``: its
    records are real, for the tilesweep version that wrote it, so it is neither redone nor
    appended to by this one.
    """
    content = PartialContent(Path(path))
    try:
        data = read_file(content.path)
    except FileNotFoundError:
        return content
    if items is None:
        items = UnitItems.of_partial(content.path)
    alone: set[tuple[str, int]] = set()
    for lineno, _, raw, terminated in iter_lines(data):
        kind, reason, iid, attempt, body = classify(raw, terminated, bool(content.headers), items)
        if kind == RECORD and body is not None:
            content.records[iid] = (attempt, body)
        elif kind == START:
            content.starts[iid] += 1
            alone.discard((iid, attempt))  # started again (its compile process died): abandon/hung mean the new start
            if reason == ALONE:
                content.deaths[iid] += 1
                alone.add((iid, attempt))
        elif kind == ABANDON:
            content.starts[iid] -= 1
            if (iid, attempt) in alone:
                content.deaths[iid] -= 1
                alone.discard((iid, attempt))
        elif kind == HUNG:
            content.hangs[iid] += (iid, attempt) in alone
        elif kind == HEADER and body is not None:
            content.headers.append(read_header(body, lineno))
        elif kind == TORN or kind == INVALID:
            content.torn.append(lineno)
            content.problems.append((lineno, reason))
            if kind == TORN:
                content.torn_items[lineno] = iid
        elif kind == VERSION:
            raise PartialError(f"{path} line {lineno}: {reason}")
        elif kind == FOREIGN:
            why = f"line {lineno}: {reason}"
            if warn:
                log.warning("%s %s; nothing in it counts as recorded (merging moves it to quarantine/)", path, why)
            return PartialContent(content.path, foreign=why)
    if warn:
        n_items = len(items.positions) if items is not None and content.torn_items else None
        for lineno, reason in content.problems:
            if lineno not in content.torn_items or not moot(content.torn_items[lineno], content.records, n_items):
                log_skipped(content.path, lineno, reason)
    return content
