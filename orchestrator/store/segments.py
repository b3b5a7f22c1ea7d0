"""Partials parsed for merging ("segments"), cached so an unchanged partial is never re-read.

A segment is what one partial contributes to the document: its attempt headers, the lines it
skipped and why, and each valid record already serialized exactly as the document holds it
(``texts``: ``json.dumps(doc, indent=1)`` at record depth, ``unit`` and ``attempt`` appended),
with its plan index, attempt, line and item id. The merger then only orders and concatenates text.
What each line is, ``partials.classify`` says, exactly as for ``read_partial``.

Segments are cached in ``SWEEP/merge-cache/<unit>.seg``, keyed by the partial's inode, size
and mtime. Partials are append-only, so when one has grown (same inode, the bytes just before
the parsed end unchanged) only its new lines are parsed. A torn or still-being-written last
line (no newline yet) is never cached: it is re-read on every merge until it is complete.
The cache is derived data: a missing, stale, damaged (CRC) or other-version file is rebuilt,
an unwritable cache directory is merely not used, and deleting the folder is always safe.
"""

from __future__ import annotations

import logging
import operator
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

from orchestrator.store.files import atomic_open, open_file, read_file
from orchestrator.store.lines import ReadHeader
from orchestrator.store.partials import (
    FOREIGN,
    HEADER,
    INVALID,
    RECORD,
    TORN,
    VERSION,
    Line,
    UnitItems,
    classify,
    loads,
    moot,
    read_header,
    starts_checked,
)
from orchestrator.store.partials import check_headers as partial_headers_problem
from orchestrator.store.recordlines import RECORD_PREFIX, Taken, judge, orjson_refuses
from orchestrator.store.texts import dumps, record_texts

log = logging.getLogger(__name__)

# The layout of a cached segment; a cache file of another version is rebuilt. This one: lines as
# partials.classify says, a skipped line as [line, why, item id or "", torn].
CACHE_VERSION = 4
CACHE_DIR = "merge-cache"
_SIG_BYTES = 64


@dataclass
class Segment:
    unit: str
    path: Path
    ino: int = 0
    size: int = 0
    mtime_ns: int = 0
    parsed: int = 0  # bytes consumed: through the last newline
    lines: int = 0  # lines consumed
    sig: str = ""  # hex of the bytes just before ``parsed``
    headers: list[ReadHeader] = field(default_factory=list)
    skipped: list[list[Any]] = field(default_factory=list)  # [line, why, item id or "", torn]
    foreign: str | None = None  # why the whole file must not be merged
    idx: list[int] = field(default_factory=list)  # plan index per record
    att: list[int] = field(default_factory=list)
    ln: list[int] = field(default_factory=list)
    err: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    texts: list[bytes] = field(default_factory=list)
    cached: bool = False  # came from the cache unchanged

    def __len__(self) -> int:
        return len(self.texts)


# ---------------------------------------------------------------------------- parsing


@dataclass
class _Found:
    """What one pass over a partial's new lines found, before it joins the segment."""

    done: int  # lines consumed: through the last newline, or through a line that makes the file foreign
    headers: list[ReadHeader] = field(default_factory=list)
    skipped: list[list[Any]] = field(default_factory=list)  # [line, why, item id or "", torn]
    foreign: str | None = None
    taken: Taken = field(default_factory=Taken)  # the record lines judged in bulk (``recordlines.judge``)
    records: list[tuple[int, int, str, dict[str, Any]]] = field(
        default_factory=list
    )  # (k, attempt, id, record): classify's
    stdlib: bool = False  # a record orjson cannot read, so cannot write as the document spells it


