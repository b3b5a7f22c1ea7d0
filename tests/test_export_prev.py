"""A tuned table exported over an earlier one: the line says what became of the table there, and
where the export drops entries of problems it does not hold, the table before is kept as
``<out>.prev``; a ``.prev`` there already is refused in one line, nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernels.tuned import TunedTable
from tests.helpers import assert_one_line_error, run_cli
from tests.report_helpers import make_doc, rec, write


def _doc(tmp_path: Path, name: str, seqs: list[int]) -> Path:
    """A document with one timed problem per seq in ``seqs``."""
    records = [r for seq in seqs for r in (rec(auto=True, ms=2.0, seq=seq), rec(ms=1.0, seq=seq))]
    return write(tmp_path, make_doc(records), name)


def _seqs(table: Path) -> list[int]:
    return sorted(e.seq for e in TunedTable.load(table, check_env=False).entries)


def test_an_export_dropping_entries_of_the_table_there_keeps_it_as_prev_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    first = run_cli("export", str(_doc(tmp_path, "a.json", [1024, 2048])), "--out", str(out))
    assert first.returncode == 0 and "replaced" not in first.stdout, first.stdout + first.stderr
    before = out.read_bytes()
    r = run_cli("export", str(_doc(tmp_path, "b.json", [2048, 4096])), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (
        "; replaced the table there (1 entry the same, 1 new entry, 1 entry of problems this export "
        "does not hold dropped; the table before is kept as tuned.json.prev)"
    ) in r.stdout, r.stdout
    assert (tmp_path / "tuned.json.prev").read_bytes() == before
    assert _seqs(out) == [2048, 4096] and _seqs(tmp_path / "tuned.json.prev") == [1024, 2048]


def test_an_export_dropping_entries_where_a_prev_is_kept_already_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    out, prev = tmp_path / "tuned.json", tmp_path / "tuned.json.prev"
    assert run_cli("export", str(_doc(tmp_path, "a.json", [1024, 2048])), "--out", str(out)).returncode == 0
    assert run_cli("export", str(_doc(tmp_path, "b.json", [2048])), "--out", str(out)).returncode == 0
    table, kept = out.read_bytes(), prev.read_bytes()
    r = run_cli("export", str(_doc(tmp_path, "c.json", [4096])), "--out", str(out))
    assert_one_line_error(
        r,
        f"{out}: this export drops 1 entry of the tuned table there",
        "tuned.json.prev there already keeps",
        f"move {prev} away",
    )
    assert out.read_bytes() == table and prev.read_bytes() == kept


def test_an_export_of_every_problem_the_table_there_holds_says_so_and_keeps_no_prev(tmp_path: Path) -> None:
    out, prev = tmp_path / "tuned.json", tmp_path / "tuned.json.prev"
    assert run_cli("export", str(_doc(tmp_path, "a.json", [1024])), "--out", str(out)).returncode == 0
    prev.write_text("an earlier table the user keeps\n")  # nothing is dropped: it is no matter
    r = run_cli("export", str(_doc(tmp_path, "b.json", [1024, 2048])), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("; replaced the table there (1 entry the same, 1 new entry)"), r.stdout
    assert prev.read_text() == "an earlier table the user keeps\n" and _seqs(out) == [1024, 2048]


def test_an_export_of_the_same_document_again_says_nothing_changed(tmp_path: Path) -> None:
    out, doc = tmp_path / "tuned.json", _doc(tmp_path, "a.json", [1024, 2048])
    assert run_cli("export", str(doc), "--out", str(out)).returncode == 0
    before = out.read_bytes()
    r = run_cli("export", str(doc), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("; replaced the table there with the same 2 entries (nothing changed)"), r.stdout
    assert "measured again" not in r.stdout and out.read_bytes() == before


def test_an_export_of_other_timings_of_the_problems_the_table_holds_says_how_many_changed(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    assert run_cli("export", str(_doc(tmp_path, "a.json", [1024, 2048])), "--out", str(out)).returncode == 0
    records = [rec(auto=True, ms=2.0, seq=1024), rec(ms=1.0, seq=1024), rec(auto=True, ms=2.0, seq=2048)]
    records += [rec(ms=1.5, seq=2048), rec(auto=True, ms=2.0, seq=4096), rec(ms=1.0, seq=4096)]
    r = run_cli("export", str(write(tmp_path, make_doc(records), "b.json")), "--out", str(out))
    assert r.returncode == 0, r.stderr
    said = "; replaced the table there (1 entry the same, 1 entry changed, 1 new entry)"
    assert r.stdout.rstrip().endswith(said), r.stdout
    assert [e.median_ms for e in TunedTable.load(out, check_env=False).entries] == [1.0, 1.5, 1.0]


def test_the_refusal_is_the_one_line_said_also_where_a_problem_would_be_noted_as_left_out(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    assert run_cli("export", str(_doc(tmp_path, "a.json", [1024])), "--out", str(out)).returncode == 0
    assert run_cli("export", str(_doc(tmp_path, "b.json", [2048])), "--out", str(out)).returncode == 0
    before = out.read_bytes()
    small: dict[str, Any] = {"dtype": "float32", "head_dim": 64, "batch": 1, "heads": 1}
    records = [rec(auto=True, ms=2.0, seq=64, **small), rec(ms=1.0, seq=64, block_q=8, block_k=8, **small)]
    records += [rec(auto=True, ms=2.0, seq=128, **small), rec(ms=1.0, seq=128, block_q=16, block_k=16, **small)]
    doc = write(tmp_path, make_doc(records, device={"device_kind": "cpu"}), "interpret.json")
    said = assert_one_line_error(run_cli("export", str(doc), "--out", str(out)), "this export drops 1 entry")
    assert "left out" not in said and out.read_bytes() == before
