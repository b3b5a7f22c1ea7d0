"""The report page in a real headless Chromium (tests/browser.py): what a user opening it sees.

The page must load with no console error, no exception and no request for anything but itself;
the summary table has one row per problem; a click on a header sorts the rows (again: reversed),
a filter hides the other rows, and the query string does both on load; a problem's number opens
its folded group; every problem's heatmap is in the DOM; a ``<script>`` in the document's
strings never runs. The excerpt and a synthetic 2,000-problem document are opened; a screenshot
of each is saved in the test's temporary folder.

Chromium is installed by the test command (scripts/install-browser.sh). Without it these tests
are skipped with the reason, or fail under ``TILESWEEP_REQUIRE_BROWSER=1`` (set by scripts/test.sh),
so CI never passes them silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.analysis import compare_html, html
from orchestrator.store import document as results_doc
from tests.browser import Browser, skip_without_chromium
from tests.conftest import SAMPLE
from tests.helpers import contrast
from tests.report_helpers import make_doc, rec
from tests.test_html import EVIL

ROWS = "Array.from(document.querySelectorAll('#summary tbody tr'))"
VISIBLE = f"{ROWS}.filter(r => !r.hidden)"


def column(key: str) -> str:
    """JS: the index of the summary column whose header has ``data-key=key``."""
    return f"Array.from(document.querySelectorAll('#summary th')).findIndex(h => h.dataset.key === '{key}')"


def values(b: Browser, key: str) -> list[float | None]:
    """The numeric values of a column's visible cells, top to bottom ('-' cells as None)."""
    raw = b.js(
        f"(() => {{ const c = {column(key)}; return {VISIBLE}.map(r => r.cells[c].dataset.v"
        f" ?? r.cells[c].textContent); }})()"
    )
    return [None if v == "-" else float(v) for v in raw]


def largest_first(column: list[float | None]) -> list[float | None]:
    """A numeric column in the order the page sorts it largest first: cells without a value last."""
    return sorted(column, key=lambda v: (v is None, -(v or 0)))


def numbers(b: Browser) -> list[int]:
    return [int(n) for n in b.js(f"{VISIBLE}.map(r => r.cells[0].textContent)")]


def drawn(b: Browser, scope: str) -> list[int]:
    """The drawn widths of the heatmaps under ``scope`` (0: not laid out, not drawn)."""
    return b.js(
        f"Array.from(document.querySelectorAll('{scope} svg.heatmap')).map(s => s.getBoundingClientRect().width)"
    )


def click(b: Browser, key: str) -> None:
    b.js(f"document.querySelector('#summary th[data-key={key}]').click()")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    skip_without_chromium()
    with Browser(tmp_path_factory.mktemp("chromium-profile")) as b:
        yield b


@pytest.fixture
def fresh(browser: Browser) -> Browser:
    browser.events.clear()
    return browser