def _consume(seg: Segment, data: bytes, first_line: int, items: UnitItems, *, tail_ok: bool) -> tuple[int, int]:
    """Parse the lines of ``data`` into ``seg`` (``classify`` says what each line is, exactly
    as for ``read_partial``); returns (bytes, lines) consumed through the last newline. The
    unterminated tail, if any, is parsed too (it may be a finished line whose newline is not
    written yet) only when ``tail_ok``. Stops at the first line that makes the file foreign.
    A hot loop (a million lines at the scale of ``bench/merge``): start lines are checked all
    at once (``partials.starts_checked``), record lines in bulk (``recordlines.judge``: what it
    leaves, ``classify`` judges), and records become the segment's columns at the end."""
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" when data ends with one
    terminated = len(lines)
    if tail_ok and tail:
        lines.append(tail)
    starts_ok = starts_checked(data)  # then a start line after the first needs no parse (nor keeping)
    found = _read(lines, terminated, bool(seg.headers), first_line, items, starts_ok, bulk=True)
    if found is None:  # a line opening as a record's is none: every line in its turn
        found = _read(lines, terminated, bool(seg.headers), first_line, items, starts_ok, bulk=False)
    assert found is not None
    seg.headers += found.headers
    seg.skipped += found.skipped
    seg.foreign = found.foreign if found.foreign is not None else seg.foreign
    taken = found.taken if not found.records else _merged(found.taken, found.records, items.positions)
    if taken.ks:
        unit = seg.unit
        records = taken.records
        for rec, attempt in zip(records, taken.attempts, strict=True):
            rec["unit"] = unit
            rec["attempt"] = attempt
        seg.idx += taken.positions
        seg.att += taken.attempts
        seg.ln += [first_line + k for k in taken.ks]
        seg.err += ["error" in rec for rec in records]
        seg.ids += taken.ids
        seg.texts += record_texts(records, stdlib=found.stdlib, flat=not taken.nested)  # every layout is checked
    done = found.done
    return sum(map(len, lines[:done])) + done, done


def _read(
    lines: list[bytes], terminated: int, seen: bool, first_line: int, items: UnitItems, starts_ok: bool, *, bulk: bool
) -> _Found | None:
    """One pass over ``lines`` (the first ``terminated`` of them ended by a newline). ``bulk``:
    record lines after a worker header are judged together at the end (``recordlines.judge``,
    then ``classify`` for what it leaves); None where one of them turns out not to be a record
    line (a header, say), whose place in the order matters: read again without ``bulk``."""
    found = _Found(terminated)
    deferred: list[int] = []
    for k, raw in enumerate(lines):
        if seen and bulk and raw.startswith(RECORD_PREFIX):
            deferred.append(k)
            continue
        if starts_ok and seen and k and raw.startswith(b'{"start":'):
            continue
        line = classify(raw, k < terminated, seen, items)
        if not _keep(found, line, k, first_line, raw):
            break
        seen = seen or line[0] == HEADER
    if deferred:
        found.taken, left = judge(lines, deferred, items.positions)
        for k in left:
            line = classify(lines[k], k < terminated, True, items)
            if line[0] not in (RECORD, TORN, INVALID):
                return None
            _keep(found, line, k, first_line, lines[k])
        found.skipped.sort(key=_FIRST)
    return found


_FIRST = operator.itemgetter(0)


def _merged(bulk: Taken, records: list[tuple[int, int, str, dict[str, Any]]], positions: Mapping[str, int]) -> Taken:
    """The lines ``judge`` took and those ``classify`` took (``records``), as one ``Taken`` in
    line order."""
    rows = [*zip(bulk.ks, bulk.attempts, bulk.ids, bulk.records, strict=True), *records]
    rows.sort(key=_FIRST)
    merged = Taken(nested=True)  # classify's records: their layouts are not looked at here
    for k, attempt, iid, rec in rows:
        merged.ks.append(k)
        merged.attempts.append(attempt)
        merged.ids.append(iid)
        merged.records.append(rec)
        merged.positions.append(positions[iid])
    return merged


