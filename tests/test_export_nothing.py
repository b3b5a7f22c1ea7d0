"""An export with no entry to write says why, true of each case (no record at all, a plan none of
whose problems was measured, records none of which is timed, best configs the table refuses), in
one line, exit 2, and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import assert_one_line_error, run_cli
from tests.report_helpers import make_doc, merged_from_nothing, rec, write


def _export_refused(doc: Path, *needles: str) -> str:
    out = doc.parent / "tuned.json"
    said = assert_one_line_error(run_cli("export", str(doc), "--out", str(out)), "nothing to export", *needles)
    assert "nothing written" in said and not out.exists(), said
    return said


def test_a_document_merged_from_a_sweep_of_one_problem_that_never_ran_says_it_holds_no_record(
    tmp_path: Path,
) -> None:
    doc = merged_from_nothing(tmp_path, ["fwd"])
    said = _export_refused(doc, f"{doc} holds no record: its one planned problem was not measured")
    assert "has a timed record" not in said


def test_a_document_merged_from_a_sweep_of_several_problems_that_never_ran_counts_them(tmp_path: Path) -> None:
    doc = merged_from_nothing(tmp_path, ["fwd", "fwd_bwd"])
    _export_refused(doc, f"{doc} holds no record: none of its 2 planned problems was measured")


def test_a_document_with_no_record_and_no_plan_says_it_holds_no_record(tmp_path: Path) -> None:
    doc = write(tmp_path, make_doc([]))
    said = _export_refused(doc, f"nothing to export: {doc} holds no record; nothing written")
    assert "problem" not in said


def _failed(seq: int, **tiles: Any) -> dict[str, Any]:
    return rec(ms=None, seq=seq, **tiles)


def test_one_problem_whose_every_record_failed_says_none_of_its_records_is_timed(tmp_path: Path) -> None:
    doc = write(tmp_path, make_doc([_failed(256, auto=True), _failed(256, block_q=64)]))
    _export_refused(doc, f"the one problem in {doc} has records, none of them timed")


def test_several_problems_whose_every_record_failed_say_each_has_records_none_timed(tmp_path: Path) -> None:
    doc = write(tmp_path, make_doc([_failed(256, auto=True), _failed(512, auto=True), _failed(512, block_q=64)]))
    _export_refused(doc, f"each of the 2 problems in {doc} has records, none of them timed")


def test_planned_problems_some_failed_some_never_measured_are_counted_apart(tmp_path: Path) -> None:
    doc = merged_from_nothing(tmp_path, ["fwd", "fwd_bwd"])
    data = json.loads(doc.read_text())
    failed = rec(auto=True, ms=None, dtype="float32", seq=256, batch=1, heads=2, tag=data["config"]["tag"])
    doc.write_text(json.dumps({**data, "results": [failed]}))
    _export_refused(
        doc, f"none of the 2 problems in {doc} has a timed record (1 with records, none of them timed; 1 with none)"
    )


def test_best_configs_the_table_refuses_beside_untimed_problems_say_both(tmp_path: Path) -> None:
    small: dict[str, Any] = {"dtype": "float32", "head_dim": 64, "batch": 1, "heads": 1}
    records = [rec(auto=True, ms=2.0, seq=64, **small), rec(ms=1.0, seq=64, block_q=8, block_k=8, **small)]
    records += [rec(auto=True, ms=None, seq=128, **small)]
    doc = write(tmp_path, make_doc(records, device={"device_kind": "cpu"}))
    _export_refused(
        doc, "left out float32 d64 s64 b1 h1 fwd", "; 1 other problem with no timed record; nothing written"
    )
