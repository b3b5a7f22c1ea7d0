"""A unit's progress as merge would see it, cheaply: what ``status`` (and ``wait``, ``run``'s
progress line) count.

A finished unit's completion marker vouches for it while it still matches its partial: the
worker stamps the partial's inode, size and mtime and its record and error counts into the
marker, so one stat tells whether the partial changed since (truncated, appended to, replaced,
copied over from another sweep). Any other partial is read with the one classifier every
reader uses (``partials.classify``, through ``tally``: a partial counted before is read from
where the last count stopped) and its headers checked as the merger checks them
(``partials.check_headers``), so a torn line, an invalid record or another sweep's partial is
never counted: status and merge agree by construction.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import PartialError
from orchestrator.store.markers import CompletionMarker, read_marker, trusted_block
from orchestrator.store.partials import check_headers
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.tally import Book, count_partial


@dataclass
class Counted:
    """What merge would accept from one unit's partial: records, error records, and whether a
    completion marker vouches for it; ``detail`` says why a marker or the partial was not
    trusted; ``gpu``: the GPU the marker says the unit ran on, or its last worker's header."""

    done: int = 0
    errors: int = 0
    complete: bool = False
    mtime: float | None = None
    detail: str | None = None
    gpu: str | None = None
    stat: tuple[int, int] | None = None  # the partial's size and mtime (ns), where it exists


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


_UNIT = "\0"  # a unit id no unit has: where it lands in a path, any unit's id goes


_NAMES: dict[Path, tuple[str, str]] = {}


def _file_names(sd: SweepDir) -> tuple[str, str]:
    """Where a unit's partial and marker lie, as strings with ``_UNIT`` for the unit id, from
    ``SweepDir``'s own rules: a string replace per unit instead of two ``Path`` objects built
    (on 10,000 units, a sizeable share of what status costs)."""
    names = _NAMES.get(sd.root)
    if names is None:
        names = _NAMES[sd.root] = (os.fspath(sd.partial_path(_UNIT)), os.fspath(sd.marker_path(_UNIT)))
    return names


def count_unit(
    sd: SweepDir,
    uid: str,
    total: int,
    has_marker: bool,
    fingerprint: str,
    env: Mapping[str, Any] | None,
    book: Book | None = None,
) -> Counted:
    """A unit's progress as merge would see it. A marker that still matches its partial says it
    at the cost of one stat; otherwise the partial is read with the classifier every reader
    uses (``tally.count_partial``: only what was appended since its last count) and its
    headers checked as the merger checks them, so a torn line, an invalid one, or a partial
    of another sweep is never counted. ``book``: the sweep's tally file, where another process
    counted the partial before."""
    partial_file, marker_file = _file_names(sd)
    path = partial_file.replace(_UNIT, uid)
    st = _stat(path)
    marker = read_marker(marker_file.replace(_UNIT, uid)) if has_marker else None
    gpu = marker.get("gpu") if marker is not None else None
    block = trusted_block(marker, st)
    stat = (st.st_size, st.st_mtime_ns) if st is not None else None
    if block is not None:
        return Counted(block["records"], block["errors"], True, st.st_mtime if st else None, gpu=gpu, stat=stat)
    c = Counted(mtime=st.st_mtime if st else None, gpu=gpu, stat=stat)
    stale = "its completion marker is stale (the partial changed since the unit finished)"
    if st is None:
        c.detail = stale if has_marker else None
        return c
    try:
        content = count_partial(path, sd.root, uid, book)
    except PartialError as exc:
        c.detail = f"its partial is not readable here: {exc.message}"
        return c
    why = content.foreign or check_headers(content.headers, uid, fingerprint, env)
    if why is not None:
        c.detail = f"its partial is not this sweep's ({why}); merging moves it to quarantine/"
        return c
    c.done = min(total, content.records)
    c.errors = content.errors
    if c.gpu is None and content.headers:  # no marker (failed, cancelled, running): its last worker's GPU
        c.gpu = content.headers[-1].get("gpu")
    if has_marker and not _same_counts(marker, content.records, content.errors, st.st_size):
        c.detail = stale  # a partial copied (new inode) but as the unit left it is not stale
    return c


def _same_counts(marker: CompletionMarker | None, records: int, errors: int, size: int) -> bool:
    """Whether the marker's partial block counts what the partial holds now, at the size it had."""
    block = marker.get("partial") if marker is not None else None
    if not isinstance(block, dict) or not isinstance(block.get("stat"), list) or len(block["stat"]) != 3:
        return False
    return block.get("records") == records and block.get("errors") == errors and block["stat"][1] == size
