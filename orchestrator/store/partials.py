"""Partial files: one per unit, appended line by line by that unit's worker only.

Each line is one JSON object, flushed and fsynced when written:

    {"header": {...}}                    a worker attempt started (device, env, attempt, job)
    {"start": ITEM_ID, "attempt": N}     a config is about to be compiled and timed
    {"abandon": ITEM_ID, "attempt": N}   the worker gave that config up on purpose
                                         (preemption or time-limit warning), not its fault
    {"id": ITEM_ID, "attempt": N, "record": {...}}   a finished record

A worker killed mid-write leaves a torn last line; readers skip it with a warning naming
the file and line, and the item is redone. A record line whose record does not fit the
schema's record layout (a field missing, unknown or of the wrong type, or an id that is not
the hash of its identity) is skipped the same way, so the worker redoes that item too rather
than trusting it. ``start`` lines without a record or an ``abandon`` count the attempts that
died on a config, so one that keeps killing its worker is given up on.

Record validation is keyed on a record's layout (its key order, value types, mode and config
kind): a sweep has a handful of layouts, so checking a million records costs one tuple build
and one dict look-up each, not a schema walk.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.errors import PartialError
from orchestrator.spec.model import SCHEMA_VERSION
from orchestrator.spec.records import (
    EXTRA_RECORD_FIELDS,
    FIELD_TYPES,
    IDENTITY_FIELDS,
    RESULT_FIELDS,
    config_fields,
    item_id,
)

try:  # optional: ~2.5x faster per line here (bench/merge.py); results are identical
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- record layout

# Extras a worker writes; ``unit`` and ``attempt`` are added by the merger from the line.
WORKER_EXTRAS = tuple(k for k in EXTRA_RECORD_FIELDS if k not in ("unit", "attempt"))
MODES_CONFIGS = {("fwd", "auto"), ("fwd", "forced"), ("fwd_bwd", "auto"), ("fwd_bwd", "forced")}

# layout key -> None (valid, canonical key order) | tuple of keys (valid, reorder) | str (why invalid)
_LAYOUTS: dict[tuple, Any] = {}


def _judge_layout(keys: tuple[str, ...], types: tuple[type, ...], mode: Any, config: Any) -> Any:
    if (mode, config) not in MODES_CONFIGS:
        return f"mode/config {mode!r}/{config!r} is not one of fwd|fwd_bwd and auto|forced"
    present = dict(zip(keys, types, strict=True))
    if len(present) != len(keys):
        return "a field appears twice"
    allowed = IDENTITY_FIELDS + config_fields(mode, config) + ("error",) + RESULT_FIELDS + WORKER_EXTRAS
    unknown = [k for k in keys if k not in allowed]
    if unknown:
        return f"unknown field(s) {', '.join(unknown)} for a {mode} {config} record"
    required = IDENTITY_FIELDS + config_fields(mode, config) + (() if "error" in present else RESULT_FIELDS)
    missing = [k for k in required if k not in present]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    bad = [f"{k} is {t.__name__}" for k, t in present.items() if t not in FIELD_TYPES[k]]
    if bad:
        return "wrong type: " + ", ".join(bad)
    order = tuple(k for k in allowed if k in present)
    return None if order == keys else order


def check_record(iid: Any, rec: Any) -> tuple[str | None, tuple[str, ...] | None]:
    """(why the record is unusable or None, canonical key order if it must be reordered)."""
    if not isinstance(rec, dict):
        return "record is not an object", None
    keys = tuple(rec)
    lk = (keys, tuple(map(type, rec.values())), rec.get("mode"), rec.get("config"))
    try:
        verdict = _LAYOUTS[lk]
    except KeyError:
        verdict = _LAYOUTS[lk] = _judge_layout(*lk)
    except TypeError:  # an unhashable mode/config value
        return "mode/config is not a string", None
    if isinstance(verdict, str):
        return verdict, None
    if not isinstance(iid, str) or item_id(rec) != iid:
        return f"id {iid!r} is not the id of the record's identity fields", None
    return None, verdict


# ---------------------------------------------------------------------------- line parsing


def loads(raw: bytes) -> Any:
    """Parse one line; orjson when installed, the stdlib for what orjson refuses (NaN)."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except ValueError:
            pass
    return json.loads(raw)


