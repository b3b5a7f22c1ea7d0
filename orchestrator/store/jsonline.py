"""One JSON line (or file) parsed the fastest way this environment has: orjson when installed
(about 2.5x the stdlib per line, bench/merge.py; the results are identical), the stdlib for what
orjson refuses (NaN, an infinity, a number past a double). ``_orjson`` is the one switch: set to
None, every reader of the store parses with the stdlib, as a user without orjson has it.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

_orjson: ModuleType | None
try:  # optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def loads(raw: bytes) -> Any:
    """Parse ``raw``: orjson when installed, the stdlib for what orjson refuses (NaN)."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except ValueError:
            pass
    return json.loads(raw)


def compact(value: Any) -> bytes:
    """``value`` as compact JSON: orjson's bytes where installed, else the stdlib's, which are the
    same bytes for what is written this way (lists of integers and ASCII strings: a unit file's
    items, ``unitfile.items_digest``); the stdlib's for what orjson refuses (an integer past 64 bits)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(value)
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":")).encode()
