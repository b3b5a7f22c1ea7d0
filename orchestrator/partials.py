"""Partial files: one per unit, appended line by line by that unit's worker only.

Each line is one JSON object, flushed and fsynced when written:

    {"header": {...}}                    a worker attempt started (device, env, attempt, job)
    {"start": ITEM_ID, "attempt": N}     a config is about to be compiled and timed
    {"abandon": ITEM_ID, "attempt": N}   the worker gave that config up on purpose
                                         (preemption or time-limit warning), not its fault
    {"id": ITEM_ID, "attempt": N, "record": {...}}   a finished record

A worker killed mid-write leaves a torn last line; readers skip it with a warning naming
the file and line, and the item is redone. ``start`` lines without a record or an
``abandon`` count the attempts that died on a config, so one that keeps killing its
worker is given up on.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, IO

from .errors import PartialError
from .schema import SCHEMA_VERSION

log = logging.getLogger(__name__)


@dataclass
class PartialContent:
    path: Path
    headers: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # id -> (attempt, record)
    starts: Counter = field(default_factory=Counter)
    torn: list[int] = field(default_factory=list)  # 1-based line numbers skipped

    @property
    def attempts(self) -> int:
        return len(self.headers)


def read_partial(path: Path) -> PartialContent:
    """Parse a partial file; a missing file is an empty partial."""
    content = PartialContent(Path(path))
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return content
    with f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
                if not isinstance(obj, dict):
                    raise ValueError("not an object")
            except ValueError:
                content.torn.append(lineno)
                log.warning("%s line %d is torn or not JSON (a worker killed mid-write?); skipped, its item will be redone", path, lineno)
                continue
            if "record" in obj:
                rec = obj["record"]
                iid = obj.get("id")
                if not isinstance(rec, dict) or not isinstance(iid, str):
                    content.torn.append(lineno)
                    log.warning("%s line %d is not a valid record line; skipped", path, lineno)
                    continue
                content.records[iid] = (int(obj.get("attempt", 0)), rec)
            elif "start" in obj:
                content.starts[obj["start"]] += 1
            elif "abandon" in obj:
                content.starts[obj["abandon"]] -= 1
            elif "header" in obj:
                header = obj["header"]
                if not isinstance(header, dict):
                    content.torn.append(lineno)
                    continue
                if header.get("schema") != SCHEMA_VERSION:
                    raise PartialError(
                        f"{path} line {lineno}: partial schema version {header.get('schema')!r}, this tilesweep reads "
                        f"{SCHEMA_VERSION}; merge it with the tilesweep version that wrote it"
                    )
                content.headers.append(header)
            else:
                content.torn.append(lineno)
                log.warning("%s line %d is not a tilesweep partial line; skipped", path, lineno)
    return content


def count_records(path: Path) -> int:
    """Records in a partial without parsing JSON (for status on large sweeps)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    return data.count(b'\n{"id":')  + (1 if data.startswith(b'{"id":') else 0)


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

    def __enter__(self) -> "PartialWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
