"""Record texts: a record exactly as ``json.dumps(doc, indent=1)`` writes it inside ``results``.

The one home of how the merger spells a record (``segments`` makes the texts, ``merge`` and
``append`` write them). Texts are ASCII bytes, as the document holds them.

Two encoders, one output. The stdlib's C encoder with separators ``(",\\n   ", ": ")`` writes a
flat record as the indent=1 encoder would at depth 2, less the first newline and the closing
one. orjson writes many records in one call at a fraction of that cost, and differs from the
stdlib only where a fix-up over the whole batch puts it right: the field indent (one replace:
records are flat and JSON strings hold no raw newline), floats it spells otherwise than
``repr`` (found by a pattern that only a number ending a field line matches, respelled by
``repr``), non-ASCII text and DEL (escaped as the stdlib escapes them). What orjson cannot
write as the stdlib does (NaN, infinities: a broken kernel's rel_err; integers past 64 bits)
sends the batch to the stdlib. ``_agrees`` probes orjson once at import with the values where
encoders are known to differ; an orjson that spells any of them otherwise even after the
fix-ups is not used, so the bytes never depend on orjson's version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_orjson: ModuleType | None
try:  # optional: several times faster on a million records (bench/merge.py)
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

_encode = json.JSONEncoder(separators=(",\n   ", ": ")).encode

# Floats orjson may spell otherwise than repr: tiny ones in fixed notation (0.00005 for 5e-05),
# one-digit negative exponents (5e-7 for 5e-07). Each pattern opens with a literal, so the regex
# engine scans for it fast, and ends where a field line ends: a string holds no raw newline, so
# a match is the tail of a number, which ``_respelled`` takes whole (back to the space of ": ").
_TINY = re.compile(rb"0\.0000[0-9]*(?=,?\n)")
_SHORT_EXPONENT = re.compile(rb"e-[0-9](?=,?\n)")
_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?")
_NON_ASCII = re.compile(rb"[\x80-\xff]+")
_NESTED = b"\n      "  # a line deeper than a field's in orjson's indent=2 list of records
_STDLIB_ONLY = (b"NaN", b"Infinity")  # what only the stdlib writes (orjson: null)


def record_text(rec: dict[str, Any]) -> bytes:
    """A flat record as ``json.dumps(doc, indent=1)`` writes it inside ``results``."""
    body = _encode(rec)
    return ("{\n   " + body[1:-1] + "\n  }").encode() if len(body) > 2 else b"{}"


def any_record_text(rec: dict[str, Any]) -> bytes:
    """Any record (nested values too, as in documents of other tools), exactly as indent=1."""
    if any(isinstance(v, (dict, list, tuple)) for v in rec.values()):
        return json.dumps(rec, indent=1).replace("\n", "\n  ").encode()
    return record_text(rec)


def record_texts(recs: Sequence[dict[str, Any]], *, stdlib: bool = False, flat: bool = False) -> list[bytes]:
    """``any_record_text`` of each non-empty record, at orjson's speed where it agrees and the
    records are flat.
    ``stdlib``: a record may hold NaN or an infinity (``non_finite`` of the text it was read
    from says so), which only the stdlib writes as the document spells them. ``flat``: the
    caller knows that no record holds a list or an object (their layouts were checked), so the
    encoded records need not be searched for one."""
    texts = _orjson_texts(recs, flat) if _ORJSON_AGREES and not stdlib and recs else None
    return [any_record_text(r) for r in recs] if texts is None else texts


def _orjson_texts(recs: Sequence[dict[str, Any]], flat: bool = False) -> list[bytes] | None:
    """``record_texts`` through orjson and the fix-ups; None where orjson cannot write a record."""
    if _orjson is None:
        return None
    try:
        blob = _orjson.dumps(recs, option=_orjson.OPT_INDENT_2)
    except TypeError:  # an integer past 64 bits
        return None
    if not flat and _NESTED in blob:  # a field holds a list or an object (a timed record's samples_ms): the stdlib's
        return None
    texts = _fixed(blob).split(b",\n  {")
    texts[0] = texts[0][4:]  # the list's "[\n  " off the first, its "\n]" off the last
    texts[-1] = texts[-1][:-2]
    return [texts[0], *(b"{" + t for t in texts[1:])]


def dumps(obj: Any) -> bytes:
    """Compact JSON of a derived file's plain values (the merge cache's arrays, the key
    index): orjson where installed; any valid JSON serves there, byte-exactness is not asked."""
    if _orjson is not None:
        out: bytes = _orjson.dumps(obj)
        return out
    return json.dumps(obj, separators=(",", ":")).encode()


def non_finite(data: bytes) -> bool:
    """Whether JSON text ``data`` may hold NaN or an infinity (a string naming one counts too:
    it only costs the slower encoder)."""
    return any(word in data for word in _STDLIB_ONLY)


def _fixed(blob: bytes) -> bytes:
    """orjson's indent=2 list of flat records with its fields indented by 3, as the stdlib writes
    them inside ``results``, then the fix-ups of the module docstring (the list's brackets stay:
    taking them off would copy the whole)."""
    blob = blob.replace(b"\n    ", b"\n   ")
    for pattern in _FLOAT_FIXES:
        if pattern.search(blob):
            blob = _respelled(blob, pattern)
    if not blob.isascii():
        blob = _NON_ASCII.sub(lambda m: json.dumps(m.group().decode())[1:-1].encode(), blob)
    if b"\x7f" in blob:
        blob = blob.replace(b"\x7f", b"\\u007f")
    return blob


def _respelled(blob: bytes, pattern: re.Pattern[bytes]) -> bytes:
    """``blob`` with each number whose tail ``pattern`` matches spelled as repr spells it."""
    parts, last = [], 0
    for m in pattern.finditer(blob):
        start = blob.rfind(b" ", 0, m.start()) + 1
        token = blob[start : m.end()]
        if _NUMBER.fullmatch(token):
            parts += [blob[last:start], repr(float(token)).encode()]
            last = m.end()
    parts.append(blob[last:])
    return b"".join(parts)


# Values where orjson and the stdlib are known to differ, or might in another orjson version.
_PROBES: list[dict[str, Any]] = [
    {"a": v, "s": 'é ✓ \u2028 \U0001f600 \x7f \x00 \x1f"\\/'}
    for v in (1e-05, 5e-05, 0.0001, 1.5e-07, 5e-324, 1e16, 1.5e16, 1e22, 1.7976931348623157e308, -0.0, 0.1, 123.456)
] + [{"b": 2**63, "c": -(2**63), "d": True, "e": None, "f": 1.0, "g": 9007199254740993}]


def _needed(pattern: re.Pattern[bytes]) -> bool:
    """Whether this orjson spells some probe float of ``pattern``'s kind otherwise than repr."""
    if _orjson is None:
        return False
    for v in (v for r in _PROBES for v in r.values() if type(v) is float):
        text = _orjson.dumps(v)
        if text != repr(v).encode() and pattern.search(text + b"\n"):
            return True
    return False


def _agrees() -> bool:
    """Whether orjson, fixed up, writes every probe as the stdlib does."""
    return _orjson_texts(_PROBES) == [record_text(r) for r in _PROBES]


_FLOAT_FIXES = [p for p in (_TINY, _SHORT_EXPONENT) if _needed(p)]
_ORJSON_AGREES = _agrees()
