"""A unit file (``SWEEP/units/<id>.json``) edited, truncated or copied over so that it no longer
matches its entry in ``units.json``: ``status``, ``merge``, ``resume`` and ``run`` each say in one
line which unit file is damaged and how (exit 2, no traceback), and no record is lost: the
partials and the document merged before stay as they were."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import assert_one_line_error, run_cli


def _truncated(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps(unit)[:40]


def _one_item_less(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps({**unit, "items": unit["items"][:-1]})


def _another_units_file(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps(other)


def _no_items(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps({"id": unit["id"], "items": "all"})


EDITS: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any]], str], str]] = {
    "truncated": (_truncated, "is unreadable ("),
    "one item less": (_one_item_less, "does not match its entry in {index} (it lists {less} items, units.json {n})"),
    "another unit's file": (_another_units_file, "does not match its entry in {index} (it names unit {other}, not"),
    "no items": (_no_items, "(its items are not a list of [plan position, item id] pairs)"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_unit_file_is_named_by_every_command_and_no_record_is_lost(tmp_path: Path, edit: str) -> None:
    spec = small_spec(n_seqs=2)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    out = tmp_path / "doc.json"
    sd, units = build_sweep(tmp_path / "sweep", spec, 2, output=out)
    assert run_cli("merge", str(sd.root)).returncode == 0
    unit_file = sd.unit_path(units[0].id)
    unit, other = (json.loads(sd.unit_path(u.id).read_text()) for u in units)
    make, says = EDITS[edit]
    unit_file.write_text(make(unit, other))
    before = {p: p.read_bytes() for p in [out, *sd.partials.iterdir()]}
    n = len(unit["items"])
    says = says.format(index=sd.root / "units.json", less=n - 1, n=n, other=other["id"])
    for argv in (
        ["status", str(sd.root)],
        ["merge", str(sd.root)],
        ["resume", str(sd.root)],
        ["run", str(spec_file), "--sweep-dir", str(sd.root), "--output", str(out)],
    ):
        line = assert_one_line_error(run_cli(*argv), f"unit file {unit_file} ", says)
        assert "the sweep directory is damaged: restore the file from a copy" in line, line
    assert {p: p.read_bytes() for p in [out, *sd.partials.iterdir()]} == before