def _keep(found: _Found, line: Line, k: int, first_line: int, raw: bytes) -> bool:
    """Add the classified line ``k`` to ``found``; False where it makes the file foreign (the pass stops)."""
    kind, reason, iid, attempt, rec = line
    if kind == RECORD and rec is not None:
        found.records.append((k, attempt, iid, rec))
        found.stdlib = found.stdlib or orjson_refuses(raw)
    elif kind == HEADER and rec is not None:
        found.headers.append(read_header(rec, first_line + k))
    elif kind == TORN or kind == INVALID:
        found.skipped.append([first_line + k, reason, iid, kind == TORN])
    elif kind == FOREIGN or kind == VERSION:
        found.foreign = f"line {first_line + k}: {reason}"
        found.done = min(found.done, k + 1)
        return False
    return True


def check_headers(seg: Segment, fingerprint: str, env: Mapping[str, Any] | None) -> str | None:
    """Why the partial's headers say it is not this sweep's, or None (``partials.check_headers``)."""
    return partial_headers_problem(seg.headers, seg.unit, fingerprint, env)


def open_skipped(seg: Segment, unit_items: int | None) -> list[list[Any]]:
    """The skipped lines still worth a warning: every invalid line, and the torn ones whose
    item has not been redone since (``partials.moot``)."""
    if not seg.skipped:
        return []
    recorded = set(seg.ids)
    return [s for s in seg.skipped if not (len(s) > 3 and s[3] and moot(s[2], recorded, unit_items))]


# ---------------------------------------------------------------------------- cache


def _cache_path(sweep_root: Path, unit: str) -> Path:
    return sweep_root / CACHE_DIR / f"{unit}.seg"


def _store(sweep_root: Path, seg: Segment) -> None:
    payload = b"".join(seg.texts)
    meta = {
        "v": CACHE_VERSION,
        "unit": seg.unit,
        "ino": seg.ino,
        "size": seg.size,
        "mtime_ns": seg.mtime_ns,
        "parsed": seg.parsed,
        "lines": seg.lines,
        "sig": seg.sig,
        "headers": seg.headers,
        "skipped": seg.skipped,
        "foreign": seg.foreign,
        "payload": len(payload),
        "crc": zlib.crc32(payload),
    }
    arrays = {
        "idx": seg.idx,
        "att": seg.att,
        "ln": seg.ln,
        "err": [int(e) for e in seg.err],
        "ids": seg.ids,
        "len": [len(t) for t in seg.texts],
    }
    try:
        with atomic_open(_cache_path(sweep_root, seg.unit), "wb", fsync=False) as f:
            f.write(dumps(meta) + b"\n")
            f.write(dumps(arrays) + b"\n")
            f.write(payload)
    except OSError as exc:  # a read-only sweep directory, a full disk: merge without the cache
        uncached(sweep_root / CACHE_DIR, exc)


UNCACHED: dict[Path, str] = {}  # what this process said of each cache folder it cannot write


def uncached(folder: Path, exc: OSError) -> None:
    """Say once per process that the merge cache ``folder`` takes no file (``exc``): every
    merge then parses every partial again."""
    if folder in UNCACHED:
        return
    UNCACHED[folder] = (
        f"the merge cache {folder} cannot be written ({exc.strerror or exc}): this merge, and every one until it "
        "can, parses every partial again (it is safe to delete)"
    )
    log.warning("%s", UNCACHED[folder])


def current(sweep_root: Path, unit: str, path: Path) -> bool:
    """Whether the merge cache holds ``unit``'s partial at ``path`` as it is now, all of it
    parsed (its first line alone read: the payload's CRC is checked when it is loaded)."""
    try:
        with open_file(_cache_path(sweep_root, unit)) as f:
            meta = loads(f.readline())
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or meta.get("v") != CACHE_VERSION or meta.get("unit") != unit:
        return False
    stamp = (meta.get("ino"), meta.get("size"), meta.get("mtime_ns"), meta.get("parsed"))
    return stamp == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_size)


