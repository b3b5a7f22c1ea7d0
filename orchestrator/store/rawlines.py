"""Record lines read on their bytes: the merger's shortcut through ``partials.classify``.

A sweep has a handful of record layouts (``layouts``), and the worker writes every record line
of one layout byte for byte alike but for the values: ``{"id":"<16 hex>","attempt":N,"record":
{...}}``, compact, keys in canonical order. Once ``classify`` has accepted a record of a layout
(every check made on the parsed object: layout, id, unit), ``Shapes.learn`` compiles one regex
of that layout's exact bytes, its mode and config kind spelled out, each value's type fixed as
that record's. A later line the regex matches has that layout, so the layout check holds; its id
is checked against the hash of its identity bytes (``records.id_prefix`` and ``id_suffix``
spelled with ``%s``, the identity values' bytes being their spelling there) and against its
unit's items. So a line ``Shapes.record`` returns is one ``classify`` calls a record of that id
and attempt, with those values; any other line (another layout, odd spelling, a torn or foreign
line) goes to ``classify`` as before: the shortcut only ever declines.

It accepts only spellings that are the stdlib's own, so that the record's compact text can be
re-spaced into its document text (``texts.compact_texts``) instead of being parsed and encoded:
strings of printable ASCII without an escape, integers without a leading zero or sign of zero
(at most 18 digits), no nested value. Floats are matched by their JSON grammar; whether each is
spelled as ``repr`` spells it, ``canonical_floats`` checks for a whole partial at once, and a
line whose float is not is given to ``classify`` after all. A layout that carries an optional
identity field (causal, kv_heads, impl: ``records.item_id``'s own path), a bool or null
identity value, or a list is never learned.
"""

from __future__ import annotations

import hashlib
import json
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from types import ModuleType
from typing import Any

from orchestrator.spec.records import IDENTITY_FIELDS, OPTIONAL_DEFAULTS, config_fields, id_prefix, id_suffix
from orchestrator.store.lines import encode_line, record_line
from orchestrator.store.partials import UnitItems

_orjson: ModuleType | None
try:  # optional: checks a partial's floats in two calls (``canonical_floats``)
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

# Values as a layout's regex matches them: loosely, so that it runs fast; what it lets through
# that the stdlib would not spell so, ``RawRecords.plain`` (strings of printable ASCII, integers
# without a leading zero or a sign of zero) and ``canonical_floats`` find for a whole partial.
_STR = rb'"[^"\\]*"'  # no escape
_INT = rb"-?[0-9]{1,18}"  # within 64 bits, which orjson reads as an int (past them: as a float)
_FLOAT = rb"-?[0-9]{1,16}[.eE][-+.0-9eE]*"  # an integer part past 16 digits is never repr's
_VALUE = {str: _STR, int: _INT, float: _FLOAT, bool: None, type(None): rb"null"}
_WORKER_INT = rb"(?:0|[1-9][0-9]{0,17})"  # an attempt as the worker spells it
_ID = rb"[0-9a-f]{16}"
_START = re.compile(rb'\{"start":"' + _ID + rb'","attempt":' + _WORKER_INT + rb'(?:,"alone":true)?\}')
_MAX_SHAPES = 64  # layouts learned per reader (a sweep has a handful)


# A start line as the worker writes it, between two newlines: ``starts_checked`` finds them all
# in one call (the regex engine scans for its literal opening).
_START_LINES = re.compile(rb'\n\{"start":"' + _ID + rb'","attempt":' + _WORKER_INT + rb'(?:,"alone":true)?\}(?=\n)')
# What ``_INT`` lets through that no JSON writer writes (a leading zero) or the stdlib would
# spell otherwise (-0): a value follows a colon in a flat record. Each opens with a literal.
_LEADING_ZERO = re.compile(rb":0[0-9]")
_NEGATIVE_ZERO = re.compile(rb":-0[0-9,}]")
_CONTROLS = bytes(range(32)) + b"\x7f"


def starts_checked(data: bytes) -> bool:
    """Whether every line of ``data`` but its first that opens as a start line is a start line
    as the worker writes it, newline included (``is_start`` checks the first, or all of them
    where this is false)."""
    return data.count(b'\n{"start":') == len(_START_LINES.findall(data))


def is_start(raw: bytes) -> bool:
    """Whether ``raw`` is a start line as the worker writes it (``classify``: ``START``)."""
    return _START.fullmatch(raw) is not None


@dataclass(frozen=True)
class Shape:
    """One learned layout: its regex (groups: id, attempt, the record's text, its identity's
    text, the identity values, the config values, the float values) and its id's formats."""

    rx: re.Pattern[bytes]
    conf: slice  # the config values among the groups
    floats: slice  # the float values among the groups
    prefix: bytes  # the identity part of the hashed bytes, with a %s per identity value
    suffix: bytes  # the config part, with a %s per config value
    error: bool  # the layout is an error record's

    def id_of(self, groups: Sequence[bytes], states: dict[bytes, Any]) -> str:
        """The id of a matched line's identity (``records.item_id``), the identity part hashed
        once per problem (its hash state copied, keyed by its text), as ``records.id_getter``."""
        state = states.get(groups[3])
        if state is None:
            if len(states) >= 1 << 16:
                states.clear()
            state = states[groups[3]] = hashlib.blake2b(self.prefix % tuple(groups[4 : self.conf.start]), digest_size=8)
        h = state.copy()
        h.update(self.suffix % tuple(groups[self.conf]))
        return h.hexdigest()


