"""The merger judges record lines in bulk (``store/recordlines``) and ``classify`` judges what
it leaves: whatever a record line holds, the merger takes exactly the records resume counts,
skips the same lines for the same reasons, and writes each record as the stdlib spells it."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.store.partials import read_partial
from orchestrator.store.segments import segment
from orchestrator.store.synthetic import build_sweep, header, small_spec
from orchestrator.store.texts import any_record_text

Line = dict[str, Any]


def _set(field: str, value: Any) -> Callable[[Line], None]:
    def change(obj: Line) -> None:
        obj["record"][field] = value

    return change


def _drop(field: str) -> Callable[[Line], None]:
    def change(obj: Line) -> None:
        del obj["record"][field]

    return change


def _reversed(obj: Line) -> None:
    obj["record"] = dict(reversed(list(obj["record"].items())))


def _impl_named(obj: Line) -> None:
    rec = obj["record"]
    at = list(rec).index("config")
    items = list(rec.items())
    obj["record"] = dict([*items[:at], ("impl", "tilesweep"), *items[at:]])


def _line(**over: Any) -> Callable[[Line], None]:
    def change(obj: Line) -> None:
        obj.update(over)

    return change


def _without(key: str) -> Callable[[Line], None]:
    def change(obj: Line) -> None:
        del obj[key]

    return change


def _record_as(value: Callable[[dict[str, Any]], Any]) -> Callable[[Line], None]:
    def change(obj: Line) -> None:
        obj["record"] = value(obj["record"])

    return change


# A change to one record line (of a measured record), as a worker never writes it, or as it does.
VARIANTS: dict[str, Callable[[Line], None]] = {
    "as written": lambda obj: None,
    "keys in another order": _reversed,
    "impl spelled at its default": _impl_named,
    "NaN": _set("rel_err", float("nan")),
    "an integer median": _set("median_ms", 3),
    "head_dim a float": _set("head_dim", 64.0),
    "head_dim a string": _set("head_dim", "64"),
    "batch a bool": _set("batch", True),
    "median a string": _set("median_ms", "0.1 ms"),
    "an unknown field": _set("colour", "red"),
    "unit inside the record": _set("unit", "0123"),
    "a result missing": _drop("median_ms"),
    "mode missing": _drop("mode"),
    "another mode": _set("mode", "bwd"),
    "another kernel": _set("impl", "mosaic"),
    "causal": _set("causal", True),
    "mode a list": _set("mode", ["fwd"]),
    "id of another item": _line(id="0123456789abcdef"),
    "id not a string": _line(id=5),
    "attempt a bool": _line(attempt=True),
    "attempt missing": _without("attempt"),
    "record its keys as a list": _record_as(list),
    "record a string": _record_as(lambda rec: "record"),
    "more keys on the line": _line(note="hello"),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Any:
    sd, units = build_sweep(tmp_path_factory.mktemp("recordlines") / "sweep", small_spec(n_seqs=1), 2)
    return sd, units[0]


def _agree(sd: Any, unit: Any, text: str) -> tuple[set[str], list[tuple[int, str]]]:
    """Write ``text`` as the unit's partial; the merger's segment and ``read_partial`` must
    agree on every record and skipped line, and the segment spells each record as the stdlib."""
    path = sd.partial_path(unit.id)
    path.write_text(text)
    seg = segment(sd.root, unit.id, path, use_cache=False)
    content = read_partial(path, warn=False)
    assert seg.foreign == content.foreign
    assert set(seg.ids) == set(content.records)
    assert [tuple(s[:2]) for s in seg.skipped] == content.problems
    for iid, text_ in zip(seg.ids, seg.texts, strict=True):
        attempt, rec = content.records[iid]
        assert text_ == any_record_text({**rec, "unit": unit.id, "attempt": attempt})
    return set(seg.ids), content.problems


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_merger_takes_a_record_line_as_resume_does(sweep: Any, variant: str) -> None:
    sd, unit = sweep
    lines = _written(sd, unit)
    k = next(i for i, ln in enumerate(lines) if '"rel_err"' in ln and i > len(lines) // 2)
    obj = json.loads(lines[k])
    VARIANTS[variant](obj)
    lines[k] = json.dumps(obj, separators=(",", ":"))
    ids, problems = _agree(sd, unit, "\n".join(lines) + "\n")
    taken = variant in ("as written", "keys in another order", "impl spelled at its default", "NaN")
    taken = taken or variant in ("an integer median", "more keys on the line")
    assert (obj.get("id") in ids) == taken
    assert len(ids) == len(unit.items) - (not taken)
    assert [ln for ln, _ in problems] == ([] if taken else [k + 1])


def test_a_number_past_a_double_is_written_as_the_stdlib_writes_it(sweep: Any) -> None:
    """orjson refuses 1e400; the stdlib reads it as an infinity, and writes it as one."""
    sd, unit = sweep
    lines = _written(sd, unit)
    k = next(i for i, ln in enumerate(lines) if '"rel_err"' in ln)
    ids, problems = _agree(sd, unit, "\n".join(_with_rel_err(lines, k, "1e400")) + "\n")
    assert json.loads(lines[k])["id"] in ids and not problems


def test_lines_opening_as_a_record_that_are_not_records_keep_their_place(sweep: Any) -> None:
    """A header or a start line whose first key is "id" is read in its turn, as resume reads it."""
    sd, unit = sweep
    lines = _written(sd, unit)
    k = len(lines) // 2
    again = {"id": "x", **header(sd, unit.id, 2)}
    start = {"id": "y", "start": json.loads(lines[k])["id"], "attempt": 2}
    text = "\n".join([*lines[:k], json.dumps(again), json.dumps(start), *lines[k:]]) + "\n"
    ids, problems = _agree(sd, unit, text)
    assert len(ids) == len(unit.items) and not problems


def _written(sd: Any, unit: Any) -> list[str]:
    from orchestrator.store.synthetic import partial_lines

    return partial_lines(sd, unit, random.Random(1))


def _with_rel_err(lines: list[str], k: int, spelled: str) -> list[str]:
    obj = json.loads(lines[k])
    value = json.dumps(obj["record"]["rel_err"])
    out = list(lines)
    out[k] = lines[k].replace(f'"rel_err":{value}', f'"rel_err":{spelled}', 1)
    assert out[k] != lines[k]
    return out