def _load(sweep_root: Path, unit: str, path: Path) -> Segment | None:
    cpath = _cache_path(sweep_root, unit)
    try:
        data = read_file(cpath)
    except OSError:
        return None
    try:
        nl1 = data.index(b"\n")
        nl2 = data.index(b"\n", nl1 + 1)
        meta = loads(data[:nl1])
        if meta.get("v") != CACHE_VERSION or meta.get("unit") != unit:
            return None
        payload = memoryview(data)[nl2 + 1 :]
        if len(payload) != meta["payload"] or zlib.crc32(payload) != meta["crc"]:
            raise ValueError("payload length or CRC mismatch")
        del payload
        arrays = loads(data[nl1 + 1 : nl2])
        offs = list(accumulate(arrays["len"], initial=nl2 + 1))
        if offs[-1] != len(data):
            raise ValueError("record lengths do not add up")
        if any(len(arrays[k]) != len(arrays["len"]) for k in ("idx", "att", "ln", "err", "ids")):
            raise ValueError("per-record arrays of different lengths")
        seg = Segment(
            unit,
            path,
            ino=meta["ino"],
            size=meta["size"],
            mtime_ns=meta["mtime_ns"],
            parsed=meta["parsed"],
            lines=meta["lines"],
            sig=meta["sig"],
            headers=meta["headers"],
            skipped=meta["skipped"],
            foreign=meta["foreign"],
            idx=arrays["idx"],
            att=arrays["att"],
            ln=arrays["ln"],
            err=arrays["err"],
            ids=arrays["ids"],
            texts=[data[a:b] for a, b in pairwise(offs)],
        )
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        log.warning("merge cache %s is damaged (%s); rebuilding it from %s", cpath, exc, path)
        return None
    return seg


def segment(
    sweep_root: Path, unit: str, path: Path, *, use_cache: bool = True, items: UnitItems | None = None
) -> Segment:
    """The partial of ``unit`` at ``path`` as a segment, from the cache where it is current.
    ``items``: the unit's items, where the caller read them already."""
    try:
        f = open_file(path)
    except FileNotFoundError:
        return Segment(unit, path)
    with f:
        st = os.fstat(f.fileno())
        seg = _load(sweep_root, unit, path) if use_cache else None
        if seg is not None and seg.ino == st.st_ino and seg.size == st.st_size and seg.mtime_ns == st.st_mtime_ns:
            if seg.parsed == st.st_size:
                seg.cached = True
                return seg
        start = 0
        # Partials only grow: same size but another mtime means rewritten, so read it all.
        grown = seg is not None and (st.st_size > seg.size or st.st_mtime_ns == seg.mtime_ns)
        if seg is not None and grown and seg.ino == st.st_ino and st.st_size >= seg.parsed and seg.sig:
            f.seek(max(0, seg.parsed - _SIG_BYTES))
            if f.read(min(seg.parsed, _SIG_BYTES)).hex() == seg.sig:
                start = seg.parsed
        if start == 0 or seg is None:
            seg = Segment(unit, path)
        f.seek(start)
        data = f.read()
        after = os.fstat(f.fileno())  # mtime of what was read at the latest: a later append is seen as growth
    seg.path = path
    seg.cached = False
    seg.ino = st.st_ino
    seg.size = start + len(data)
    seg.mtime_ns = after.st_mtime_ns
    items = items if items is not None else UnitItems(sweep_root, unit)
    consumed, lines = _consume(seg, data, seg.lines + 1, items, tail_ok=False)
    seg.parsed = start + consumed
    seg.lines += lines
    if seg.parsed:
        if consumed >= _SIG_BYTES or start == 0:
            seg.sig = data[max(0, consumed - _SIG_BYTES) : consumed].hex()
        else:
            with open_file(path) as g:
                g.seek(max(0, seg.parsed - _SIG_BYTES))
                seg.sig = g.read(min(seg.parsed, _SIG_BYTES)).hex()
    if use_cache and seg.foreign is None and (start != seg.parsed or start == 0):
        _store(sweep_root, seg)
    tail = data[consumed:]
    if tail.strip() and seg.foreign is None:
        _consume(seg, tail, seg.lines + 1, items, tail_ok=True)
    return seg
