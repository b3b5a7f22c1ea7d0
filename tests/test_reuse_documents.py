"""Reuse documents as users hand them over: damaged records, values no worker writes, records
carried before, documents holding nothing of the plan; and what a dry run leaves beside them
(nothing)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from orchestrator.control.reuseplan import ReuseRequest
from tests.conftest import run_cli
from tests.helpers import assert_one_line_error
from tests.reuse_helpers import EXTENDED, FIRST, plan_against, write


def test_damaged_records_are_measured_with_a_warning_naming_the_file(
    tmp_path: Path, first_doc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doc = json.loads(first_doc.read_text())
    first, second = doc["results"][:2]
    first["median_ms"], second["q3_ms"] = "fast", "slow"  # damaged two ways: the first is named
    damaged = write(tmp_path, "damaged.json", doc)
    with caplog.at_level(logging.WARNING):
        planned = plan_against(tmp_path, EXTENDED, ReuseRequest([str(damaged)]))
    assert planned.found.reused == 0 and planned.found.sources[0].damaged == 2
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(damaged) in warning and "2 damaged records not reused (first: " in warning, warning
    assert "median_ms is str" in warning and warning.count("first:") == 1, warning


@pytest.mark.parametrize("value", [-5.0, float("nan"), 0.0])
def test_a_record_holding_a_value_no_worker_writes_is_measured_not_carried(
    tmp_path: Path, first_doc: Path, caplog: pytest.LogCaptureFixture, value: float
) -> None:
    """A timing edited by hand out of what a document may hold (negative, NaN, zero): carried,
    it would make a document that ``report`` and ``export`` refuse. Refused as damaged, with
    the field named, whether the plan matches records through the key index it builds or parses
    each one (a document holding a record of another tag)."""
    for where in ("indexed", "parsed"):
        doc = json.loads(first_doc.read_text())
        doc["results"][0]["median_ms"] = value
        if where == "parsed":
            doc["results"].append({**doc["results"][1], "tag": "another"})
        folder = tmp_path / where
        folder.mkdir()
        edited = write(folder, "edited.json", doc)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            planned = plan_against(folder, EXTENDED, ReuseRequest([str(edited)]))
        assert planned.found.reused == 1 and planned.found.sources[0].damaged == 1, where
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert "1 damaged records not reused (first: median_ms is " in warning, warning


def test_a_reuse_document_that_is_not_one_is_one_line(tmp_path: Path) -> None:
    spec = write(tmp_path, "spec.json", {**EXTENDED, "output": str(tmp_path / "out.json")})
    notes = tmp_path / "notes.json"
    notes.write_text('{"results": "soon"}')
    r = run_cli("plan", str(spec), "--dry-run", "--reuse", str(notes))
    assert_one_line_error(r, f"--reuse {notes}", "not a results document")
    listed = write(tmp_path, "listed.json", {**EXTENDED, "reuse": {"documents": [str(tmp_path / "missing.json")]}})
    r = run_cli("run", str(listed), "--sweep-dir", str(tmp_path / "s"))
    assert_one_line_error(r, f"reuse.documents {tmp_path / 'missing.json'}", "no such file")
    assert not (tmp_path / "s").exists()


def test_a_dry_run_writes_no_key_index_beside_a_reuse_document(tmp_path: Path, first_doc: Path) -> None:
    """``plan --dry-run`` writes nothing, not even the key index a plan leaves beside a reuse
    document that has none (its folder may be someone else's, or read-only to all but root)."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    doc = folder / "results.json"
    shutil.copy(first_doc, doc)
    spec = write(tmp_path, "extended.json", {**EXTENDED, "output": str(tmp_path / "out.json")})
    r = run_cli("plan", str(spec), "--dry-run", "--reuse", str(doc))
    assert r.returncode == 0 and "reused 2 items" in r.stdout, r.stdout + r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["results.json"]
    r = run_cli("plan", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--reuse", str(doc))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in folder.iterdir()) == [".results.json.keys", "results.json"]


def test_a_record_carried_twice_names_the_measurement_and_its_time_not_the_sweep_that_carried_it(
    tmp_path: Path, first_doc: Path
) -> None:
    """A → B → C: C's records say where they were measured (A's unit and attempt) and when (A's
    attempt start), as B's do, not B's reuse unit and B's plan time; so ``export`` of C beside a
    newer measurement of the same configs keeps the newer one."""
    docs = {}
    source = first_doc
    for name in ("b", "c"):
        spec = write(tmp_path, f"{name}.json", {**FIRST, "append": False, "output": str(tmp_path / f"{name}.out.json")})
        r = run_cli(
            "run", str(spec), "--sweep-dir", str(tmp_path / name), "--reuse", str(source), "--executor", "debug"
        )
        assert r.returncode == 0 and "reused 2 items" in r.stderr, r.stderr
        source = tmp_path / f"{name}.out.json"
        docs[name] = json.loads(source.read_text())
    b = {rec["config"]: rec["reused_from"] for rec in docs["b"]["results"]}
    c = {rec["config"]: rec["reused_from"] for rec in docs["c"]["results"]}
    assert c == b and all(v.startswith(f"{first_doc} unit ") for v in c.values()), c
    assert docs["c"]["tilesweep"]["reused"]["measured"] == docs["b"]["tilesweep"]["reused"]["measured"]


def test_a_dry_run_submit_that_reuses_everything_says_how_to_get_the_document(tmp_path: Path, first_doc: Path) -> None:
    """Every item reused: nothing to submit, and the dry run made no sweep directory, so the way
    to the document is to plan it (submit, with the same --reuse) and merge, not to merge a
    folder that does not exist."""
    spec = write(tmp_path, "spec.json", {**FIRST, "output": str(tmp_path / "out.json"), "executor": {"kind": "slurm"}})
    sweep = tmp_path / "sweep"
    r = run_cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run", "--reuse", str(first_doc))
    assert r.returncode == 0, r.stderr
    assert f"`tilesweep submit {spec} --sweep-dir {sweep} --reuse {first_doc}` plans the sweep directory" in r.stdout
    assert "`tilesweep merge" in r.stdout and not sweep.exists()


def test_a_submit_that_reuses_everything_names_merge_and_nothing_to_follow(tmp_path: Path, first_doc: Path) -> None:
    """Every item reused: submit plans the sweep directory, submits nothing and says `merge`
    writes the document; it does not send the user to `status` or `wait` for a sweep nothing runs."""
    spec = write(tmp_path, "spec.json", {**FIRST, "output": str(tmp_path / "out.json"), "executor": {"kind": "slurm"}})
    sweep = tmp_path / "sweep"
    r = run_cli("submit", str(spec), "--sweep-dir", str(sweep), "--reuse", str(first_doc))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == f"every unit is done; nothing to submit (`tilesweep merge {sweep}` writes the document)", lines
    assert "follow with" not in r.stdout + r.stderr and "submitted" not in r.stdout, r.stdout
    merged = run_cli("merge", str(sweep))
    assert merged.returncode == 0, merged.stderr
    assert len(json.loads((tmp_path / "out.json").read_text())["results"]) == 2


def test_a_reuse_document_holding_no_item_of_the_plan_is_named_not_passed_over(tmp_path: Path, first_doc: Path) -> None:
    spec = write(tmp_path, "spec.json", {**FIRST, "output": str(tmp_path / "out.json"), "dtypes": ["bfloat16"]})
    r = run_cli("plan", str(spec), "--dry-run", "--reuse", str(first_doc))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = lines.index("nothing reused: every planned item is measured")  # not "reused 0 items ...: none"
    assert lines[at + 1].startswith(f"  nothing reused from {first_doc}: none of its records is an item of this plan")


def test_records_of_another_device_kind_name_it_as_json_spells_it(tmp_path: Path, first_doc: Path) -> None:
    """The plan's line on what it did not reuse names the other device kind as the warning does
    and as the document holds it ("NVIDIA H100"), not as Python quotes a string."""
    doc = json.loads(first_doc.read_text())
    doc["device"]["device_kind"] = doc["tilesweep"]["env"]["device_kind"] = "NVIDIA H100"
    for rec in doc["results"]:
        if "device_kind" in rec:
            rec["device_kind"] = "NVIDIA H100"
    other = write(tmp_path, "h100.json", doc)
    spec = write(tmp_path, "spec.json", {**FIRST, "output": str(tmp_path / "out.json")})
    r = run_cli("plan", str(spec), "--dry-run", "--reuse", str(other))
    assert r.returncode == 0, r.stderr
    said = f'not reused from {other}: 2 of another device kind ("NVIDIA H100")'
    assert said in r.stdout and "'NVIDIA H100'" not in r.stdout + r.stderr, r.stdout
