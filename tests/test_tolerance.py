"""A config whose output is wrong is never a best config: the worker records it as a
``WrongResult`` error, untimed (real local runs), and the readers take a timed record whose
``rel_err`` is above its limit, or not a number >= 0, as failed (documents another tool wrote,
or edited): report, page, export and compare alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import compare, export, report
from orchestrator.analysis.html import report_page
from orchestrator.spec import tolerance
from orchestrator.spec.model import SweepSpec
from tests.helpers import TINY_SPEC, run_cli
from tests.report_helpers import load_obj, make_doc, rec


def _with_rel_err(r: dict[str, Any], rel_err: float) -> dict[str, Any]:
    return {**r, "rel_err": rel_err}


def _problem(dtype: str = "bfloat16") -> list[dict[str, Any]]:
    """A problem whose two fastest configs have wrong outputs (NaN, then 0.9 of the reference's
    norm) and whose third is right."""
    return [
        rec(auto=True, ms=2.0, dtype=dtype),
        _with_rel_err(rec(ms=0.5, block_q=32, dtype=dtype), float("nan")),
        _with_rel_err(rec(ms=0.6, block_q=64, dtype=dtype), 0.9),
        _with_rel_err(rec(ms=1.0, block_q=128, dtype=dtype), 3e-3),
    ]


def test_a_wrong_output_is_never_the_best_in_report_page_export_or_compare() -> None:
    doc = load_obj(make_doc(_problem()))
    (s,) = report.best_table(doc)
    assert (s.best_label, s.best_ms, s.n_configs, s.n_failed, s.speedup) == ("bq128 bk128 s2 w4", 1.0, 3, 2, 2.0)
    table, summary = export.tuned_table(doc)
    (entry,) = table["entries"]
    assert entry["config"]["block_q"] == 128 and summary.tuned == 1
    (row,) = compare.compare(doc, doc)
    assert row.a is not None and row.a.best_ms == 1.0
    page = report_page(doc)
    assert "2 failed config" in page and "WrongResult: rel_err 0.9 against the reference is above 0.05" in page


def test_a_problem_whose_every_config_is_wrong_is_all_failed_and_says_why() -> None:
    records = [_with_rel_err(rec(ms=0.5, block_q=b, dtype="float32"), 0.02) for b in (32, 64)]
    (s,) = report.best_table(load_obj(make_doc(records)))
    assert s.best_ms is None and s.note == "all failed"
    assert s.first_error == (
        "WrongResult: rel_err 0.02 against the reference is above 0.01 "
        "(the default for float32; check.max_rel_err sets another)"
    )


def test_a_document_checked_with_a_looser_limit_is_read_with_it() -> None:
    """A sweep whose spec set ``check.max_rel_err: 1.0`` timed its 0.9 config: its document's
    readers take that config as a measurement (NaN stays wrong)."""
    doc = load_obj(make_doc(_problem(), tilesweep={"spec": {"check": {"max_rel_err": 1.0}}}))
    (s,) = [s for s in report.best_table(doc) if s.n_configs]  # (the block's spec plans others)
    assert (s.best_label, s.n_failed) == ("bq64 bk128 s2 w4", 1)


@pytest.mark.parametrize(
    ("value", "spelled"), [(float("inf"), "Infinity"), (-1e-3, "-0.001"), (True, "true"), ("0.001", '"0.001"')]
)
def test_a_rel_err_that_is_not_a_number_at_least_zero_is_wrong(value: object, spelled: str) -> None:
    """The error says the value as the document's JSON holds it (``true``, ``"0.001"``)."""
    said = f"WrongResult: rel_err against the reference is {spelled}, not a number >= 0"
    assert tolerance.wrong_result(value, "float32") == said
    (s,) = report.best_table(load_obj(make_doc([_with_rel_err(rec(ms=0.5), value)])))  # type: ignore[arg-type]
    assert s.best_ms is None and s.first_error == said


def test_the_check_section_counts_in_the_fingerprint_only_where_it_is_set() -> None:
    plain = SweepSpec.model_validate(TINY_SPEC)
    assert SweepSpec.model_validate({**TINY_SPEC, "check": {}}).fingerprint() == plain.fingerprint()
    assert SweepSpec.model_validate({**TINY_SPEC, "check": {"max_rel_err": 0.2}}).fingerprint() != plain.fingerprint()


@pytest.mark.parametrize("value", [0, -0.1, "0.1"])
def test_a_max_rel_err_that_is_not_a_positive_number_is_refused(
    value: object, write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(check={"max_rel_err": value})
    r = run_cli("spec", str(spec))
    assert r.returncode == 2 and "check.max_rel_err" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_sweep_whose_outputs_miss_its_limit_records_wrong_results_and_times_none(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A limit below what float32 in interpret mode reaches (about 3e-7): every config, auto
    too, is recorded as a WrongResult error with no timing, and the run says so."""
    spec = write_spec(modes=["fwd"], check={"max_rel_err": 1e-12})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    assert "merged 3 records (3 errors" in r.stderr and "all failed, auto failed" in r.stdout, r.stdout + r.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [x["error"].split(" against")[0].split(" ", 1)[0] for x in doc["results"]] == ["WrongResult:"] * 3
    assert all("above 1e-12 (check.max_rel_err)" in x["error"] and "median_ms" not in x for x in doc["results"])
