"""compare: two documents problem by problem, B/A, and problems found in only one."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import compare
from orchestrator.store import document as results_doc
from tests.helpers import run_cli
from tests.report_helpers import make_doc, merged_from_nothing, rec, run_handler, write


def docs() -> tuple[results_doc.ResultsDoc, results_doc.ResultsDoc]:
    a = make_doc([rec(ms=1.0, block_q=64), rec(ms=1.2), rec("fwd_bwd", ms=3.0), rec(ms=2.0, seq=4096)], tag="a")
    b = make_doc(
        [
            rec(ms=0.5, block_q=128, tag="other"),
            rec(ms=0.9, block_q=64, tag="other"),
            rec("fwd_bwd", ms=3.0, tag="other"),
            rec(ms=5.0, seq=8192, tag="other"),
        ]
    )
    b["device"] = {"jax": "0.12.0", "device_kind": "NVIDIA H200"}
    return results_doc.from_obj(a, name="a.json"), results_doc.from_obj(b, name="b.json")


def test_compare_matches_across_tags_and_lists_one_sided() -> None:
    a, b = docs()
    rows = compare.compare(a, b)
    keyed = {(r.key.seq, r.key.mode): r for r in rows}
    assert [(r.key.seq, r.key.mode) for r in rows] == [(2048, "fwd"), (2048, "fwd_bwd"), (4096, "fwd"), (8192, "fwd")]
    fwd = keyed[(2048, "fwd")]
    assert fwd.presence == "both" and fwd.key.tag is None
    assert fwd.a is not None and fwd.a.best_label == "bq64 bk128 s2 w4"
    assert fwd.b is not None and fwd.b.best_label == "bq128 bk128 s2 w4"
    assert fwd.ratio == pytest.approx(0.5 / 1.0)
    assert not fwd.same_config
    both = keyed[(2048, "fwd_bwd")]
    assert both.ratio == 1.0 and both.same_config and both.note == "same config"
    assert keyed[(4096, "fwd")].presence == "only A" and keyed[(4096, "fwd")].ratio is None
    assert keyed[(8192, "fwd")].presence == "only B" and keyed[(8192, "fwd")].note == "only in B"


def test_compare_text_markdown_json() -> None:
    a, b = docs()
    rows = compare.compare(a, b)
    text = compare.format_compare(rows, doc_a=a, doc_b=b)
    lines = text.splitlines()
    assert lines[0] == "A: a.json (NVIDIA H100, jax 0.11.2)"
    assert lines[1] == "B: b.json (NVIDIA H200, jax 0.12.0)"
    assert "0.500" in text and "only in A" in text and "only in B" in text
    assert "tag" not in lines[3].split()
    md = compare.format_compare(rows, "markdown", doc_a=a, doc_b=b)
    assert "| dtype |" in md and "`a.json (NVIDIA H100, jax 0.11.2)`" in md
    # the documents' list ends with a blank line before the table, which GitHub renders as a table only then
    listed = "- A: `a.json (NVIDIA H100, jax 0.11.2)`\n- B: `b.json (NVIDIA H200, jax 0.12.0)`\n"
    assert md.startswith(listed + "\n| dtype |")
    data = compare.to_json(rows, a, b)
    json.dumps(data)
    assert data["b"]["device"]["device_kind"] == "NVIDIA H200"
    assert [p["presence"] for p in data["problems"]] == ["both", "both", "only A", "only B"]
    assert data["problems"][0]["ratio_b_over_a"] == pytest.approx(0.5)
    assert data["problems"][2]["b"] is None


def test_several_tags_in_one_doc_keep_tag_in_key() -> None:
    a = results_doc.from_obj(make_doc([rec(ms=1.0, tag="x"), rec(ms=2.0, tag="y")]), name="a")
    b = results_doc.from_obj(make_doc([rec(ms=1.5, tag="x")]), name="b")
    rows = compare.compare(a, b)
    assert [(r.key.tag, r.presence) for r in rows] == [("x", "both"), ("y", "only A")]
    assert rows[0].ratio == 1.5
    assert "tag" in compare.format_compare(rows).splitlines()[0].split()


def test_no_timing_on_one_side() -> None:
    a = results_doc.from_obj(make_doc([rec(ms=None)]), name="a")
    b = results_doc.from_obj(make_doc([rec(ms=1.0)]), name="b")
    (row,) = compare.compare(a, b)
    assert row.ratio is None and row.note == "no timing in A"


def test_sample_against_itself_scaled(sample_doc: dict[str, Any]) -> None:
    faster = copy.deepcopy(sample_doc)
    for r in faster["results"]:
        for k in ("median_ms", "q1_ms", "q3_ms"):
            if k in r:
                r[k] *= 0.8
    rows = compare.compare(results_doc.from_obj(sample_doc), results_doc.from_obj(faster))
    assert rows and all(r.ratio == pytest.approx(0.8) and r.same_config for r in rows)


def test_cli_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = docs()
    pa = write(tmp_path, {"device": a.device, "config": a.config, "results": a.results}, "a.json")
    pb = write(tmp_path, {"device": b.device, "config": b.config, "results": b.results}, "b.json")
    rc, out, err = run_handler(["compare", str(pa), str(pb)], capsys)
    assert rc == 0 and "only in B" in out
    assert (
        "tilesweep: note: A was measured on NVIDIA H100, B on NVIDIA H200" in err and "no problem in common" not in err
    )
    only = write(tmp_path, {"device": a.device, "config": a.config, "results": [rec(ms=1.0, seq=512)]}, "c.json")
    rc, out, err = run_handler(["compare", str(pa), str(only)], capsys)
    assert rc == 0 and "A and B have no problem in common (they differ in seq)" in err and "measured on" not in err
    causal = [dict(r, causal=True) for r in a.results if r["mode"] == "fwd"]
    pc = write(tmp_path, {"device": a.device, "config": a.config, "results": causal}, "causal.json")
    page = tmp_path / "c.html"
    rc, out, err = run_handler(["compare", str(pa), str(pc), "--html", str(page)], capsys)
    said = "A and B have no problem in common (they differ in causal): no B/A to give"
    assert rc == 0 and said in err, err
    assert f'<p class="note caveat">{said}</p>' in page.read_text()  # the page says what the command said
    failed = [dict(r, error="Boom", median_ms=None) for r in a.results]  # A's problems, none timed in B
    pf = write(tmp_path, {"device": a.device, "config": a.config, "results": failed}, "failed.json")
    rc, out, err = run_handler(["compare", str(pa), str(pf)], capsys)
    assert rc == 0 and "no problem has a best timing in both A and B" in err, err
    rc, out, _ = run_handler(["compare", str(pa), str(pb), "--json"], capsys)
    assert rc == 0 and len(json.loads(out)["problems"]) == 4
    rc, out, _ = run_handler(["compare", str(pa), str(pb), "--markdown"], capsys)
    assert rc == 0 and "|" in out


def test_what_keeps_two_documents_apart_and_the_legend_name_the_tag_only_where_it_joined_the_match() -> None:
    """Tags join the match only where a document holds one problem under several: otherwise a
    tag is never the reason two documents share no problem, and the page's legend says which."""
    from orchestrator.analysis import compare_html

    a = results_doc.from_obj(make_doc([rec(ms=1.0, seq=2048, tag="a")]), name="a")
    b = results_doc.from_obj(make_doc([rec(ms=1.0, seq=4096, tag="b")]), name="b")
    rows = compare.compare(a, b)
    (said,) = [c for c in compare.caveats(rows, a, b) if "no problem in common" in c]
    assert "(they differ in seq)" in said, said
    assert "without the tag" in compare_html.compare_page(a, b)
    two = results_doc.from_obj(make_doc([rec(ms=1.0, tag="x"), rec(ms=2.0, tag="y")]), name="two")
    page = compare_html.compare_page(two, two)
    assert "matched on their axes and their tag and kernel implementation" in page and "without the tag" not in page