# Every layout tried in this process -> its shape, or None where the shortcut does not read it.
_LEARNED: dict[tuple[Any, ...], Shape | None] = {}


class Shapes:
    """The layouts learned so far, in the order one partial's lines last matched them: error
    records' apart (``known[True]``), so that a run of results and errors, as a problem's
    configs pruned or not come, tries the regex of the other kind only where a line holds
    ``"error":`` (or not) as a key or in a string: a wrong guess only costs ``classify``."""

    def __init__(self) -> None:
        shapes = [s for s in list(_LEARNED.values()) if s is not None]
        self.known: dict[bool, list[Shape]] = {e: [s for s in shapes if s.error is e] for e in (False, True)}
        self.states: dict[bytes, Any] = {}  # identity text -> the hash state of its id prefix

    def match(self, raw: bytes) -> tuple[Shape, tuple[bytes, ...]] | None:
        """The learned layout ``raw`` has and its groups, or None."""
        known = self.known[b'"error":' in raw]
        for n, shape in enumerate(known):
            m = shape.rx.fullmatch(raw)
            if m is not None:
                if n:
                    known.insert(0, known.pop(n))
                return shape, m.groups()
        return None

    def learn(self, iid: str, attempt: int, rec: dict[str, Any]) -> None:
        """Learn the layout of ``rec`` (canonical key order), a record ``classify`` accepted
        for ``iid``, where it is one this shortcut reads; kept only if its regex reads the
        line the worker writes for it back to the same id."""
        lk = (tuple(rec), tuple(map(type, rec.values())), rec.get("mode"), rec.get("config"))
        if lk in _LEARNED or len(_LEARNED) >= _MAX_SHAPES:
            return
        shape = _shape(rec)
        if shape is not None:
            m = shape.rx.fullmatch(encode_line(record_line(iid, attempt, rec)).encode())
            if m is None or shape.id_of(m.groups(), {}) != iid:
                shape = None
        _LEARNED[lk] = shape
        if shape is not None:
            self.known[shape.error].append(shape)


class RawRecords:
    """The record lines of one partial read on their bytes, as columns: item, attempt (as
    spelled), line index, the record's compact text less its braces, error record or not; and
    every float token, ``n_floats`` of them per record."""

    def __init__(self, shapes: Shapes) -> None:
        self.shapes = shapes
        self.iids: list[str] = []
        self.attempts: list[bytes] = []
        self.ks: list[int] = []
        self.inners: list[bytes] = []
        self.errors: list[bool] = []
        self.floats: list[bytes] = []
        self.n_floats: list[int] = []

    def take(self, raw: bytes, k: int, items: UnitItems) -> bool:
        """Whether line ``k`` is a record line of a learned layout whose id is its identity's
        and whose item is one of its unit's ``items``: then it is kept. (``Shapes.match`` and
        ``Shape.id_of``, written out: this runs once per record line.)"""
        known = self.shapes.known[b'"error":' in raw]
        for n, shape in enumerate(known):
            m = shape.rx.fullmatch(raw)
            if m is not None:
                if n:
                    known.insert(0, known.pop(n))
                break
        else:
            return False
        g = m.groups()
        state = self.shapes.states.get(g[3])
        if state is None:
            return self._take_new_problem(shape, g, k, items)
        h = state.copy()
        h.update(shape.suffix % g[shape.conf])
        iid = g[0].decode()
        if h.hexdigest() != iid or iid not in items.positions:
            return False
        self.iids.append(iid)
        self.attempts.append(g[1])
        self.ks.append(k)
        self.inners.append(g[2])
        self.errors.append(shape.error)
        floats = g[shape.floats]
        self.floats += floats
        self.n_floats.append(len(floats))
        return True

    def _take_new_problem(self, shape: Shape, g: tuple[bytes, ...], k: int, items: UnitItems) -> bool:
        iid = g[0].decode()
        if shape.id_of(g, self.shapes.states) != iid or iid not in items.positions:
            return False
        self._keep(shape, g, iid, k)
        return True

    def _keep(self, shape: Shape, g: tuple[bytes, ...], iid: str, k: int) -> None:
        self.iids.append(iid)
        self.attempts.append(g[1])
        self.ks.append(k)
        self.inners.append(g[2])
        self.errors.append(shape.error)
        floats = g[shape.floats]
        self.floats += floats
        self.n_floats.append(len(floats))

    def drop_unplain(self) -> list[int]:
        """Drop every record where one of them is spelled otherwise than the stdlib spells it
        (``_VALUE``'s loose matches: a string not of printable ASCII, an integer with a leading
        zero or -0; a string value that looks like one only costs the check by ``classify``);
        returns their line indices."""
        blob = b"}".join(self.inners) + b"}"  # as each record's text ends
        plain = blob.isascii() and len(blob.translate(None, _CONTROLS)) == len(blob)
        if plain and not _LEADING_ZERO.search(blob) and not _NEGATIVE_ZERO.search(blob):
            return []
        return self.drop(lambda n: True)

    def drop_odd_floats(self) -> list[int]:
        """Drop the records with a float not spelled as repr spells it (``canonical_floats``);
        returns their line indices (for ``classify``)."""
        bad = canonical_floats(self.floats)
        if not bad:
            return []
        ends = list(accumulate(self.n_floats))
        odd = {bisect_right(ends, i) for i in bad}
        return self.drop(lambda n: n in odd)

    def drop(self, which: Callable[[int], bool]) -> list[int]:
        """Drop the records whose index ``which`` says; returns their line indices."""
        keep = [n for n in range(len(self.ks)) if not which(n)]
        gone = [k for n, k in enumerate(self.ks) if which(n)]
        self.iids = [self.iids[n] for n in keep]
        self.attempts = [self.attempts[n] for n in keep]
        self.inners = [self.inners[n] for n in keep]
        self.errors = [self.errors[n] for n in keep]
        self.ks = [self.ks[n] for n in keep]
        self.floats, self.n_floats = [], []  # checked already
        return gone


