"""How long the report page takes, and how big it is, for the excerpt and for 2,000 problems.

The 2,000-problem document is synthetic (``orchestrator.store.synthetic``): 2 dtypes x 10 head
dims x 50 seqs x 2 modes with the reference grids (54 fwd, 48 fwd_bwd configs per shape, the
large head dims partly pruned by the shared-memory model), 1% of the configs missing and 1%
failed, written to a file as the merger would (indent=1). Prints, best of --repeat:

    report_html_2000_s   load the document + build the page + write it (``report --html``'s work)
    report_text_2000_s   load + the terminal table (``report`` without --html): the baseline
    html_over_text       what the page costs on top of the table a user gets anyway
    page_2000_mb, page_excerpt_kb, report_html_excerpt_s
    svg_heatmap_ms       one heatmap as the page's SVG, on 20 problems' heatmap data ...
    png_heatmap_ms       ... and as the PNG ``--plots`` draws with matplotlib (the other way to
                         get a heatmap per problem); png_over_svg is their ratio
    browser_open_2000_s  headless Chromium opening the page to its first screenshot, less the
                         same for the excerpt (startup); only with chromium installed

What the figures leave out: the browser figure is one wall-clock run of a whole process on a
shared machine, and says nothing of scrolling or opening a group (the page's heatmaps are all
parsed on load, but a card's layout waits until it is on screen: CSS content-visibility); the
Python figures exclude interpreter start and imports.

Run: ``.venv/bin/python -m bench.report_html [--repeat R]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.analysis import heatmap, html, report
from orchestrator.store import document, synthetic

EXCERPT = Path(__file__).resolve().parent.parent / "tests" / "data" / "attention_tiles.sample.json"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1400,1000",
)


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def page_from(doc_path: Path, out: Path) -> None:
    html.write_page(out, html.report_page(document.load(doc_path)))


def text_from(doc_path: Path) -> None:
    report.format_table(report.best_table(document.load(doc_path)))


def heatmaps(doc_path: Path, repeat: int, n: int = 20) -> tuple[float, float | None]:
    """Milliseconds per heatmap: the page's SVG and matplotlib's PNG, on the same data."""
    from orchestrator.analysis import svg

    doc = document.load(doc_path)
    data = [
        d
        for k, recs in report.group_by_problem(doc.results).items()
        if (d := heatmap.heatmap_data(report.ProblemKey(*k), recs)) is not None
    ][:n]
    svg_ms = best_of(repeat, lambda: [svg.heatmap_svg(d) for d in data]) / len(data) * 1e3
    try:
        from orchestrator.analysis import plots

        mpl = plots._matplotlib()
    except Exception:  # matplotlib is an optional extra
        return svg_ms, None
    with tempfile.TemporaryDirectory() as tmp:

        def draw() -> None:
            for i, d in enumerate(data):
                plots._save(mpl, plots._heatmap_figure(mpl, d, False), Path(tmp) / f"{i}.png")

        png_ms = best_of(1, draw) / len(data) * 1e3
    return svg_ms, png_ms


def browser_open(page: Path, profile: Path) -> float | None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        return None
    t0 = time.perf_counter()
    subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={profile / 'shot.png'}", page.as_uri()],
        capture_output=True,
        timeout=600,
        check=True,
    )
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        doc_path = tmp / "synthetic-2000.json"
        doc = synthetic.document(synthetic.problems_spec(), missing=0.01, failed=0.01)
        doc_path.write_text(json.dumps(doc, indent=1))
        print(f"problems=2000 records={len(doc['results'])} doc_mb={doc_path.stat().st_size / 1e6:.1f}")
        page, small = tmp / "synthetic-2000.html", tmp / "excerpt.html"
        html_s = best_of(args.repeat, lambda: page_from(doc_path, page))
        text_s = best_of(args.repeat, lambda: text_from(doc_path))
        excerpt_s = best_of(args.repeat, lambda: page_from(EXCERPT, small))
        print(f"report_html_2000_s={html_s:.2f}")
        print(f"report_text_2000_s={text_s:.2f}")
        print(f"html_over_text={html_s / text_s:.2f}x")
        print(f"page_2000_mb={page.stat().st_size / 1e6:.2f}")
        print(f"report_html_excerpt_s={excerpt_s:.3f}")
        print(f"page_excerpt_kb={small.stat().st_size / 1e3:.1f}")
        svg_ms, png_ms = heatmaps(doc_path, args.repeat)
        print(f"svg_heatmap_ms={svg_ms:.3f}")
        if png_ms is not None:
            print(f"png_heatmap_ms={png_ms:.1f}")
            print(f"png_over_svg={png_ms / svg_ms:.0f}x")
        base = browser_open(small, tmp / "profile-a")
        full = browser_open(page, tmp / "profile-b")
        if base is not None and full is not None:
            print(f"browser_open_excerpt_s={base:.2f}")
            print(f"browser_open_2000_s={full - base:.2f}")
        else:
            print("browser_open_2000_s=n/a (chromium not installed: scripts/install-browser.sh)")


if __name__ == "__main__":
    main()