def test_two_kernels_measured_apart_are_named_and_never_the_same_config() -> None:
    a = results_doc.from_obj(make_doc([rec(ms=1.0), rec(auto=True)]), name="a")
    jax = [dict(r, impl="jax") for r in (rec(ms=0.8), rec(auto=True))]
    b = results_doc.from_obj(make_doc(jax), name="b")
    (row,) = compare.compare(a, b)
    assert not row.same_config and row.note == "A tilesweep, B jax"
    (said,) = compare.caveats([row], a, b)
    assert said == (
        "A and B were measured with different kernel implementations (A tilesweep, B jax): B/A compares the kernels "
        "as much as their configs"
    )


def test_one_file_given_as_a_and_b_is_noted_as_compared_with_itself(tmp_path: Path) -> None:
    doc = write(tmp_path, make_doc([rec(ms=1.0), rec(auto=True, ms=2.0)]), "a.json")
    link = tmp_path / "link.json"
    link.symlink_to(doc)
    for b, names in ((doc, f"{doc}"), (link, f"{doc} and {link}")):
        r = run_cli("compare", str(doc), str(b))
        assert r.returncode == 0, r.stderr
        (note,) = r.stderr.splitlines()
        assert note == (
            f"tilesweep: note: A and B are one file ({names}): it is compared with itself, so B/A is 1 wherever it "
            "has a timing; name two results documents to compare"
        )
        assert "1.000" in r.stdout


def test_two_files_are_not_noted_as_one(tmp_path: Path) -> None:
    a = write(tmp_path, make_doc([rec(ms=1.0)]), "a.json")
    b = write(tmp_path, make_doc([rec(ms=1.0)]), "b.json")
    r = run_cli("compare", str(a), str(b))
    assert r.returncode == 0 and "one file" not in r.stderr, r.stderr