def _shape(rec: dict[str, Any]) -> Shape | None:
    """The regex of ``rec``'s layout, or None where the shortcut does not read it."""
    if any(k in rec for k in OPTIONAL_DEFAULTS):
        return None
    mode, config = rec.get("mode"), rec.get("config")
    if not isinstance(mode, str) or not isinstance(config, str):
        return None
    try:
        conf = config_fields(mode, config)
    except ValueError:
        return None
    keyed = IDENTITY_FIELDS + conf
    if tuple(rec)[: len(keyed)] != keyed:
        return None
    parts: list[bytes] = []
    floats: list[bytes] = []
    for name, value in rec.items():
        spelled = _VALUE.get(type(value))
        if name in keyed and type(value) not in (str, int):  # spelled in the id as in the line
            return None
        if name in ("mode", "config"):
            parts.append(b'"%s":"(%s)"' % (name.encode(), re.escape(value.encode())))
        elif name in keyed:
            body = spelled[1:-1] if type(value) is str else spelled  # type: ignore[index]
            quote = b'"' if type(value) is str else b""
            parts.append(b'"%s":%s(%s)%s' % (name.encode(), quote, body, quote))
        elif type(value) is bool:
            parts.append(b'"%s":%s' % (name.encode(), b"true" if value else b"false"))
        elif spelled is None:  # a list or an object
            return None
        elif type(value) is float:
            floats.append(b'"%s":(%s)' % (name.encode(), spelled))
            parts.append(floats[-1])
        else:
            parts.append(b'"%s":%s' % (name.encode(), spelled))
    n = len(IDENTITY_FIELDS)
    record = b"(" + b",".join(parts[:n]) + b")," + b",".join(parts[n:])
    rx = re.compile(rb'\{"id":"(' + _ID + rb')","attempt":(' + _WORKER_INT + rb'),"record":\{(' + record + rb")\}\}")
    dummy: Any = "%s"
    prefix = id_prefix(*[dummy] * n)
    suffix = id_suffix(conf, ["%s"] * len(conf))
    first = 4 + n  # groups: id, attempt, record, identity, then each value captured
    conf_at = slice(first, first + len(conf))
    return Shape(rx, conf_at, slice(conf_at.stop, conf_at.stop + len(floats)), prefix, suffix, "error" in rec)


def _exponent_or_tiny(joined: bytes) -> bool:
    """Whether some token may be spelled with an exponent or be below 1e-4: outside the fixed
    notation (from 1e-4 up to 1e16, ``_FLOAT`` keeps them below) where orjson spells a float as
    repr does. Substring tests, so "10.00001" counts too: it only costs the repr check."""
    return b"e" in joined or b"E" in joined or b"0.0000" in joined


def canonical_floats(tokens: Sequence[bytes]) -> list[int]:
    """The indices of the float tokens not spelled as ``repr`` spells their value (which the
    document's text must be); orjson reads and writes them all in one call each, and tokens it
    spells back the same in fixed notation from 1e-4 to 1e16 are repr's spellings; else repr
    spells them all, in one join."""
    if not tokens:
        return []
    joined = b",".join(tokens)
    values = None
    if _orjson is not None:
        try:
            values = _orjson.loads(b"[" + joined + b"]")
        except ValueError:  # past the float range: the stdlib reads it as infinity
            pass
        else:
            if _orjson.dumps(values) == b"[" + joined + b"]" and not _exponent_or_tiny(joined):
                return []
    if values is None:
        try:
            values = json.loads(b"[" + joined + b"]")
        except ValueError:  # not a number at all (``_FLOAT`` is loose): ``classify`` says what it is
            return list(range(len(tokens)))
    if ",".join(map(repr, values)).encode() == joined:  # exponents and tiny values, spelled by repr
        return []
    return [i for i, (t, v) in enumerate(zip(tokens, values, strict=True)) if repr(v).encode() != t]
