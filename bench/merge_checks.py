"""What each check of the merge costs, timed alone over the same partials ``bench.merge`` merges:
the CPU seconds of each step the merger takes per line, one step at a time over every line of
the sweep (in a fresh subprocess of ``bench.merge``; the collector off, as the floor has it).

The merger reads a line on its bytes where it can (``store/rawlines.py``), and parses it with
``partials.classify`` otherwise; both are timed. On the bytes:

- ``raw_start``: each start line matched as the worker writes it;
- ``raw_layout``: each record line matched by its layout's regex (field names and order, mode
  and config kind, each value's type and spelling): the layout check;
- ``raw_id``: each record's id checked against the hash of its identity bytes: the id check;
- ``unit``: each id looked up among its unit's items (``partials.UnitItems``): the unit check;
- ``raw_floats``: each partial's float values checked to be spelled as repr spells them;
- ``raw_text``: the record texts re-spaced from the lines (``texts.compact_texts``);
- ``read``: ``segments._consume`` whole over every partial, what the merger pays per line (the
  above, and the loop around them).

Parsed (what a line the shortcut declines costs, and what the merger paid per line before):

- ``parse``: each line parsed (orjson), as the floor parses each record line too;
- ``classify``: ``partials.classify`` whole (its parse included);
- ``layout``: ``layouts.check_layout`` of each record (fields, their types, key order);
- ``id``: ``records.record_id`` of each record (the id is its identity's hash);
- ``encode``: the record texts (``texts.record_texts``, one call per partial), which the
  floor's writer also does in its own way.

The steps overlap (``read`` holds the raw ones, ``classify`` the parsed ones), and leave out what
is not per line: reading files, the merge cache, ordering, the write.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _parsed_steps(units: dict[str, list[bytes]], items: dict[str, Any]) -> dict[str, Callable[[], object]]:
    from orchestrator.spec.records import record_id
    from orchestrator.store.layouts import check_layout
    from orchestrator.store.partials import classify, loads
    from orchestrator.store.texts import record_texts

    lines = [line for ls in units.values() for line in ls if line]
    records = {u: [loads(line) for line in ls if line.startswith(b'{"id":')] for u, ls in units.items()}
    recs = [obj["record"] for objs in records.values() for obj in objs]

    def classified() -> None:
        for u, ls in units.items():
            for line in ls:
                if line:
                    classify(line, True, True, items[u])

    def in_units() -> None:
        for u, objs in records.items():
            positions = items[u].positions
            for obj in objs:
                if obj["id"] not in positions:
                    raise SystemExit(f"{obj['id']} is not an item of unit {u}")

    return {
        "parse": lambda: [loads(line) for line in lines],
        "classify": classified,
        "layout": lambda: [check_layout(r) for r in recs],
        "id": lambda: [record_id(r) for r in recs],
        "unit": in_units,
        "encode": lambda: [record_texts([obj["record"] for obj in objs]) for objs in records.values()],
    }


def _raw_steps(root: Path, units: dict[str, list[bytes]], items: dict[str, Any]) -> dict[str, Callable[[], object]]:
    from orchestrator.store.rawlines import RawRecords, Shapes, canonical_floats, starts_checked
    from orchestrator.store.segments import Segment, _consume
    from orchestrator.store.texts import compact_texts

    datas = {u: b"\n".join(ls) for u, ls in units.items()}
    for u, data in datas.items():  # every layout learned before the clock starts, as after a merge's first lines
        _consume(Segment(u, root / "partials" / f"{u}.jsonl"), data, 1, items[u], tail_ok=False)
    shapes = Shapes()
    rec_lines = {u: [line for line in ls if line.startswith(b'{"id":')] for u, ls in units.items()}
    matches = {u: [_match(shapes, line) for line in ls] for u, ls in rec_lines.items()}
    found = {u: RawRecords(shapes) for u in rec_lines}
    if not all(found[u].take(line, 0, items[u]) for u, ls in rec_lines.items() for line in ls):
        raise SystemExit("a record line of the sweep is not read on its bytes")

    def ids() -> None:
        states: dict[bytes, Any] = {}
        for ms in matches.values():
            for shape, groups in ms:
                shape.id_of(groups, states)

    def read() -> None:
        for u, data in datas.items():
            _consume(Segment(u, root / "partials" / f"{u}.jsonl"), data, 1, items[u], tail_ok=False)

    return {
        "raw_start": lambda: [starts_checked(data) for data in datas.values()],
        "raw_layout": lambda: [_match(shapes, line) for ls in rec_lines.values() for line in ls],
        "raw_id": ids,
        "raw_floats": lambda: [canonical_floats(f.floats) for f in found.values()],
        "raw_text": lambda: [compact_texts(f.inners, u, f.attempts) for u, f in found.items()],
        "read": read,
    }


def _match(shapes: Any, line: bytes) -> tuple[Any, tuple[bytes, ...]]:
    hit = shapes.match(line)
    if hit is not None:
        return hit
    raise SystemExit("a record line of the sweep matches no learned layout")


def child_checks(sweep: str) -> dict[str, Any]:
    from orchestrator.store.partials import UnitItems

    gc.disable()
    root = Path(sweep)
    units = {p.name.removesuffix(".jsonl"): p.read_bytes().split(b"\n") for p in (root / "partials").iterdir()}
    items = {u: UnitItems(root, u) for u in units}
    for unit in items.values():
        unit.positions  # noqa: B018 - read before the clock starts, as the merger reads it once per unit
    n_records = sum(line.startswith(b'{"id":') for ls in units.values() for line in ls)
    out: dict[str, Any] = {"records": n_records}
    for steps in (_raw_steps(root, units, items), _parsed_steps(units, items)):
        for name, step in steps.items():
            t = time.process_time()
            step()
            out[name] = time.process_time() - t
        del steps
    return out