def test_excerpt_loads_clean_sorts_and_filters(fresh: Browser, tmp_path: Path) -> None:
    b = fresh
    page = html.write_page(tmp_path / "excerpt.html", html.report_page(results_doc.load(SAMPLE)))
    b.open(page.as_uri())
    assert b.js(f"{ROWS}.length") == 3 and b.js("document.querySelectorAll('svg.heatmap').length") == 3
    assert drawn(b, "body") == [254, 318, 254]  # 3 columns of block_k, 4 of bwd_inner
    click(b, "speedup")  # first click: largest first
    assert values(b, "speedup") == largest_first(values(b, "speedup"))
    assert numbers(b) == [2, 3, 1]  # 1.12x, 1.00x, 0.94x
    click(b, "speedup")
    assert numbers(b) == [1, 3, 2]
    click(b, "n")  # back to document order
    assert numbers(b) == [1, 2, 3]
    b.js(
        "(() => { const s = document.querySelector('select[name=dtype]'); s.value = 'float32';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    assert numbers(b) == [3] and b.js("document.getElementById('shown').textContent") == "1"
    b.screenshot(tmp_path / "excerpt.png")
    assert b.problems() == []


def test_query_string_sorts_and_filters_on_load(fresh: Browser, tmp_path: Path) -> None:
    b = fresh
    page = html.write_page(tmp_path / "excerpt.html", html.report_page(results_doc.load(SAMPLE)))
    b.open(page.as_uri() + "?sort=ms&order=desc&dtype=bfloat16")
    assert numbers(b) == [2, 1] and values(b, "ms") == largest_first(values(b, "ms"))
    assert b.js("document.querySelector('#summary th[data-key=ms]').getAttribute('aria-sort')") == "descending"
    assert b.problems() == []
    # the whole summary table fits a 1280-px window: no column hides behind a scroll bar
    b.js("document.body.style.maxWidth = '1280px'")
    fits = "(() => { const w = document.querySelector('.tablewrap'); return w.scrollWidth <= w.clientWidth; })()"
    assert b.js(fits)
    # a value no select lists (a hand-edited link): that filter shows "all", as it filters
    b.open(page.as_uri() + "?dtype=float64&seq=abc")
    assert numbers(b) == [1, 2, 3] and b.js("document.querySelector('select[name=dtype]').selectedIndex") == 0
    assert b.problems() == []


def test_2000_problems_in_the_browser(fresh: Browser, page_2000: Path, tmp_path: Path) -> None:
    """Each step that makes the browser lay the page out again costs seconds on a loaded
    machine at this size, so sorting and drawing are checked once each here (the excerpt's
    test drives them more)."""
    b = fresh
    b.open(page_2000.as_uri() + "?sort=tflops&order=desc")
    assert b.js(f"{ROWS}.length") == 2000
    cells = b.js(
        "Array.from(document.querySelectorAll('section.problem svg.heatmap')).map(s => "
        "s.querySelectorAll('rect').length)"
    )
    assert len(cells) == 2000 and min(cells) >= 10  # 9 or 12 cells and the best cell's box
    ids = b.js("Array.from(document.querySelectorAll('section.problem')).map(s => s.id)")
    assert sorted(ids) == sorted(f"p-{n}" for n in range(1, 2001))
    tf = values(b, "tflops")  # sorted on load by the query string
    assert len(tf) == 2000 and tf == largest_first(tf)
    b.js(
        "(() => { for (const [n, v] of [['mode', 'fwd_bwd'], ['head_dim', '128']]) {"
        " const s = document.querySelector(`select[name=${n}]`); s.value = v;"
        " s.dispatchEvent(new Event('change')); } })()"
    )
    assert len(numbers(b)) == 100  # 2 dtypes x 50 seqs
    # a problem's number in the table opens its folded group and shows its card
    b.js("document.querySelector('#summary a[href=\"#p-1500\"]').click()")
    assert b.until("document.getElementById('p-1500').closest('details').open") is True
    assert b.js("document.querySelectorAll('details.group[open]').length") == 1
    assert drawn(b, "#p-1500") == [318]  # fwd_bwd: 4 columns of bwd_inner
    b.screenshot(tmp_path / "synthetic-2000.png")
    assert b.problems() == []


def test_compare_page_in_the_browser(fresh: Browser, tmp_path: Path) -> None:
    b = fresh
    data = json.loads(SAMPLE.read_text())
    a = results_doc.from_obj(json.loads(json.dumps(data)), name="a.json")
    for r in data["results"]:
        if "median_ms" in r and r["mode"] == "fwd":
            r["median_ms"] *= 1.25
    page = html.write_page(tmp_path / "c.html", compare_html.compare_page(a, results_doc.from_obj(data, name="b.json")))
    b.open(page.as_uri() + "?sort=ratio&order=desc")
    assert b.js(f"{ROWS}.length") == 3 and b.js("document.querySelectorAll('svg.heatmap').length") == 6
    assert values(b, "ratio") == [1.25, 1.25, 1.0]
    # on a narrow window A's and B's provenance stack, one column, and nothing overflows the page
    b.call("Emulation.setDeviceMetricsOverride", session=True, width=420, height=900, deviceScaleFactor=1, mobile=False)
    try:
        columns = b.js("getComputedStyle(document.querySelector('.sides')).gridTemplateColumns.split(' ').length")
        assert columns == 1
        assert b.js("document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        b.call("Emulation.clearDeviceMetricsOverride", session=True)
    assert b.problems() == []


def test_the_compare_page_aligns_a_missing_side_as_its_column_and_names_problems_as_the_report_does(
    fresh: Browser, tmp_path: Path
) -> None:
    """A problem of one document only: the other side's "-" sits where that column's configs do
    (left), its "-" time where times do (right); the cards name a problem as the report's cards do."""
    b = fresh
    a = make_doc([rec(ms=1.0), rec(ms=2.0, seq=4096)])
    other = make_doc([rec(ms=0.5), rec(ms=1.0, seq=8192)])
    docs = results_doc.from_obj(a, name="a.json"), results_doc.from_obj(other, name="b.json")
    page = html.write_page(tmp_path / "c.html", compare_html.compare_page(*docs))
    b.open(page.as_uri())
    for key in ("a_best", "b_best", "a_ms", "b_ms"):
        aligned = b.js(
            f"(() => {{ const c = {column(key)}; return {ROWS}.map(r => [r.cells[c].textContent,"
            " getComputedStyle(r.cells[c]).textAlign]); })()"
        )
        assert len(aligned) == 3 and "-" in [text for text, _ in aligned], aligned
        assert len({align for _, align in aligned}) == 1, (key, aligned)
    titles = b.js("Array.from(document.querySelectorAll('section.problem h3')).map(h => h.textContent)")
    assert [t.split(" \u00b7 ")[0] for t in titles] == [
        "#1 bf16 D=64 S=2048 B=4 H=8 fwd",
        "#2 bf16 D=64 S=4096 B=4 H=8 fwd",
        "#3 bf16 D=64 S=8192 B=4 H=8 fwd",
    ], titles
    assert "bf16 D=64 S=2048 B=4 H=8 fwd</h3>" in html.report_page(docs[0])  # the report's card of that problem
    b.screenshot(tmp_path / "compare-one-sided.png")
    assert b.problems() == []


def test_the_compare_page_colours_a_and_b_on_one_scale(fresh: Browser, tmp_path: Path) -> None:
    """B twice as slow as A everywhere: B's best cell wears the legend's 2x colour, not its
    "best" one, and A's cells the colours of their own ratios to A's best."""
    b = fresh

    def doc(scale: float, name: str) -> results_doc.ResultsDoc:
        records = [rec(auto=True, ms=2.0 * scale), rec(ms=1.0 * scale), rec(ms=1.5 * scale, block_q=64)]
        return results_doc.from_obj(make_doc(records), name=name)

    page = html.write_page(tmp_path / "c.html", compare_html.compare_page(doc(1.0, "a.json"), doc(2.0, "b.json")))
    b.open(page.as_uri())
    swatches = b.js(
        "Object.fromEntries(Array.from(document.querySelectorAll('svg.scale text')).map((t, i) =>"
        " [t.textContent, document.querySelectorAll('svg.scale rect')[i].getAttribute('fill')]))"
    )
    # each side's cells, in the heatmap's order: block_q 64 (1.5x A's best), then 128 (its best)
    fills = b.js(
        "Array.from(document.querySelectorAll('#p-1 svg.heatmap')).map(s =>"
        " Array.from(s.querySelectorAll('rect')).map(r => r.getAttribute('fill')).filter(f => f.startsWith('#')))"
    )
    assert fills == [[swatches["1.5x"], swatches["best"]], [swatches["3x"], swatches["2x"]]]
    assert "relative to the faster of A's and B's best" in b.js("document.querySelector('.legend').textContent")
    assert b.problems() == []


def test_with_javascript_off_the_page_offers_no_control_that_does_nothing(fresh: Browser, tmp_path: Path) -> None:
    """Without the script the table cannot sort or filter: its selects and the line saying "click
    a column to sort" are not shown, nor do the headings look clickable; the rows and cards all are.
    With the script, they are."""
    b = fresh
    page = html.write_page(tmp_path / "excerpt.html", html.report_page(results_doc.load(SAMPLE)))
    shown = "getComputedStyle(document.querySelector('.controls')).display"
    cursor = "getComputedStyle(document.querySelector('#summary th[data-key=speedup]')).cursor"
    b.call("Emulation.setScriptExecutionDisabled", session=True, value=True)
    try:
        b.open(page.as_uri())
        assert b.js(shown) == "none" and b.js(cursor) != "pointer"
        assert b.js(f"{VISIBLE}.length") == 3 and b.js("document.querySelectorAll('svg.heatmap').length") == 3
    finally:
        b.call("Emulation.setScriptExecutionDisabled", session=True, value=False)
    b.open(page.as_uri())
    assert b.js(shown) == "flex" and b.js(cursor) == "pointer"
    assert b.problems() == []


def test_a_printed_page_opens_what_is_folded_and_folds_it_again_after(fresh: Browser, tmp_path: Path) -> None:
    b = fresh
    page = html.write_page(tmp_path / "excerpt.html", html.report_page(results_doc.load(SAMPLE)))
    b.open(page.as_uri())
    closed = "document.querySelectorAll('details:not([open])').length"
    before = b.js(closed)
    assert before > 0
    b.js("window.dispatchEvent(new Event('beforeprint'))")  # what the browser fires as it prints
    assert b.js(closed) == 0
    b.js("window.dispatchEvent(new Event('afterprint'))")
    assert b.js(closed) == before
    assert b.problems() == []


def test_a_script_in_the_document_never_runs(fresh: Browser, tmp_path: Path) -> None:
    b = fresh
    records = [rec(auto=True, ms=2.0, tag=EVIL), rec(ms=1.0, tag=EVIL), rec(ms=None, error=EVIL, tag=EVIL, block_q=64)]
    doc = results_doc.from_obj(make_doc(records, device={"device_kind": EVIL}), name="evil.json")
    page = html.write_page(tmp_path / "evil.html", html.report_page(doc))
    b.open(page.as_uri())
    assert b.js("document.body.dataset.pwned === undefined") is True
    assert b.js("document.querySelectorAll('img, [onerror]').length") == 0
    assert "<script>document.body.dataset.pwned" in b.js("document.body.textContent")
    assert b.js(f"{ROWS}.length") == 1 and b.problems() == []


# JS: an element's drawn fill (computed: ``rgb(r, g, b)``) as [r, g, b]
RGB = "const rgb = e => getComputedStyle(e).fill.match(/\\d+/g).slice(0, 3).map(Number);"
# JS: each label on a heatmap cell or a scale swatch: its text, its drawn colour, and every colour
# under it (a cell's fill, or each colour of the hatch or dots pattern it is filled with)
LABELS = (
    "(() => { " + RGB + " const out = [];"
    " const under = r => { const f = r.getAttribute('fill');"
    "  if (!f.startsWith('url(')) return [rgb(r)];"
    "  return Array.from(document.querySelector(f.slice(4, -1)).querySelectorAll('[fill]')).map(rgb); };"
    " for (const svg of document.querySelectorAll('svg.heatmap, svg.scale')) {"
    "  const cells = Array.from(svg.querySelectorAll('rect')).filter(r => r.getAttribute('fill') !== 'none');"
    "  for (const t of svg.querySelectorAll('text')) {"
    "   const b = t.getBBox(), x = b.x + b.width / 2, y = b.y + b.height / 2;"
    "   const cell = cells.find(r => { const c = r.getBBox();"
    "    return x > c.x && x < c.x + c.width && y > c.y && y < c.y + c.height; });"
    "   if (cell) out.push([t.textContent, rgb(t), under(cell)]); } }"
    " return out; })()"
)


def test_every_label_on_a_heatmap_cell_reads_on_its_colour(fresh: Browser, tmp_path: Path) -> None:
    """Every text drawn on a cell (a time, stages and warps, "failed", "pruned", "screened", the
    scale's words) contrasts with each colour under it at WCAG's 4.5:1 for small text, as the
    browser draws it: ok cells across the whole colour scale, the hatched, dotted and blank ones."""
    b = fresh
    ratios = (1.0, 1.15, 1.3, 1.5, 1.7, 1.9, 2.1, 2.4, 2.7, 3.0, 3.4, 3.8, 4.5, 6.0)
    tiles = [(q, k) for q in (16, 32, 64, 128, 256) for k in (16, 32, 64, 128)]
    records = [rec(auto=True, ms=2.0)]
    records += [rec(ms=r, block_q=q, block_k=k) for r, (q, k) in zip(ratios, tiles, strict=False)]
    (fq, fk), (pq, pk), (sq, sk), (eq, ek) = tiles[len(ratios) : len(ratios) + 4]
    records += [
        rec(ms=None, block_q=fq, block_k=fk),
        {**rec(ms=None, block_q=pq, block_k=pk, error="SharedMemoryPredicted: too big"), "pruned": True},
        {**rec(ms=1.2, block_q=sq, block_k=sk), "screened": True},
        rec(ms=None, error="WrongResult: rel_err 0.5 above 0.02", block_q=eq, block_k=ek),
    ]  # (256, 64) and (256, 128) have no record: blank cells with a dash
    page = html.write_page(tmp_path / "cells.html", html.report_page(results_doc.from_obj(make_doc(records))))
    b.open(page.as_uri())
    labels = b.js(LABELS)
    words = [text for text, _, _ in labels]
    for word in ("failed", "pruned", "screened", "-", "best", "4x+", "s2 w4"):
        assert word in words, (word, words)
    assert len(labels) == 2 * 15 + 5 + 5  # two lines on each timed or screened cell, one on the others; the scale's
    faint = [
        (text, ink, bg, round(contrast(tuple(ink), tuple(bg)), 2))
        for text, ink, under in labels
        for bg in under
        if contrast(tuple(ink), tuple(bg)) < 4.5
    ]
    assert faint == []
    b.screenshot(tmp_path / "cells.png", full_page=True)
    assert b.problems() == []


def test_a_heatmap_wider_than_its_card_scrolls_into_view_to_its_last_column(fresh: Browser, tmp_path: Path) -> None:
    """Nine tile sizes make a heatmap wider than a card on a laptop's window, and seven wider than
    a phone's: the card scrolls it, so its last column can be brought into view, not cut off; on
    paper, where nothing scrolls, the card is as wide as its heatmap."""
    b = fresh
    tiles = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    records = [rec(auto=True, ms=2.0)]
    records += [
        rec(ms=1.0 + 0.1 * i + 0.01 * j, block_q=q, block_k=k)
        for i, q in enumerate(tiles[:3])
        for j, k in enumerate(tiles)
    ]
    doc = results_doc.from_obj(make_doc(records), name="wide.json")
    pages = [
        html.write_page(tmp_path / "wide.html", html.report_page(doc)),
        html.write_page(tmp_path / "c.html", compare_html.compare_page(doc, doc)),
    ]
    # the card brought into view as a user scrolls to it (a card out of view is not laid out: its
    # content-visibility), then scrolled as far right as it goes: its last column's label and the card
    last = (
        "(async () => { const card = document.querySelector('#p-1'); card.scrollIntoView();"
        " const frame = () => new Promise(r => requestAnimationFrame(r)); await frame(); await frame();"
        " card.scrollLeft = card.scrollWidth; await frame();"
        " const label = Array.from(card.querySelectorAll('svg.heatmap text')).filter(t => t.textContent === '4096')"
        "  .pop().getBoundingClientRect(); const box = card.getBoundingClientRect();"
        " return [card.scrollWidth > card.clientWidth, label.left >= box.left, label.right <= box.right]; })()"
    )
    for width in (1280, 420):
        b.call(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        try:
            for page in pages:
                b.open(page.as_uri())
                assert b.js(last) == [True, True, True], (width, page.name)
                assert b.js("document.documentElement.scrollWidth <= window.innerWidth"), (width, page.name)
        finally:
            b.call("Emulation.clearDeviceMetricsOverride", session=True)
    # on paper nothing scrolls: the card holds its heatmap whole
    printed = (
        "(() => { const card = document.querySelector('#p-1'); const box = card.getBoundingClientRect();"
        " const label = Array.from(card.querySelectorAll('svg.heatmap text')).filter(t => t.textContent === '4096')"
        "  .pop().getBoundingClientRect(); return label.right <= box.right; })()"
    )
    b.call("Emulation.setEmulatedMedia", session=True, media="print")
    try:
        for page in pages:
            b.open(page.as_uri())
            assert b.js(printed) is True, page.name
    finally:
        b.call("Emulation.setEmulatedMedia", session=True, media="")
    assert b.problems() == []
