"""Record lines judged in bulk: ``partials.classify``'s verdict on the lines it accepts, for a
fraction of its cost per line, and ``classify`` itself for every other line.

The merger reads a million record lines in a large sweep, nearly all of them as a worker wrote
them: the record's fields in canonical order, an integer attempt, an id that is the hash of the
record's identity and an item of the line's unit. ``judge`` takes such a line in one fused pass
keyed by the record's key tuple: its value types and its mode, config kind and implementation
looked up together (``layouts.check_layout`` judges each combination the first time it is seen,
then the verdict is remembered), its id computed by the layout's own id getter
(``records.id_getter``), its item looked up among the unit's. A line that passes all of these is
what ``classify`` calls ``RECORD`` with the record as it stands; every other line (unparsable by
orjson, a record off its layout or in another key order, a wrong id, attempt or unit, no
worker header before it) is handed back unjudged, for ``classify`` to judge in its own words.
So the two never disagree: the fast path only takes lines ``classify`` takes, and takes them
the same way (``tests/test_recordlines.py`` holds them side by side).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.spec.records import OPTIONAL_DEFAULTS, id_getter
from orchestrator.store import jsonline
from orchestrator.store.layouts import CONTAINER_FIELDS, check_layout

RECORD_PREFIX = b'{"id":'  # how the worker's record lines open (``lines.record_line``)

# A record's value types and its (mode, config[, impl]) -> its id getter where ``check_layout``
# finds the layout valid and its key order canonical, else None (``classify`` judges it).
_Verdicts = dict[tuple[tuple[type, ...], tuple[Any, ...]], Callable[[Mapping[str, Any]], str] | None]


class _KeysLayout:
    """What is known of records with one key tuple: where their mode, config kind and
    implementation are, and the verdicts on the type and value combinations seen so far."""

    __slots__ = ("kinds", "nested", "verdicts")

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.kinds = operator.itemgetter(*(k for k in ("mode", "config", "impl") if k in keys))
        self.nested = any(k in keys for k in CONTAINER_FIELDS)  # a field that may hold a list or an object
        self.verdicts: _Verdicts = {}


@dataclass
class Taken:
    """The record lines ``judge`` takes, as columns: each one's line (its ``k``), attempt, item
    id, record and the item's plan position; ``nested``: a record's layout has a field that may
    hold a list or an object (``texts.record_texts`` must look for one)."""

    ks: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    nested: bool = False


_BY_KEYS: dict[tuple[Any, ...], Any] = {}  # key tuple -> its _KeysLayout, None where never fast
_UNSEEN: Any = object()
_ID_GETTERS: dict[tuple[str, str, bool], Callable[[Mapping[str, Any]], str]] = {}


def _layout(keys: tuple[Any, ...]) -> _KeysLayout | None:
    """The layout of ``keys``; None where a record with them lacks its mode or config kind."""
    lay = _BY_KEYS[keys] = _KeysLayout(keys) if "mode" in keys and "config" in keys else None
    return lay


def _verdict(rec: dict[str, Any], lay: _KeysLayout, sig: tuple[tuple[type, ...], tuple[Any, ...]]) -> Any:
    """``check_layout``'s verdict on ``rec`` as an id getter (valid, canonical order) or None."""
    why, order = check_layout(rec)
    get = None
    if why is None and order is None:
        plain = not any(k in rec for k in OPTIONAL_DEFAULTS)  # of the key tuple: the same for all of them
        kind = (rec["mode"], rec["config"], plain)
        get = _ID_GETTERS.get(kind)
        if get is None:
            get = _ID_GETTERS[kind] = id_getter(rec["mode"], rec["config"], plain=plain)
    lay.verdicts[sig] = get
    return get


def judge(lines: Sequence[bytes], at: Sequence[int], positions: Mapping[str, int]) -> tuple[Taken, list[int]]:
    """The record lines ``lines[k]`` for ``k`` in ``at`` (each after a worker header, none
    judged yet): those ``classify`` would call ``RECORD`` with the record as it stands, and the
    ``k`` of the others, for ``classify`` to judge. ``positions``: the unit's items
    (``partials.UnitItems.positions``)."""
    taken = Taken()
    if jsonline._orjson is None:  # without orjson every line goes to ``classify``
        return taken, list(at)
    loads = jsonline._orjson.loads
    by_keys = _BY_KEYS
    ks, attempts, ids, records, places = taken.ks, taken.attempts, taken.ids, taken.records, taken.positions
    nested = False
    left: list[int] = []
    for k in at:
        try:
            obj = loads(lines[k])
            rec = obj["record"]
            iid = obj["id"]
            attempt = obj["attempt"]
            if type(rec) is not dict or type(attempt) is not int:
                raise TypeError
            keys = tuple(rec)
            lay = by_keys.get(keys, _UNSEEN)
            if lay is _UNSEEN:
                lay = _layout(keys)
            if lay is None:
                raise TypeError
            sig = (tuple(map(type, rec.values())), lay.kinds(rec))
            get = lay.verdicts.get(sig, _UNSEEN)
            if get is _UNSEEN:
                get = _verdict(rec, lay, sig)
            if get is None or get(rec) != iid:
                raise TypeError
            place = positions[iid]
        except (ValueError, KeyError, TypeError):  # orjson.JSONDecodeError is a ValueError
            left.append(k)
            continue
        ks.append(k)
        attempts.append(attempt)
        ids.append(iid)
        records.append(rec)
        places.append(place)
        nested = nested or lay.nested
    taken.nested = nested
    return taken, left


def orjson_refuses(raw: bytes) -> bool:
    """Whether orjson cannot read the line ``raw`` (NaN, an infinity, a number past a double:
    what the stdlib reads and only the stdlib writes as the document spells it)."""
    if jsonline._orjson is None:
        return True
    try:
        jsonline._orjson.loads(raw)
    except ValueError:
        return True
    return False
