"""Heatmaps as SVG for the HTML page: a few rects and texts per cell, no plotting library.

matplotlib takes about 0.4 s per heatmap; a page of thousands of problems needs each one in
well under a millisecond. Each heatmap is inline SVG, text in the page (no image files beside
it, no network), with as few elements as it can have: a page of thousands of them is parsed
whole when it opens. (As ``data:`` images they would be parsed only when shown, but each
SVG image costs the browser a document of its own; thousands of them stalled headless
Chromium's ``--dump-dom`` and ``--screenshot`` for minutes, which a print-to-PDF would hit too.)

The cell colour says how much slower a cell is than the problem's best cell (on the comparison
page: than the faster of A's and B's best, so the two heatmaps of a problem share one scale), on
a log scale that saturates at ``SATURATE``x, so one colour means the same in every heatmap of the
page (the PNG plots colour each heatmap by its own range instead). Failed cells are hatched and
labelled, pruned ones (refused by the shared-memory model, never run) hatched the other way,
cells timed by a halving sweep's screening sample only are dotted with their screen's time in
italics and the word "screened" (a screen is never a measurement: uncoloured, never the best),
and cells with no record are left blank with a dash; the best cell has a red outline.

Every text that comes from a document goes through ``esc``: tile sizes are ints, but a
document is data from elsewhere and is never trusted to be.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import NamedTuple

from orchestrator.analysis.heatmap import HeatmapData

SATURATE = 4.0  # a cell this many times slower than the best, or more, gets the last colour
# viridis, reversed: the best cell is bright yellow, slow ones dark (as the PNG plots)
_STOPS = ("#fde725", "#a0da39", "#4ac16d", "#1fa187", "#277f8e", "#365c8d", "#46327e", "#440154")
CELL_W, CELL_H = 64, 34
INK = "#1d1d1f"  # the page's text colour: the labels of the hatched, dotted and blank cells
MIN_CONTRAST = 4.5  # WCAG's least contrast for text this small, which every cell label has
LEFT, TOP = 58, 34  # room for the row and column labels

# hatch patterns, defined once per page (ids are page-wide); see ``defs``. Their colours are
# light enough that a cell's label (``INK``) reads on every one of them: WCAG's 4.5:1 at least
DEFS = (
    '<svg class="defs" width="0" height="0" aria-hidden="true"><defs>'
    '<pattern id="hf" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
    '<rect width="6" height="6" fill="#ececec"/><rect width="2" height="6" fill="#d98c8c"/></pattern>'
    '<pattern id="hp" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)">'
    '<rect width="6" height="6" fill="#eeeeee"/><rect width="2" height="6" fill="#9a9a9a"/></pattern>'
    '<pattern id="hs" width="5" height="5" patternUnits="userSpaceOnUse">'
    '<rect width="5" height="5" fill="#f4f4f4"/><circle cx="2.5" cy="2.5" r="0.9" fill="#8a8a8a"/></pattern>'
    "</defs></svg>"
)


def esc(value: object) -> str:
    """Text or attribute value, escaped for HTML (and so for inline SVG)."""
    return html.escape(str(value), quote=True)


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


_RGB = [_rgb(s) for s in _STOPS]


def colour(ratio: float) -> str:
    """The fill of a cell ``ratio`` times slower than the best (1 = the best)."""
    t = 0.0 if ratio <= 1 else min(math.log(ratio) / math.log(SATURATE), 1.0)
    x = t * (len(_RGB) - 1)
    i = min(int(x), len(_RGB) - 2)
    f = x - i
    a, b = _RGB[i], _RGB[i + 1]
    return "#" + "".join(f"{round(p + (q - p) * f):02x}" for p, q in zip(a, b, strict=True))


def luminance(hex_colour: str) -> float:
    """WCAG's relative luminance of ``#rrggbb``: 0 for black, 1 for white."""

    def linear(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in _rgb(hex_colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG's contrast ratio of two colours, 1 (none) to 21 (black on white)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def ink(fill: str) -> str:
    """Text colour on a fill (``#rrggbb``): black or white, whichever contrasts more with it (one
    of them always reaches ``MIN_CONTRAST``: the two are equal at 4.58:1). The page's heatmaps and
    the PNG plots both write their cells' labels in it."""
    return "#000000" if contrast(fill, "#000000") >= contrast(fill, "#ffffff") else "#ffffff"


def _ink(fill: str) -> str:
    """``ink`` as a text element's attribute: none for black, SVG's default."""
    return "" if ink(fill) == "#000000" else " fill='white'"


class _Layers(NamedTuple):
    """A heatmap's cells as the layers they are drawn in: fills, then values, details, marks."""

    rects: list[str]
    values: list[str]
    details: list[str]
    marks: list[str]


def _cell_layers(d: HeatmapData, best_ms: float | None) -> _Layers:
    """Each cell's fill and texts; an ok cell coloured by its ratio to ``best_ms``."""
    cw, ch, mid = CELL_W - 2, CELL_H - 2, CELL_W // 2
    rects: list[str] = []
    values: list[str] = []
    details: list[str] = []
    marks: list[str] = []
    for i, line in enumerate(d.cells):
        y = TOP + i * CELL_H
        for j, c in enumerate(line):
            x = LEFT + j * CELL_W
            if c.status == "ok" and c.median_ms is not None:
                fill = colour(c.median_ms / best_ms) if best_ms else _STOPS[0]
                ink = _ink(fill)
                rects.append(f"<rect x='{x}' y='{y}' width='{cw}' height='{ch}' fill='{fill}'/>")
                values.append(f"<text x='{x + mid}' y='{y + 14}'{ink}>{c.median_ms:.4g}</text>")
                details.append(f"<text x='{x + mid}' y='{y + 27}'{ink}>{esc(c.detail)}</text>")
            elif c.status == "screened" and c.median_ms is not None:
                rects.append(
                    f"<rect x='{x}' y='{y}' width='{cw}' height='{ch}' fill='url(#hs)' stroke='#8a8a8a' "
                    "stroke-dasharray='3 2'/>"
                )
                screen = f"{c.median_ms:.4g}"
                values.append(f"<text x='{x + mid}' y='{y + 14}' font-style='italic' font-weight='400'>{screen}</text>")
                details.append(f"<text x='{x + mid}' y='{y + 27}'>screened</text>")
            elif c.status in ("failed", "pruned"):
                rects.append(f"<rect x='{x}' y='{y}' width='{cw}' height='{ch}' fill='url(#h{c.status[0]})'/>")
                marks.append(f"<text x='{x + mid}' y='{y + 20}'>{c.status}</text>")
            else:
                rects.append(f"<rect x='{x}' y='{y}' width='{cw}' height='{ch}' fill='white' stroke='gainsboro'/>")
                marks.append(f"<text x='{x + mid}' y='{y + 20}'>-</text>")
    return _Layers(rects, values, details, marks)


def heatmap_svg(d: HeatmapData, scale_ms: float | None = None) -> str:
    """One problem's heatmap, inline in the page: rows ``d.row_axis``, columns ``d.col_axis``,
    median ms and the winning stages/warps per cell. Kept to few elements (thousands share a
    page): rects first, then the texts in groups that carry their style as presentation
    attributes; the hatch patterns are the page's (``DEFS``). ``scale_ms``: the time of the
    scale's first colour (default: this heatmap's best cell's; the module says why not always)."""
    nr, nc = len(d.rows), len(d.cols)
    width, height = LEFT + nc * CELL_W + 4, TOP + nr * CELL_H + 4
    best = d.best()
    rects, values, details, marks = _cell_layers(d, scale_ms if scale_ms is not None else d.best_ms())
    mid = CELL_W // 2
    cols = "".join(f"<text x='{LEFT + j * CELL_W + mid}' y='{TOP - 6}'>{esc(v)}</text>" for j, v in enumerate(d.cols))
    rows = "".join(
        f"<text x='{LEFT - 6}' y='{TOP + i * CELL_H + CELL_H // 2 + 4}'>{esc(v)}</text>" for i, v in enumerate(d.rows)
    )
    ym = TOP + nr * CELL_H // 2
    parts = [
        f"<svg class='heatmap' width='{width}' height='{height}' role='img' "
        f"aria-label='{esc(d.row_axis)} by {esc(d.col_axis)}: median ms'>",
        f"<g fill='dimgray' font-style='italic'><text x='{LEFT + nc * CELL_W // 2}' y='11'>{esc(d.col_axis)}</text>"
        f"<text x='11' y='{ym}' transform='rotate(-90 11 {ym})'>{esc(d.row_axis)}</text></g>",
        cols,
        f"<g text-anchor='end'>{rows}</g>",
        *rects,
        f"<g font-weight='600' font-size='12'>{''.join(values)}</g>",
        f"<g font-size='9.5'>{''.join(details)}</g>",
        f"<g font-size='10.5' fill='{INK}'>{''.join(marks)}</g>" if marks else "",
    ]
    if best is not None:
        i, j = best
        parts.append(
            f"<rect x='{LEFT + j * CELL_W - 1}' y='{TOP + i * CELL_H - 1}' width='{CELL_W}' "
            f"height='{CELL_H}' fill='none' stroke='#d93025' stroke-width='3'/>"
        )
    parts.append("</svg>")
    return "".join(parts)


def scale_svg() -> str:
    """The colour legend: best, then 1.5x, 2x, 3x, 4x+ slower than the problem's best."""
    marks = (1.0, 1.5, 2.0, 3.0, SATURATE)
    w = 46
    parts = [f'<svg class="scale" width="{len(marks) * w + 2}" height="24" role="img" aria-label="colour scale">']
    for k, m in enumerate(marks):
        fill = colour(m)
        label = "best" if m == 1.0 else f"{m:g}x" + ("+" if m == SATURATE else "")
        parts.append(
            f'<rect x="{k * w}" y="0" width="{w - 2}" height="22" fill="{fill}"/>'
            f'<text x="{k * w + w // 2 - 1}" y="15"{_ink(fill)}>{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


# the marks of cells without a colour, as the legend says them: (cell status, hatch pattern, words)
_MARKS = (
    ("failed", "f", "failed"),
    ("pruned", "p", "pruned (refused before running)"),
    ("screened", "s", "screened: timed by one screening sample only (halving), never a best"),
    ("absent", None, "not in the sweep"),
)


def legend(heatmaps: Iterable[HeatmapData | None], relative_to: str = "the problem's best") -> str:
    """The heatmaps' legend: their colour scale (``relative_to``: the time its first colour stands
    for) and the marks of cells without a timing, each only where a heatmap of the page shows it
    (nothing where none has a cell)."""
    shown = {c.status for d in heatmaps if d is not None for line in d.cells for c in line}
    parts = [f"<span>cell colour: time relative to {esc(relative_to)}</span>{scale_svg()}"] if "ok" in shown else []
    for status, pattern, words in _MARKS:
        if status in shown:
            mark = "-" if pattern is None else _swatch(pattern)
            parts.append(f"<span>{mark} {words}</span>")
    return f'<div class="legend">{"".join(parts)}</div>' if parts else ""


def _swatch(pattern: str) -> str:
    return f'<svg class="swatch" width="22" height="14"><rect width="22" height="14" fill="url(#h{pattern})"/></svg>'
