"""Merging refuses what it cannot trust: a partial of another spec, environment, unit or schema,
or no partial at all, is quarantined (never merged, never deleted); a damaged line is skipped
with a warning naming file and line, and its item counts as missing."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from orchestrator.spec.records import item_id
from orchestrator.store.merge import merge
from orchestrator.store.sweepdir import SweepDir
from tests.helpers import assert_one_line_error
from tests.merging import Sweep, four_units, read_doc

from .conftest import run_cli


@pytest.fixture
def sweep(tmp_path: Path) -> Sweep:
    return four_units(tmp_path)


def _quarantined(sd: SweepDir) -> list[Path]:
    return sorted(p for p in (sd.root / "quarantine").glob("*") if p.name != "quarantine.jsonl")


@pytest.mark.parametrize("case", ["other spec", "other env", "other schema", "other unit", "garbage", "no header"])
def test_foreign_or_damaged_partial_is_quarantined_never_merged_never_deleted(
    sweep: Sweep, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    sd, units = sweep
    victim = units[2]
    path = sd.partial_path(victim.id)
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    if case == "other spec":
        head["header"]["sweep"] = "0123456789abcdef"
    elif case == "other env":
        head["header"]["env"] = {**head["header"]["env"], "jax": "0.4.30", "device_kind": "NVIDIA A100"}
    elif case == "other schema":
        head["header"]["schema"] = 7
    elif case == "other unit":
        head["header"]["unit"] = units[0].id
    lines[0] = json.dumps(head)
    if case == "garbage":
        lines = ["\x00\x01 this is not a partial", "PK\x03\x04"]
    if case == "no header":
        lines = lines[1:]
    path.write_text("\n".join(lines) + "\n")
    original = path.read_bytes()
    with caplog.at_level(logging.WARNING):
        summary = merge(sd)
    assert not path.exists()
    moved = _quarantined(sd)
    assert len(moved) == 1 and moved[0].read_bytes() == original  # nothing deleted
    assert [q.source for q in summary.quarantined] == [path]
    assert str(path) in caplog.text and str(moved[0]) in caplog.text
    doc = read_doc(sd.output)
    ids = {item_id(r) for r in doc["results"]}
    assert ids == {it.id for u in units if u is not victim for it in u.items}
    log = [json.loads(line) for line in (sd.root / "quarantine" / "quarantine.jsonl").read_text().splitlines()]
    assert log[0]["file"] == str(path) and log[0]["moved_to"] == moved[0].name
    # the CLI run shows one line naming the file too; the unit counts as missing, not lost
    assert summary.missing == len(victim.items)


def test_quarantine_refuses_when_it_cannot_move(sweep: Sweep) -> None:
    """Where the file cannot be moved aside, the merge stops naming it (never merges it)."""
    from orchestrator.errors import PartialError

    sd, units = sweep
    path = sd.partial_path(units[0].id)
    path.write_text("garbage\n")
    (sd.root / "quarantine").write_text("a file where the quarantine folder should be")
    before = sd.output.exists()
    with pytest.raises(PartialError, match=str(path)):
        merge(sd)
    assert path.read_text() == "garbage\n" and sd.output.exists() == before
    r = run_cli("merge", str(sd.root))
    assert_one_line_error(r, str(path))


def test_invalid_record_line_is_skipped_with_a_warning_and_counts_as_missing(
    sweep: Sweep, caplog: pytest.LogCaptureFixture
) -> None:
    sd, units = sweep
    path = sd.partial_path(units[0].id)
    lines = path.read_text().splitlines()
    n = next(i for i, ln in enumerate(lines) if '"median_ms"' in ln)
    obj = json.loads(lines[n])
    obj["record"]["median_ms"] = "0.1 ms"
    lines[n] = json.dumps(obj)
    lines.append(lines[n][:40])  # and a torn last line, of the same item (one recorded elsewhere would be moot)
    path.write_text("\n".join(lines))
    with caplog.at_level(logging.WARNING):
        summary = merge(sd)
    assert f"{path} line {n + 1}" in caplog.text and "wrong type" in caplog.text
    assert f"{path} line {len(lines)}: the last line, incomplete" in caplog.text
    assert obj["id"] not in {item_id(r) for r in read_doc(sd.output)["results"]}
    assert summary.missing == 1 and summary.skipped_lines == 2
    assert path.exists()  # a damaged line is not a foreign file


def test_stray_file_in_partials_is_named_and_not_merged(sweep: Sweep, caplog: pytest.LogCaptureFixture) -> None:
    sd, _ = sweep
    stray = sd.partials / "copied-from-elsewhere.jsonl"
    stray.write_text("{}\n")
    with caplog.at_level(logging.WARNING):
        merge(sd)
    assert str(stray) in caplog.text and stray.exists()
