"""A unit file (``SWEEP/units/<id>.json``) edited, truncated or copied over so that it no longer
matches its entry in ``units.json``: ``status``, ``merge``, ``resume``, ``run`` and a worker run by
hand (``python -m jobs.worker``) each say in one line which unit file is damaged and how (exit 2,
no traceback), and no record is lost: the partials and the document merged before stay as they
were.

Every command reads a unit file through one reader (``store.unitfile``): each edit is held
through ``status``, and every command for an edit that leaves no JSON and one that keeps the
file's shape with another unit's item in it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import SweepDirError
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import REPO, assert_one_line_error, run_cli


def _truncated(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps(unit)[:40]


def _one_item_less(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps({**unit, "items": unit["items"][:-1]})


def _another_units_file(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps(other)


def _another_units_item(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps({**unit, "items": [other["items"][0], *unit["items"][1:]]})


def _an_item_of_no_unit(unit: dict[str, Any], other: dict[str, Any]) -> str:
    (index, _), *rest = unit["items"]
    return json.dumps({**unit, "items": [[index, "0123456789abcdef"], *rest]})


def _no_items(unit: dict[str, Any], other: dict[str, Any]) -> str:
    return json.dumps({"id": unit["id"], "items": "all"})


EDITS: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any]], str], str]] = {
    "truncated": (_truncated, "is unreadable ("),
    "one item less": (_one_item_less, "does not match its entry in {index} (it lists {less} items, units.json {n})"),
    "another unit's file": (_another_units_file, "does not match its entry in {index} (it names unit {other}, not"),
    "another unit's item": (_another_units_item, "(it lists other items than the {n} it was planned with ("),
    "an item of no unit": (_an_item_of_no_unit, "(it lists other items than the {n} it was planned with ("),
    "no items": (_no_items, "(its items are not a list of [plan position, item id] pairs)"),
}


EVERY_COMMAND = ("truncated", "another unit's item")


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
    commands = [
        ["status", str(sd.root)],
        ["merge", str(sd.root)],
        ["resume", str(sd.root)],
        ["run", str(spec_file), "--sweep-dir", str(sd.root), "--output", str(out)],
    ]
    for argv in commands if edit in EVERY_COMMAND else commands[:1]:
        line = assert_one_line_error(run_cli(*argv), f"unit file {unit_file} ", says)
        assert "the sweep directory is damaged: restore the file from a copy" in line, line
    if edit in EVERY_COMMAND:
        worker = [sys.executable, "-m", "jobs.worker", str(sd.root), units[0].id]
        line = assert_one_line_error(subprocess.run(worker, capture_output=True, text=True, cwd=REPO), says)
        assert line.startswith(f"tilesweep worker: error: unit file {unit_file} "), line
    assert {p: p.read_bytes() for p in [out, *sd.partials.iterdir()]} == before


def test_a_unit_file_planned_with_orjson_is_held_to_the_same_digest_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items' digest units.json keeps is the same bytes' digest whether orjson wrote it or
    the stdlib reads it (``jsonline._orjson`` off: a user without orjson): every unit file of a
    sweep planned with it is accepted there, and one listing another unit's item refused."""
    from orchestrator.store import jsonline, unitfile

    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=2), 2, write_partials=False)
    monkeypatch.setattr(jsonline, "_orjson", None)
    monkeypatch.setattr(unitfile, "_ENTRIES", {})
    for u in units:
        assert unitfile.read_items(sd.root, u.id) == [(it.index, it.id) for it in u.items]
    unit, other = (json.loads(sd.unit_path(u.id).read_text()) for u in units)
    sd.unit_path(units[0].id).write_text(_another_units_item(unit, other))
    with pytest.raises(SweepDirError, match="it lists other items than the"):
        unitfile.read_items(sd.root, units[0].id)