def is_torn_fragment(raw: bytes) -> bool:
    """Whether an unparsable line looks like a cut-off line of ours (not foreign bytes)."""
    return raw.startswith(b'{"')


def iter_lines(data: bytes, lineno: int = 1) -> Iterator[tuple[int, int, bytes, bool]]:
    """(line number, end offset, bytes, terminated) for each line of ``data``."""
    pos, n = 0, len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        if nl < 0:
            yield lineno, n, data[pos:], False
            return
        yield lineno, nl + 1, data[pos:nl], True
        pos = nl + 1
        lineno += 1


@dataclass
class PartialContent:
    path: Path
    headers: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # id -> (attempt, record)
    starts: Counter = field(default_factory=Counter)
    torn: list[int] = field(default_factory=list)  # 1-based line numbers skipped (torn or invalid)
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line, why) for each skipped line

    @property
    def attempts(self) -> int:
        return len(self.headers)


def read_partial(path: Path) -> PartialContent:
    """Parse a partial file; a missing file is an empty partial.

    Torn and invalid lines are skipped with a warning naming the file and line, so their
    items count as not done (the worker redoes them). An unknown schema version raises
    ``PartialError``: such a file must not be appended to or merged by this version.
    """
    content = PartialContent(Path(path))
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return content

    def skip(lineno: int, why: str) -> None:
        content.torn.append(lineno)
        content.problems.append((lineno, why))
        log.warning("%s line %d: %s; skipped, its item will be redone", path, lineno, why)

    for lineno, _, raw, terminated in iter_lines(data):
        if not raw.strip():
            continue
        try:
            obj = loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            skip(
                lineno,
                "torn or not JSON (a worker killed mid-write?)"
                if not terminated or is_torn_fragment(raw)
                else "not a tilesweep partial line",
            )
            continue
        if "record" in obj:
            rec, iid, attempt = obj["record"], obj.get("id"), obj.get("attempt", 0)
            why, order = check_record(iid, rec)
            if why is None and type(attempt) is not int:
                why = "attempt is not an integer"
            if why is not None:
                skip(lineno, f"invalid record ({why})")
                continue
            if order is not None:
                rec = {k: rec[k] for k in order}
            content.records[iid] = (attempt, rec)
        elif "start" in obj:
            content.starts[obj["start"]] += 1
        elif "abandon" in obj:
            content.starts[obj["abandon"]] -= 1
        elif "header" in obj:
            header = obj["header"]
            if not isinstance(header, dict):
                skip(lineno, "header is not an object")
                continue
            if header.get("schema") != SCHEMA_VERSION:
                raise PartialError(
                    f"{path} line {lineno}: partial schema version {header.get('schema')!r}, this tilesweep reads "
                    f"{SCHEMA_VERSION}; merge it with the tilesweep version that wrote it"
                )
            content.headers.append(header)
        else:
            skip(lineno, "not a tilesweep partial line")
    return content


_RECORD_AT_START = b'{"id":'
_RECORD_LINE = b'\n{"id":'
_ERROR_FIELD = b',"error":'  # compact JSON: a key is preceded by a comma, a string value's quotes are escaped


def count_partial(path: os.PathLike[str] | str) -> tuple[int, int, float | None]:
    """(record lines, error records, mtime) of a partial, counted on bytes in one read,
    without parsing JSON (status on sweeps of thousands of units). A record line starts
    with ``{"id":``; an error record holds the key ``"error"``, written compactly."""
    try:
        with open(path, "rb") as f:
            data = f.read()
            mtime = os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return 0, 0, None
    records = data.count(_RECORD_LINE) + data.startswith(_RECORD_AT_START)
    return records, data.count(_ERROR_FIELD), mtime


def count_records(path: os.PathLike[str] | str) -> int:
    """Records in a partial without parsing JSON."""
    return count_partial(path)[0]


class PartialWriter:
    """Appends lines to one unit's partial; each line is flushed and fsynced."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f: IO[str] = open(path, "a+", encoding="utf-8")
        # A previous attempt killed mid-line leaves no trailing newline: end that torn
        # line so our first line is not glued onto it.
        self._f.seek(0, os.SEEK_END)
        if self._f.tell() > 0:
            self._f.seek(self._f.tell() - 1)
            last = self._f.read(1)
            self._f.seek(0, os.SEEK_END)
            if last != "\n":
                self._f.write("\n")

    def write(self, obj: dict[str, Any]) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> PartialWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
