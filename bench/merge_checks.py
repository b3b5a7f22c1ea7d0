"""What each check of the merge costs, timed alone over the same partials ``bench.merge`` merges:
the CPU seconds of each step the merger takes per record line, one step at a time over every
record line of the sweep (in a fresh subprocess of ``bench.merge``; the collector off, as the
floor has it). Steps:

- ``parse``: each line parsed (orjson), as the floor parses it too;
- ``classify``: ``partials.classify`` whole, the one classifier (its parse included): the
  layout check, the id check and the unit's items below are inside it;
- ``layout``: ``layouts.check_layout`` of each record (fields, their types, key order);
- ``id``: ``records.record_id`` of each record (the id is its identity's hash);
- ``unit``: each id looked up among its unit's items (``partials.UnitItems``);
- ``encode``: the record texts (``texts.record_texts``, one call per partial), which the
  floor's writer also does in its own way;
- ``starts``: every partial's start lines checked at once (``partials.starts_checked``), which
  the merger does instead of classifying each (``classify`` above parses them too);
- ``judge``: what the merger does per record line instead of ``classify``: the record lines
  judged in bulk (``recordlines.judge``: the parse, the layout by its key tuple, the value types,
  mode and config kind, the id and the unit in one pass; ``classify`` only for what it leaves).

The sum is more than the merge pays for them together (``classify`` and ``judge`` each hold the
parse, layout, id and unit checks), and leaves out what is not per record: reading files, the
merge cache, ordering, the write.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def child_checks(sweep: str) -> dict[str, Any]:
    from orchestrator.spec.records import record_id
    from orchestrator.store.layouts import check_layout
    from orchestrator.store.partials import UnitItems, classify, loads, starts_checked
    from orchestrator.store.recordlines import RECORD_PREFIX, judge
    from orchestrator.store.texts import record_texts

    gc.disable()
    root = Path(sweep)
    units = {p.name.removesuffix(".jsonl"): p.read_bytes().split(b"\n") for p in (root / "partials").iterdir()}
    items = {u: UnitItems(root, u) for u in units}
    for unit in items.values():
        unit.positions  # noqa: B018 - read before the clock starts, as the merger reads it once per unit
    lines = [line for ls in units.values() for line in ls if line]
    records = {u: [loads(line) for line in ls if line.startswith(b'{"id":')] for u, ls in units.items()}
    recs = [obj["record"] for objs in records.values() for obj in objs]
    at = {u: [k for k, line in enumerate(ls) if line.startswith(RECORD_PREFIX)] for u, ls in units.items()}

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

    steps: dict[str, Callable[[], object]] = {
        "parse": lambda: [loads(line) for line in lines],
        "classify": classified,
        "layout": lambda: [check_layout(r) for r in recs],
        "id": lambda: [record_id(r) for r in recs],
        "unit": in_units,
        "encode": lambda: [record_texts([obj["record"] for obj in objs]) for objs in records.values()],
        "starts": lambda: [starts_checked(b"\n".join(ls)) for ls in units.values()],
        "judge": lambda: [judge(ls, at[u], items[u].positions) for u, ls in units.items()],
    }
    out: dict[str, Any] = {"records": len(recs)}
    for name, step in steps.items():
        t = time.process_time()
        step()
        out[name] = time.process_time() - t
    return out