def test_a_document_merged_from_nothing_is_named_as_holding_no_record(tmp_path: Path) -> None:
    empty = merged_from_nothing(tmp_path, ["fwd"])
    other = write(tmp_path, make_doc([rec(ms=1.0)]), "other.json")
    r = run_cli("compare", str(empty), str(other))
    assert r.returncode == 0, r.stderr
    a, b = r.stdout.splitlines()[:2]
    assert a == f"A: {empty} (no record: measured on no device)" and "?" not in a
    assert b == f"B: {other} (NVIDIA H100, jax 0.11.2)"


@pytest.mark.parametrize(
    "device, said",
    [
        ({}, "its device block names no device kind and no jax version"),
        ({"device_kind": "NVIDIA H100"}, "NVIDIA H100, no jax version named"),
        ({"jax": "0.11.2"}, "no device kind named, jax 0.11.2"),
    ],
)
def test_what_a_device_block_does_not_name_is_said_so(device: dict[str, str], said: str) -> None:
    a = results_doc.from_obj(make_doc([rec(ms=1.0)], device=device), name="a.json")
    lines = compare.format_compare(compare.compare(a, a), doc_a=a, doc_b=a).splitlines()
    assert lines[0] == f"A: a.json ({said})"


def test_a_document_whose_records_were_all_reused_names_the_jax_they_were_measured_with(tmp_path: Path) -> None:
    """Every record of B carried from A (no worker of B's sweep ran, so its device block names no
    jax): its label names the jax its records were reused under, and from where, not "no jax
    version named"."""
    from tests.reuse_helpers import FIRST, run_first
    from tests.reuse_helpers import write as write_spec

    first = run_first(tmp_path)
    jax = json.loads(first.read_text())["device"]["jax"]
    spec = write_spec(tmp_path, "again.json", {**FIRST, "output": str(tmp_path / "again-out.json")})
    sweep = tmp_path / "again"
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--reuse", str(first))
    assert planned.returncode == 0 and "every item is carried" in planned.stdout, planned.stdout + planned.stderr
    merged = run_cli("merge", str(sweep))
    assert merged.returncode == 0, merged.stderr
    again = tmp_path / "again-out.json"
    assert json.loads(again.read_text())["device"].get("jax") is None  # what the label cannot take it from
    r = run_cli("compare", str(first), str(again))
    assert r.returncode == 0, r.stderr
    a, b = r.stdout.splitlines()[:2]
    assert a == f"A: {first} (cpu, jax {jax})", a
    assert b == f"B: {again} (cpu, jax {jax}, of the records it reused from {first})", b


def test_the_compare_page_counts_b_faster_among_the_problems_timed_in_both() -> None:
    """A group's header says of how many problems B was faster out of those with a time in A and
    B, not out of problems one side has no time of."""
    from orchestrator.analysis import compare_html

    a = results_doc.from_obj(make_doc([rec(ms=1.0), rec(ms=1.0, seq=4096), rec(ms=None, seq=8192)]), name="a")
    b = results_doc.from_obj(make_doc([rec(ms=0.5), rec(ms=2.0, seq=4096), rec(ms=1.0, seq=8192)]), name="b")
    page = compare_html.compare_page(a, b)
    assert "3 problems, B faster in 1 of the 2 timed in both</summary>" in page
    apart = [results_doc.from_obj(make_doc([rec(ms=1.0, seq=seq)]), name=str(seq)) for seq in (1024, 2048)]
    assert "2 problems, none timed in both, 2 in one document only</summary>" in compare_html.compare_page(
        apart[0], apart[1]
    )


def test_sub_microsecond_times_show_the_digits_their_ratio_is_taken_from(tmp_path: Path) -> None:
    """B/A of two times of 0.0004 ms can be checked by eye from the times beside it, in the text and
    markdown of compare and report; an ordinary time keeps its 4 decimals."""
    a = write(tmp_path, make_doc([rec(ms=0.000400), rec(ms=12.5, seq=4096)]), "a.json")
    b = write(tmp_path, make_doc([rec(ms=0.000414), rec(ms=12.0, seq=4096)]), "b.json")
    text = run_cli("compare", str(a), str(b))
    assert text.returncode == 0, text.stderr
    header, tiny, ordinary = text.stdout.splitlines()[2:5]
    assert header.split()[-4:] == ["B", "ms", "B/A", "note"], header
    cells = tiny.split()  # ... A ms, B best (4 words), B ms, B/A, "same config"
    a_ms, b_ms, ratio = cells[-9], cells[-4], cells[-3]
    assert (a_ms, b_ms, ratio) == ("0.0004000", "0.0004140", "1.035"), tiny
    assert abs(float(b_ms) / float(a_ms) - float(ratio)) < 0.0005
    assert "12.5000" in ordinary and "12.0000" in ordinary, ordinary
    markdown = run_cli("compare", str(a), str(b), "--markdown").stdout
    assert "| 0.0004000 |" in markdown and "| 0.0004140 | 1.035 |" in markdown and "| 12.5000 |" in markdown, markdown
    for style in ([], ["--markdown"]):
        report = run_cli("report", str(b), *style).stdout
        assert "0.0004140" in report and "0.0004099-0.0004181" in report and "12.0000" in report, report
