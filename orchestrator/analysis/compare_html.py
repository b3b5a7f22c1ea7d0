"""``tilesweep compare A B --html OUT.html``: two results documents side by side on one page.

The pairing is ``compare.compare``'s (problems matched without their tag unless a document
holds one problem under several tags). The page shows both documents' provenance, a summary
table (best config and median in A and B, B/A: below 1, B is faster) that sorts and filters
like the report's, and per problem the two heatmaps next to each other on one colour scale (each
cell's time relative to the faster of A's and B's best, so the slower side's best is not painted
as a best), grouped and folded as on the report page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from orchestrator.analysis.compare import ProblemComparison, caveats, compare
from orchestrator.analysis.heatmap import problem_title
from orchestrator.analysis.html import facts, grouped, key_cells, key_columns, lists, plot, ratio_cls
from orchestrator.analysis.page import Column, ms_cell, num, provenance, shell, table, td
from orchestrator.analysis.report import astuple_key, axis_columns
from orchestrator.analysis.scan import is_success
from orchestrator.analysis.svg import esc, legend
from orchestrator.analysis.views import ProblemView, problem_views
from orchestrator.store.document import ResultsDoc

SCALE = "the faster of A's and B's best of the problem (one scale for both heatmaps)"
LEGEND = "B/A = B best ms / A best ms (below 1: B is faster). Problems are matched on their axes{}."


def legend_text(with_tag: bool) -> str:
    """The legend, saying whether the tag (and with it the kernel implementation) joined the
    match (``compare.compare``: where a document holds one problem under several tags)."""
    return LEGEND.format(" and their tag and kernel implementation" if with_tag else ", without the tag")


def _views(doc: ResultsDoc) -> dict[tuple, ProblemView]:
    return {astuple_key(v.summary.key): v for v in problem_views(doc)}


def _side(view: ProblemView | None, name: str, scale_ms: float | None) -> str:
    if view is None:
        return f'<div><div class="side">{name}</div><p class="facts">not in {name}</p></div>'
    body = f"{facts(view.summary)}{plot(view.heatmap, view.summary.n_configs, scale_ms)}{lists(view)}"
    return f'<div><div class="side">{name}</div>{body}</div>'


def _scale_ms(*views: ProblemView | None) -> float | None:
    """The time both heatmaps of a problem colour relative to: the faster of their best cells,
    so a side slower than the other shows it in its colours (None: neither has a timed cell)."""
    bests = [ms for v in views if v is not None and v.heatmap is not None and (ms := v.heatmap.best_ms()) is not None]
    return min(bests, default=None)


def _columns(with_tag: bool, axes: list[str]) -> list[Column]:
    return key_columns(with_tag, axes) + [
        Column("a_best", "A best", left=True),
        Column("a_ms", "A ms", num=True),
        Column("b_best", "B best", left=True),
        Column("b_ms", "B ms", num=True),
        Column("ratio", "B/A", num=True, hint="B best ms / A best ms; below 1: B is faster"),
        Column("note", "note", left=True),
    ]


def _rows(rows: list[ProblemComparison], with_tag: bool, axes: list[str]) -> Iterator[tuple[list[str], list[str]]]:
    for n, r in enumerate(rows, 1):
        cells, fvals = key_cells(n, f"p-{n}", r.key, with_tag, axes)
        for s in (r.a, r.b):
            if s is None:  # aligned as a side's cells are: its best config left, its time right
                cells += [td("-", cls="l mono"), ms_cell(None)]
            else:
                cells += [td(s.best_label or "-", cls="l mono"), ms_cell(s.best_ms)]
        cells += [num(r.ratio, ".3f", ratio_cls(r.ratio, higher_is_better=False)), td(r.note, cls="l")]
        yield cells, fvals


def _header(rows: list[ProblemComparison]) -> Callable[[list[int]], str]:
    def header(idx: list[int]) -> str:
        one = sum(1 for i in idx if rows[i].presence != "both")
        ratios = [ratio for i in idx if (ratio := rows[i].ratio) is not None]
        faster = sum(1 for ratio in ratios if ratio < 1)
        n = len(idx)
        text = f"{n} problem{'s' if n != 1 else ''}, "
        text += f"B faster in {faster} of the {len(ratios)} timed in both" if ratios else "none timed in both"
        return text + (f", {one} in one document only" if one else "")

    return header


def compare_page(doc_a: ResultsDoc, doc_b: ResultsDoc, notes: Sequence[str] = ()) -> str:
    """The whole comparison page of two results documents, with the caveats the command says
    (``compare.caveats``, and ``notes``: what it said of what it read) at its top: the page is
    what gets sent on."""
    rows = compare(doc_a, doc_b)
    va, vb = _views(doc_a), _views(doc_b)
    with_tag = any(r.key.tag is not None for r in rows)
    axes = axis_columns(r.key for r in rows)

    def card(i: int) -> str:
        r, n = rows[i], i + 1
        a = va.get(astuple_key(r.a.key)) if r.a is not None else None
        b = vb.get(astuple_key(r.b.key)) if r.b is not None else None
        scale = _scale_ms(a, b)
        ratio = "" if r.ratio is None else f' &middot; B/A <b class="{ratio_cls(r.ratio, False)}">{r.ratio:.3f}</b>'
        shown = r.a or r.b
        title = esc(problem_title(shown.key, with_tag)) if shown is not None else ""  # as the report's cards
        return (
            f'<section class="problem" id="p-{n}"><h3><a href="#p-{n}">#{n}</a> {title}{ratio}</h3>'
            f'<div class="pair">{_side(a, "A", scale)}{_side(b, "B", scale)}</div></section>'
        )

    sides = []
    for name, doc in (("A", doc_a), ("B", doc_b)):
        limit = doc.max_rel_err
        failed = sum(1 for x in doc.results if not is_success(x, limit))
        counts = {"records": len(doc.results), "without a timing": failed}
        sides.append(f"<div><h3>{name}: {esc(doc.name)}</h3>{provenance(doc, counts)}</div>")
    title = f"tilesweep compare: {Path(doc_a.name).name} vs {Path(doc_b.name).name}"
    body = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">{esc(legend_text(with_tag))}</p>',
        *(f'<p class="note caveat">{esc(line)}</p>' for line in (*notes, *caveats(rows, doc_a, doc_b))),
        f'<h2>Provenance</h2><div class="sides">{"".join(sides)}</div>',
        f"<h2>Summary</h2>{table(_columns(with_tag, axes), _rows(rows, with_tag, axes), len(rows))}",
        f"<h2>Problems</h2>{legend([v.heatmap for v in (*va.values(), *vb.values())], SCALE)}",
        grouped([r.key for r in rows], card, _header(rows)),
    ]
    return shell(title, "\n".join(body))
