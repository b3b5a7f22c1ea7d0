"""The report page (``report --html``, ``compare --html``, ``report.html: true``) read as HTML.

What a reader checks without a browser: a summary row and a heatmap per problem, the numbers
of the best-config table, failed, pruned and missing configs named, the provenance, strings from
the document escaped, a policy that allows no network and no script but the page's own, the
page written atomically. tests/test_html_browser.py opens the same pages in Chromium.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import xml.etree.ElementTree as ET
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestrator.analysis import compare_html, html, report
from orchestrator.analysis.heatmap import configs_of, heatmap_data
from orchestrator.analysis.views import problem_views
from orchestrator.errors import TilesweepError
from orchestrator.store import document as results_doc
from orchestrator.store import synthetic
from tests.conftest import SAMPLE, run_cli
from tests.helpers import assert_one_line_error
from tests.report_helpers import make_doc, merged_from_nothing, rec

EVIL = '<script>document.body.dataset.pwned = "1"</script><img src=x onerror="document.body.dataset.pwned=1">'


class Page(HTMLParser):
    """The parts of a page the tests read: summary rows (cell texts), heatmaps (and their SVG),
    groups, the inline scripts and the CSP."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.heatmaps = self.groups = self.open_groups = 0
        self.svgs: list[str] = []  # each heatmap's SVG markup, as it stands in the page
        self._svg: list[str] | None = None
        self.scripts: list[str] = []
        self.csp = ""
        self._in_body = self._in_script = False
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td" and self._in_body:
            self._cell = []
        elif tag == "svg" and a.get("class") == "heatmap":
            self.heatmaps += 1
            self._svg = [self.get_starttag_text() or ""]
        elif self._svg is not None:
            self._svg.append(self.get_starttag_text() or "")
        elif tag == "details" and a.get("class") == "group":
            self.groups += 1
            self.open_groups += "open" in a
        elif tag == "script":
            self._in_script = True
            self.scripts.append("")
        elif tag == "meta" and a.get("http-equiv") == "Content-Security-Policy":
            self.csp = a.get("content") or ""

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._svg is not None:
            self._svg.append(self.get_starttag_text() or "")
        else:
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if self._svg is not None:
            self._svg.append(f"</{tag}>")
            if tag == "svg":
                self.svgs.append("".join(self._svg))
                self._svg = None
            return
        if tag == "tbody":
            self._in_body = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._svg is not None:
            self._svg.append(escape(data))
        if self._cell is not None:
            self._cell.append(data)
        if self._in_script:
            self.scripts[-1] += data


def sample() -> results_doc.ResultsDoc:
    return results_doc.load(SAMPLE)


# --------------------------------------------------------------------------- the excerpt


def test_excerpt_page_has_a_row_and_a_heatmap_per_problem_with_the_tables_numbers() -> None:
    doc = sample()
    page = Page(html.report_page(doc))
    summaries = report.best_table(doc)
    assert len(page.rows) == len(summaries) == 3 and page.heatmaps == 3
    for row, s in zip(page.rows, summaries, strict=True):
        assert row[1:7] == [
            s.key.dtype,
            str(s.key.head_dim),
            str(s.key.seq),
            str(s.key.batch),
            str(s.key.heads),
            s.key.mode,
        ]
        assert row[7] == s.best_label and row[8] == f"{s.best_ms:.4f}" and row[11] == f"{s.speedup:.2f}"
        assert row[13:16] == [str(s.n_configs), str(s.n_failed), str(s.n_pruned)]
        assert row[16] == "-"  # the reference document does not say what was planned


def test_excerpt_page_names_failed_configs_and_provenance() -> None:
    text = html.report_page(sample())
    # float32 d128: 8 configs ran out of shared memory; each is named with the error
    f32 = [r for r in sample().results if r["dtype"] == "float32" and "error" in r]
    assert len(f32) == 8 and "8 failed configs" in text
    for r in f32:
        label = report.config_label({k: r[k] for k in ("block_q", "block_k", "num_stages", "num_warps")}, "fwd")
        assert f"<code>{label}</code>" in text
    assert "RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 344064" in text
    for fact in ("NVIDIA H100", "0.11.2", "3.13.18", "159 records, 8 without a timing, 3 problems", "h100_nvl"):
        assert fact in text, fact


