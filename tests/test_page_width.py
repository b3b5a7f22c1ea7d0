"""The report page's summary table at a laptop's window width, in a real headless Chromium
(tests/browser.py): every column of a document that varies along every optional axis in view.

Without Chromium these tests are skipped with the reason, or fail under
``TILESWEEP_REQUIRE_BROWSER=1`` (set by scripts/test.sh), as tests/test_html_browser.py's are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import html
from orchestrator.store import document as results_doc
from tests.browser import Browser, skip_without_chromium
from tests.report_helpers import make_doc, rec


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    skip_without_chromium()
    with Browser(tmp_path_factory.mktemp("chromium-profile")) as b:
        yield b


def test_the_summary_of_a_document_of_every_axis_fits_a_1280_px_window(browser: Browser, tmp_path: Path) -> None:
    """Problems that differ in causal, kv_heads, implementation and tag give the summary table every
    optional column: at 1280 px it still fits, its note column in view, sorted or not, and no value
    is cut (a q1-q3 range wraps after its dash, whole)."""
    b = browser
    tokamax: dict[str, Any] = {"impl": "tokamax-mosaic", "block_q": 64, "block_kv": 128, "persistent": True}
    tokamax.update(fold_q_sequence_heads=False, split_k=1)
    records = []
    for tag in ("a", "b"):
        for axes in ({"causal": c, "kv_heads": kv} for c in (False, True) for kv in (8, 2)):
            records += [rec(auto=True, ms=1.2, tag=tag) | axes, rec(ms=1.0, tag=tag) | axes]
            forced = {k: v for k, v in rec(ms=0.9, tag=tag).items() if k not in ("block_k", "num_warps")}
            records += [forced | tokamax | axes, rec(auto=True, ms=1.0, tag=tag) | axes | {"impl": "tokamax-mosaic"}]
    page = html.write_page(tmp_path / "axes.html", html.report_page(results_doc.from_obj(make_doc(records), name="x")))
    keys = ["causal", "kv", "impl", "tag", "note"]
    fits = (
        "(() => { const w = document.querySelector('.tablewrap'), box = w.getBoundingClientRect();"
        " const note = document.querySelector('#summary th[data-key=note]').getBoundingClientRect();"
        " return [w.scrollWidth <= w.clientWidth, note.right <= box.right]; })()"
    )
    b.call(
        "Emulation.setDeviceMetricsOverride", session=True, width=1280, height=900, deviceScaleFactor=1, mobile=False
    )
    try:
        for sort in (None, "speedup", "note"):  # a sorted column's heading carries its mark
            b.open(page.as_uri() + ("" if sort is None else f"?sort={sort}&order=desc"))
            assert b.js(f"{keys}.map(k => !!document.querySelector(`#summary th[data-key=${{k}}]`))") == [True] * 5
            if sort is not None:
                assert b.js(f"document.querySelector('#summary th[data-key={sort}]').getAttribute('aria-sort')")
            assert b.js(fits) == [True, True], sort
        ranges = b.js("Array.from(document.querySelectorAll('#summary td.range')).map(c => c.textContent)")
        assert len(ranges) == 16 and "0.8910-0.9090" in ranges and "0.9900-1.0100" in ranges, ranges
        b.screenshot(tmp_path / "axes.png")
    finally:
        b.call("Emulation.clearDeviceMetricsOverride", session=True)
    assert b.problems() == []
