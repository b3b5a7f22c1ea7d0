"""The report page where a document or its path is out of the ordinary: the sweep's own page
over a file that is not one, lowering's prunes, untagged problems, one problem, a failed auto,
the temp file a killed writer left, a problem of only auto records, and a document sweeps appended
into in turn."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.analysis import html, report
from tests.conftest import run_cli
from tests.helpers import assert_one_line_error
from tests.report_helpers import load_obj, make_doc, rec


def test_the_sweeps_own_page_never_replaces_what_is_not_a_page_and_writes_through_a_link(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """``report.html: true`` writes its page where ``--html`` would: a file there that is not a
    page is refused before anything runs (it is the user's), and a link to a page writes the
    page it points to, the link kept."""
    spec = write_spec(report={"html": True}, modes=["fwd"], fwd_block_q=[32])
    page = tmp_path / "results.html"
    for notes in ("precious notes", "<!DOCTYPE html>\n<html><head><title>my notes</title></head></html>"):
        page.write_text(notes)  # a hand-written HTML file is no tilesweep page either
        r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
        assert_one_line_error(r, f"{page} exists and is not a tilesweep page", "report.html to false")
        assert page.read_text() == notes and not (tmp_path / "sweep").exists()
    page.unlink()
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "real.html").write_text(html.report_page(load_obj(make_doc([rec(ms=5.0)]))))
    page.symlink_to(Path("pages") / "real.html")
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    written = (tmp_path / "pages" / "real.html").read_text()
    assert page.is_symlink() and "<title>tilesweep report: results.json</title>" in written


def test_configs_pre_flight_lowering_refused_are_said_so_and_a_mosaic_heatmap_folds_its_own_axes() -> None:
    """A Mosaic GPU document (no shared-memory model: what was pruned, pre-flight lowering
    refused): the page names lowering as the reason, not the smem model, and its heatmap says it
    takes the best over the kernel's own other fields, not the Triton kernels' stages and warps."""
    mosaic: dict[str, Any] = {"impl": "mosaic", "use_schedule_barrier": True}

    def forced(block_q: int, steps: int, **kw: Any) -> dict[str, Any]:
        r = rec(dtype="float16", block_q=block_q, block_kv=128, max_concurrent_steps=steps, **mosaic, **kw)
        return {k: v for k, v in r.items() if k not in ("block_k", "num_stages", "num_warps")}

    refused = "LoweringRefused: ValueError: Mosaic GPU kernel exceeds available shared memory (pre-flight lowering)"
    records = [
        {**rec(auto=True, dtype="float16"), "impl": "mosaic"},
        forced(64, 2, ms=1.0),
        forced(128, 2, ms=0.9),
        {**forced(256, 4, error=refused), "pruned": True, "smem_bytes": 329816},
    ]
    page = html.report_page(load_obj(make_doc(records)))
    assert "pruned (pre-flight lowering refused it; not run)" in page and "322 KiB" in page
    assert "the shared-memory model predicted" not in page
    assert "best over max_concurrent_steps, use_schedule_barrier" in page and "stages, warps" not in page


def test_untagged_problems_have_a_filter_value_of_their_own_and_a_title_that_says_so() -> None:
    """A document holding tagged and untagged problems: the tag filter offers the untagged ones
    as a value of their own (an empty value is the filter's "all"), and their cards say so."""
    records = [rec(tag="", ms=1.0), rec(tag="", auto=True), rec(tag="h100", ms=2.0), rec(tag="h100", auto=True)]
    page = html.report_page(load_obj(make_doc(records)))
    select = re.search(r'<select name="tag"[^>]*>(.*?)</select>', page)
    assert select is not None
    values = re.findall(r'<option value="([^"]*)">', select[1])
    assert values == ["", "(no tag)", "h100"] or values == ["", "h100", "(no tag)"], values
    assert "[no tag]" in page and "fwd []" not in page


def test_a_page_of_one_problem_counts_it_in_the_singular_and_shows_its_spec_text_as_written() -> None:
    page = html.report_page(load_obj(make_doc([rec(ms=1.0, tag="é✓")])))
    assert "1 record, " in page and "1 problem" in page and "1 problems" not in page and "1 records" not in page
    doc = make_doc([rec(ms=1.0)], tilesweep={"spec": {"tag": "é✓"}})
    spec_text = html.report_page(load_obj(doc))
    assert "&quot;tag&quot;: &quot;é✓&quot;" in spec_text and "\\u00e9" not in spec_text


def test_the_temp_file_of_a_page_writer_killed_before_goes_when_the_page_is_written(tmp_path: Path) -> None:
    """``kill -9`` of ``report --html`` mid-write leaves its hidden temp file; the next write of
    that page removes it (its writer is dead), and leaves a live writer's alone."""
    import socket
    import subprocess
    import sys

    from orchestrator.store.files import temp_stem

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    page = tmp_path / "report.html"
    left = tmp_path / f".{temp_stem(page.name)}.{socket.gethostname()}.{int(dead.stdout)}.0123abcd.tmp"
    left.write_text("<!DOCTYPE html><html>cut")
    live = tmp_path / f".{temp_stem(page.name)}.{socket.gethostname()}.{os.getpid()}.89abcdef.tmp"
    live.write_text("<!DOCTYPE html><html>being written")
    html.write_page(page, html.report_page(load_obj(make_doc([rec(ms=1.0)]))))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([page.name, live.name])


def test_why_auto_failed_is_on_the_page_beside_auto_failed() -> None:
    records = [rec(ms=1.0), rec(auto=True, error="WrongResult: rel_err 2.4e-07 against the reference is above 1e-30")]
    page = html.report_page(load_obj(make_doc(records)))
    assert "auto failed (WrongResult: rel_err 2.4e-07 against the reference is above 1e-30)" in page
    (s,) = report.best_table(load_obj(make_doc(records)))
    assert s.auto_error is not None and s.auto_error.startswith("WrongResult") and s.to_json()["auto_error"]


def test_a_reference_document_with_only_auto_for_a_problem_says_no_tile_config_was_measured(
    sample_doc: dict[str, Any], tmp_path: Path
) -> None:
    """A document in the reference run's format (no tilesweep block) that holds only the auto
    record of a problem, its forced configs absent: the report and the page say that only the
    kernel's own choice was measured, not "auto only", which reads as a sweep of auto alone."""
    first = sample_doc["results"][0]
    problem = ("dtype", "head_dim", "seq", "mode")
    sample_doc["results"] = [
        r
        for r in sample_doc["results"]
        if r["config"] == "auto" or any(r[f] != first[f] for f in problem)  # its forced records gone
    ]
    results, page = tmp_path / "results.json", tmp_path / "page.html"
    results.write_text(json.dumps(sample_doc))
    r = run_cli("report", str(results), "--html", str(page))
    assert r.returncode == 0, r.stderr
    only = "only the kernel's own choice (auto) was measured; no tile config was"
    (row,) = [line for line in r.stdout.splitlines() if line.endswith(only)]
    assert row.split()[:6] == [first["dtype"], str(first["head_dim"]), str(first["seq"]), "4", "8", first["mode"]]
    assert "auto only" not in r.stdout
    assert f"no best config: {only}".replace("'", "&#x27;") in page.read_text()


def test_the_page_of_a_document_sweeps_appended_into_in_turn_names_each_sweep(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """Two sweeps of other specs appended into one document in turn (``append: true``): the
    page's provenance names each sweep, oldest first, with what it planned and when it measured
    and merged, and dates the records from the first sweep's start to the last one's end."""
    for n, seq in enumerate((64, 128)):
        spec = write_spec(f"spec{n}.json", append=True, modes=["fwd"], fwd_block_q=[32], seq_lens=[seq])
        r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / f"sweep{n}"), "--executor", "debug")
        assert r.returncode == 0, r.stderr
    page = tmp_path / "page.html"
    r = run_cli("report", str(tmp_path / "results.json"), "--html", str(page))
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    own = json.loads((tmp_path / "results.json").read_text())["tilesweep"]
    every = [*own["earlier"], own]
    assert [b["sweep_dir"] for b in every] == [str(tmp_path / "sweep0"), str(tmp_path / "sweep1")]
    named = [text.find(f"{b['sweep_dir']} {b['fingerprint']} ({b['planned']} planned items, measured ") for b in every]
    assert -1 < named[0] < named[1], named
    for b in every:
        assert f"merged {b['merged']})" in text
    attempts = [a for b in every for unit in b["attempts"].values() for a in unit]
    first, last = min(a["started"] for a in attempts), max(a.get("ended") or a["started"] for a in attempts)
    assert f"<dt>measured</dt><dd>{first if first == last else f'{first} to {last}'}</dd>" in text
