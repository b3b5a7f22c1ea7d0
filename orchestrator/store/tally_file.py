"""``SWEEP/status-tally.json``: what the last ``tilesweep status`` counted of each unfinished
partial, so a status asked from a new process (every ``tilesweep status`` command, and the first
count of ``wait``) reads only the bytes the partials gained since (``tally``).

Per partial (keyed by its unit): its identity when counted (device and inode, size, mtime),
the offset and line number after its last complete line, the length and digest of its first
and of its last complete line, and what its complete lines said (the worker headers, each
recorded item and whether its record is an error, or why nothing in the file counts).

Derived data, as the merge cache is: never trusted over the partial it describes (``tally``
checks an entry against its partial before it starts from it), written atomically, not written
where the sweep directory is not writable, ignored with a warning where damaged (the next
status recounts those partials and rewrites it), and always safe to delete.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

from orchestrator.store.files import atomic_open, read_file, remove_dead_temps
from orchestrator.store.lines import ReadHeader
from orchestrator.store.partials import loads

_orjson: ModuleType | None
try:  # optional, as for reading partials: the file is a few hundred kB on a large sweep
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

log = logging.getLogger(__name__)

TALLY_FILE = "status-tally.json"
FORMAT = "tilesweep-status-tally"
VERSION = 1


class Entry(TypedDict):
    """One partial as counted (see the module docstring)."""

    ino: list[int]  # [st_dev, st_ino]
    size: int
    mtime_ns: int
    offset: int  # after the last complete line counted
    lineno: int  # the number of the line that starts at ``offset``
    first: list[Any]  # [length, digest] of the first line, newline included ([0, ""]: none complete)
    last: list[Any]  # [length, digest] of the last complete line, newline included
    headers: list[ReadHeader]
    records: dict[str, bool]  # item id -> whether its (last) record is an error
    foreign: str | None  # why nothing in the partial counts


def tally_path(sweep_root: Path) -> Path:
    return sweep_root / TALLY_FILE


def read(sweep_root: Path) -> dict[str, Entry]:
    """Unit -> its partial's entry; empty where there is no tally file, and where it is damaged
    or of another version (a warning for damage: the partials it describes are recounted)."""
    path = tally_path(sweep_root)
    try:
        data = loads(read_file(path))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("%s is unreadable (%s); ignored: status recounts the unfinished partials", path, exc)
        return {}
    except ValueError:
        data = None
    if type(data) is dict and data.get("format") == FORMAT and data.get("version") != VERSION:
        log.info("%s is of another version (%r); ignored: status recounts the partials", path, data.get("version"))
        return {}
    entries = data.get("partials") if type(data) is dict and data.get("format") == FORMAT else None
    if type(entries) is not dict or not all(type(e) is dict and _valid(e) for e in entries.values()):
        log.warning("%s is damaged; ignored: status recounts the unfinished partials and rewrites it", path)
        return {}
    return entries


def write(sweep_root: Path, entries: Mapping[str, Entry]) -> bool:
    """Replace the tally file with ``entries``; False (and nothing written) where the sweep
    directory is not writable."""
    path = tally_path(sweep_root)
    data = {"format": FORMAT, "version": VERSION, "partials": entries}
    try:
        text = _orjson.dumps(data) if _orjson is not None else json.dumps(data).encode()
        remove_dead_temps(path)  # left by a status killed while it wrote
        with atomic_open(path, "wb", fsync=False) as f:  # derived: a crash costs a recount, never a record
            f.write(text)
    except OSError as exc:
        log.debug("status tally not written to %s: %s", path, exc)
        return False
    return True


def _int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _seal(value: Any) -> bool:
    return type(value) is list and len(value) == 2 and _int(value[0]) and type(value[1]) is str


def _valid(e: dict[str, Any]) -> bool:
    """Whether ``e`` has every field of an ``Entry``, each of its type."""
    ino, headers, records = e.get("ino"), e.get("headers"), e.get("records")
    return (
        type(ino) is list
        and len(ino) == 2
        and all(type(x) is int for x in ino)
        and type(e.get("mtime_ns")) is int
        and all(_int(e.get(k)) for k in ("size", "offset", "lineno"))
        and _seal(e.get("first"))
        and _seal(e.get("last"))
        and type(headers) is list
        and all(type(h) is dict and _int(h.get("line")) for h in headers)
        and type(records) is dict
        and {*map(type, records.values())} <= {bool}
        and isinstance(e.get("foreign"), (str, type(None)))
    )