def test_page_allows_nothing_but_its_own_script_and_style() -> None:
    text = html.report_page(sample())
    page = Page(text)
    assert len(page.scripts) == 1
    digest = base64.b64encode(hashlib.sha256(page.scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in page.csp and page.csp.startswith("default-src 'none'")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing to fetch


# --------------------------------------------------------------------------- escaping


def test_every_document_string_is_escaped() -> None:
    records = [
        rec(auto=True, ms=2.0, tag=EVIL),
        rec(ms=1.0, tag=EVIL),
        rec(ms=None, error=f"Boom: {EVIL}", tag=EVIL, block_q=64),
        rec(ms=1.5, tag="plain", seq=4096),
    ]
    doc = results_doc.from_obj(make_doc(records, device={"device_kind": EVIL, "jax": EVIL}), name=f"x{EVIL}.json")
    for text in (html.report_page(doc), compare_html.compare_page(doc, doc)):
        page = Page(text)
        assert len(page.scripts) == 1, page.scripts  # only the page's own
        assert "<img" not in text and "onerror=" not in text.replace("onerror=&quot;", "")
        assert "&lt;script&gt;document.body.dataset.pwned" in text
        for svg in page.svgs:  # the heatmaps escape the same strings
            assert not [e.tag for e in ET.fromstring(svg).iter() if e.tag in ("script", "img")]


# --------------------------------------------------------------------------- heatmap cells


def test_failed_pruned_and_absent_cells_are_marked() -> None:
    records = [
        rec(auto=True, ms=1.0),
        rec(ms=0.5, block_q=64, block_k=64),
        rec(ms=None, block_q=64, block_k=128),  # a runtime failure
        {
            **rec(ms=None, block_q=128, block_k=128, error="SharedMemoryPredicted: too big"),
            "pruned": True,
            "smem_bytes": 300_000,
        },
        rec(ms=0.7, block_q=128, block_k=64),
        rec(ms=0.9, block_q=32, block_k=64),
    ]  # (32, 128) has no record
    ((k, recs),) = report.group_by_problem(records).items()
    d = heatmap_data(report.ProblemKey(*k), recs)
    assert d is not None and [[c.status for c in line] for line in d.cells] == [
        ["ok", "absent"],
        ["ok", "failed"],
        ["ok", "pruned"],
    ]
    text = html.report_page(results_doc.from_obj(make_doc(records)))
    (svg,) = Page(text).svgs
    ET.fromstring(svg)  # well-formed markup
    assert svg.count("fill='url(#hf)'") == 1 and svg.count("fill='url(#hp)'") == 1
    assert svg.count("stroke='gainsboro'") == 1 and ">-</text>" in svg  # the cell with no record
    assert ">failed</text>" in svg and ">pruned</text>" in svg and svg.count("stroke='#d93025'") == 1
    assert ">0.5</text>" in svg and ">0.9</text>" in svg
    assert "2 failed configs (1 pruned)" in text and "bq128 bk128 s2 w4 (292 KiB)" in text


def _legend(text: str) -> str:
    """The words of a page's heatmap legend ("" where it has none)."""
    found = re.search(r'<div class="legend">(.*?)</div>', text)
    return "" if found is None else re.sub(r"<svg.*?</svg>|<[^>]+>", " ", found.group(1))


def test_the_heatmap_legend_says_only_the_marks_its_heatmaps_show() -> None:
    """A sweep measured in full and without failures reads the colour scale only, not the words of
    pruning and halving; a problem with only auto measured has no heatmap and no legend."""
    plain = make_doc([rec(auto=True, ms=2.0), rec(ms=1.0), rec(ms=1.5, block_q=64)])
    marked = make_doc(
        [
            rec(ms=0.5, block_q=64, block_k=64),
            rec(ms=None, block_q=64, block_k=128),
            {**rec(ms=None, block_q=128, block_k=128, error="SharedMemoryPredicted: too big"), "pruned": True},
            {**rec(ms=0.7, block_q=128, block_k=64), "screened": True},
            rec(ms=0.9, block_q=32, block_k=64),
        ]
    )  # (32, 128) has no record
    only_auto = make_doc([rec(auto=True, ms=2.0)])
    for page in (compare_html.compare_page, lambda d, _: html.report_page(d)):
        docs = {
            name: results_doc.from_obj(d, name=f"{name}.json")
            for name, d in [("plain", plain), ("marked", marked), ("auto", only_auto)]
        }
        words = _legend(page(docs["plain"], docs["plain"]))
        assert "cell colour: time relative to" in words
        for mark in ("failed", "pruned", "screened", "not in the sweep"):
            assert mark not in words, (mark, words)
        words = _legend(page(docs["marked"], docs["marked"]))
        for mark in (
            "cell colour",
            "failed",
            "pruned (refused before running)",
            "screened: timed by",
            "- not in the sweep",
        ):
            assert mark in words, (mark, words)
        assert _legend(page(docs["auto"], docs["auto"])) == ""


def test_a_config_timed_once_is_not_failed() -> None:
    records = [rec(ms=None, block_q=64), rec(ms=0.9, block_q=64), rec(ms=1.0)]
    cs = configs_of("fwd", records)
    assert list(cs.best.values()).count(None) == 0
    assert "failed config" not in html.lists(problem_views(results_doc.from_obj(make_doc(records)))[0])


# --------------------------------------------------------------------------- missing configs


def test_missing_configs_are_the_planned_ones_without_a_record() -> None:
    spec = synthetic.problems_spec(n_seqs=1, dtypes=["bfloat16"], head_dims=[64])
    full = synthetic.document(spec)
    gone = [r for r in full["results"] if r["config"] == "forced" and r["mode"] == "fwd"][3:5]
    gone.append(next(r for r in full["results"] if r["config"] == "auto" and r["mode"] == "fwd_bwd"))
    kept = [r for r in full["results"] if r not in gone]
    views = problem_views(results_doc.from_obj({**full, "results": kept}))
    by_mode = {v.summary.key.mode: v.missing for v in views}
    assert by_mode["fwd"] == [report.config_label(report.config_of(r), "fwd") for r in gone[:2]]
    # auto, which every plan measures, is missing too: counted as merge counts it, and the card says so
    assert by_mode["fwd_bwd"] == ["auto"] and "no auto record" in html.facts(views[1].summary)
    assert [v.summary.n_missing for v in views] == [2, 1]  # what the text report counts
    assert sum(v.summary.n_missing or 0 for v in views) == len(full["results"]) - len(kept)  # merge's missing
    page = Page(html.report_page(results_doc.from_obj({**full, "results": kept})))
    assert [row[16] for row in page.rows] == ["2", "1"]
    # the same records without the tilesweep block: nothing can be said
    bare = {k: v for k, v in full.items() if k != "tilesweep"}
    assert all(v.missing is None for v in problem_views(results_doc.from_obj({**bare, "results": kept})))


def test_variants_are_told_apart_in_missing_configs_and_summary_columns() -> None:
    # causal and non-causal (and grouped-query) problems share their configs' values: a record
    # of one must not stand for the planned item of the other
    spec = synthetic.problems_spec(
        n_seqs=1, dtypes=["bfloat16"], head_dims=[64], modes=["fwd"], heads=4, causal=[False, True], kv_heads=[1, 4]
    )
    full = synthetic.document(spec)
    gone = next(r for r in full["results"] if r["config"] == "forced" and not r["causal"] and r["kv_heads"] == 4)
    views = problem_views(results_doc.from_obj({**full, "results": [r for r in full["results"] if r is not gone]}))
    missing = {(v.summary.key.causal, v.summary.key.kv_heads): v.missing for v in views}
    assert missing == {
        (False, None): [report.config_label(report.config_of(gone), "fwd")],
        (True, None): [],
        (False, 1): [],
        (True, 1): [],
    }
    # and the summary table tells the four problems apart: a causal and a KV column after H
    text = html.report_page(results_doc.from_obj(full))
    head = re.findall(r"<th data-key=\"(\w+)\"", text[text.index("<thead>") : text.index("</thead>")])
    assert head[5:9] == ["heads", "causal", "kv", "mode"]
    assert sorted((row[6], row[7]) for row in Page(text).rows) == [("no", "1"), ("no", "4"), ("yes", "1"), ("yes", "4")]
    assert '<select name="causal" data-col="6">' in text and '<select name="kv" data-col="7">' in text  # filters


# --------------------------------------------------------------------------- scale


def test_2000_problems_one_row_and_one_heatmap_each_groups_folded(page_2000: Path) -> None:
    """Read with regular expressions: the stdlib's HTMLParser takes seconds on 5 MB."""
    text = page_2000.read_text()
    body = text[text.index("<tbody>") : text.index("</tbody>")]
    assert re.findall(r'<tr><td data-v="(\d+)"><a href="#p-\1">', body) == [str(n) for n in range(1, 2001)]
    assert body.count("<tr>") == 2000 and text.count("<svg class='heatmap'") == 2000
    assert re.findall(r'<section class="problem" id="p-(\d+)">', text) == [str(n) for n in range(1, 2001)]
    groups = re.findall(r'<details class="group" id="g-\d+"( open)?>', text)
    assert len(groups) == 20 and not any(groups)  # dtype x head_dim, folded, and the page says so
    assert "2000 problems in 20 groups by dtype and head_dim" in text and "Nothing is left out" in text
    assert body.count('class="warn">') > 100  # 1% of ~30 configs missing: many problems miss one


def test_a_few_problems_open_unfolded() -> None:
    page = Page(html.report_page(sample()))
    assert page.groups == page.open_groups == 2


# --------------------------------------------------------------------------- files and CLI


def test_page_path_and_atomic_write(tmp_path: Path) -> None:
    assert html.page_path(Path("a/results.json")) == Path("a/results.html")
    assert html.page_path(Path("a/results.html")) == Path("a/results.html.html")
    out = tmp_path / "r.html"

    out.write_text("old")
    html.write_page(out, "new")
    assert out.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
    with pytest.raises(TilesweepError, match="cannot write the page"):
        html.write_page(out / "sub.html", "x")  # a file where a folder should be


def test_cli_report_and_compare_html(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    data = json.loads(SAMPLE.read_text())
    a.write_text(json.dumps(data))
    for r in data["results"]:
        for k in ("median_ms", "q1_ms", "q3_ms"):
            if k in r:
                r[k] *= 0.9
    b.write_text(json.dumps(data))
    r = run_cli("report", str(a), "--html", str(tmp_path / "r.html"))
    assert r.returncode == 0 and f"wrote {tmp_path / 'r.html'}" in r.stderr
    assert len(Page((tmp_path / "r.html").read_text()).rows) == 3
    r = run_cli("compare", str(a), str(b), "--html", str(tmp_path / "c.html"))
    assert r.returncode == 0, r.stderr
    rows = Page((tmp_path / "c.html").read_text()).rows
    assert len(rows) == 3 and all(row[11] == "0.900" for row in rows)  # B/A
    r = run_cli("report", str(a), "--html", str(a / "page.html"))  # refused before the report is printed
    assert_one_line_error(r, f"{a} is not a directory; name a file in a folder")
    assert r.stdout == ""


def test_small_figures_and_odd_names_read_as_a_user_expects() -> None:
    assert [report.tflops_text(t) for t in (267.04, 1.0, 0.0123, 0.0)] == ["267.0", "1.0", "0.0123", "0.0"]
    key = report.ProblemKey("bfloat16", 64, 2048, 4, 8, "fwd", "")
    assert key.label(with_tag=True).endswith("fwd [no tag]")
    cpu = dict(make_doc([rec(ms=1.0)]), device={"device_kind": "cpu", "backend": "cpu"})
    assert "<dt>device</dt><dd>cpu</dd>" in html.report_page(results_doc.from_obj(cpu))
    gpu = dict(cpu, device={"device_kind": "NVIDIA H100", "backend": "gpu"})
    assert "<dd>NVIDIA H100 (backend gpu)</dd>" in html.report_page(results_doc.from_obj(gpu))
    many = make_doc([rec(ms=1.0, seq=128 * (k + 1)) for k in range(html.FOLD_ABOVE + 1)])
    assert f"{html.FOLD_ABOVE + 1} problems in 1 group by" in html.report_page(results_doc.from_obj(many))


def test_a_problem_planned_and_never_run_says_why_it_has_no_heatmap(tmp_path: Path) -> None:
    """A sweep merged before any unit ran: each card says its forced configs have no record (the
    list of missing ones below it), not that they lack tile axes, which a fwd problem has."""
    doc = merged_from_nothing(tmp_path, ["fwd"])
    assert run_cli("report", str(doc), "--html", str(tmp_path / "r.html")).returncode == 0
    page = (tmp_path / "r.html").read_text()
    assert page.count("no heatmap: no forced config has a record") == 1 and "tile axes" not in page
    assert "without a record (resume redoes them)" in page
