"""Whether the record of a partial's record line is one this tilesweep's worker writes.

A record must fit the schema's record layout for its mode and config kind (every required
field, no unknown one, each of its type: ``spec.records`` says which) and its line's id must
be the hash of its identity. Anything else is not trusted: its line is skipped and its item
redone (see ``partials.classify``).

Validation is keyed on a record's layout (its key order, value types, mode and config kind):
a sweep has a handful of layouts, so checking a million records costs one tuple build and one
dict look-up each, not a schema walk; the id is checked by the layout's own id getter
(``records.record_id``: one format and one hash).
"""

from __future__ import annotations

from typing import Any

from kernels.spelling import as_json
from orchestrator.spec.records import (
    DEFAULT_IMPL,
    EXTRA_RECORD_FIELDS,
    FIELD_TYPES,
    IDENTITY_FIELDS,
    RECORD_IDENTITY_ORDER,
    RESULT_FIELDS,
    config_fields,
    record_id,
)

# The fields whose values may be a list or an object; every other field of a valid record holds
# a string, a number, a bool or null.
CONTAINER_FIELDS = tuple(k for k, types in FIELD_TYPES.items() if list in types or dict in types)
# Extras a worker writes; ``unit`` and ``attempt`` are added by the merger from the line.
WORKER_EXTRAS = tuple(k for k in EXTRA_RECORD_FIELDS if k not in ("unit", "attempt"))
MODES_CONFIGS = {("fwd", "auto"), ("fwd", "forced"), ("fwd_bwd", "auto"), ("fwd_bwd", "forced")}

# layout key -> None (valid, canonical key order) | tuple of keys (valid, reorder) | str (why invalid)
_Verdict = str | tuple[str, ...] | None
_LAYOUTS: dict[tuple[Any, ...], _Verdict] = {}


def _judge_layout(keys: tuple[str, ...], types: tuple[type, ...], mode: Any, config: Any, impl: Any) -> _Verdict:
    if (mode, config) not in MODES_CONFIGS:
        return f"mode/config {as_json(mode)}/{as_json(config)} is not one of fwd|fwd_bwd and auto|forced"
    present = dict(zip(keys, types, strict=True))
    if len(present) != len(keys):
        return "a field appears twice"
    try:
        fields = config_fields(mode, config, impl)
    except ValueError as exc:  # an implementation this tilesweep does not know
        return str(exc)
    allowed = RECORD_IDENTITY_ORDER + fields + ("error",) + RESULT_FIELDS + WORKER_EXTRAS
    unknown = [k for k in keys if k not in allowed]
    if unknown:
        return f"unknown field(s) {', '.join(unknown)} for a {mode} {config} record"
    required = IDENTITY_FIELDS + fields + (() if "error" in present else RESULT_FIELDS)
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
    why, order = check_layout(rec)
    if why is not None:
        return why, None
    if not isinstance(iid, str) or record_id(rec) != iid:
        return f"id {as_json(iid)} is not the id of the record's identity fields", None
    return None, order


def check_layout(rec: Any) -> tuple[str | None, tuple[str, ...] | None]:
    """``check_record`` less the id: for a record whose identity values were matched, with their
    exact types (which the layout checks), against an item whose id is known."""
    if not isinstance(rec, dict):
        return "record is not an object", None
    keys = tuple(rec)
    lk = (keys, tuple(map(type, rec.values())), rec.get("mode"), rec.get("config"), rec.get("impl", DEFAULT_IMPL))
    try:
        verdict = _LAYOUTS[lk]
    except KeyError:
        verdict = _LAYOUTS[lk] = _judge_layout(*lk)
    except TypeError:  # an unhashable mode/config/impl value
        return "mode/config/impl is not a string", None
    if isinstance(verdict, str):
        return verdict, None
    return None, verdict
