"""PNG plots of a results document: one tile heatmap per problem and a speedup-over-auto chart.

matplotlib is an optional extra (``pip install 'tilesweep[plots]'``). Figures are drawn on
``matplotlib.figure.Figure`` with the Agg canvas directly, never through pyplot, so the
process-wide backend of a caller (a notebook, a GUI) is left alone and no display is needed.

The heatmap axes are the two tiles that decide most of the time: block_q x block_k for fwd,
bwd_outer x bwd_inner for fwd_bwd. Each cell is the best median over the remaining axes
(stages, warps; for fwd_bwd also the forward blocks when they vary), with the winning
stages/warps written under the time; a cell where every config failed is hatched and
labelled "failed" (or "pruned": refused by the shared-memory model); a cell timed by a halving
sweep's screening sample only is dotted, uncoloured, its screen's time in italics and labelled
"screened" (a legend under the plot says what that means). The data side is
``orchestrator.analysis.heatmap``, shared with the HTML page.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.analysis.heatmap import Cell, HeatmapData, heatmap_data, problem_title
from orchestrator.analysis.report import ProblemKey, ProblemSummary, best_table, group_by_problem
from orchestrator.analysis.svg import ink
from orchestrator.errors import TilesweepError
from orchestrator.store.document import ResultsDoc
from orchestrator.store.files import atomic_open

if TYPE_CHECKING:  # matplotlib is an optional extra: imported where plots are drawn
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ColormapRegistry
    from matplotlib.colorbar import Colorbar
    from matplotlib.colors import Colormap, LogNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import FormatStrFormatter

log = logging.getLogger(__name__)

INSTALL_HINT = "plots need matplotlib: pip install 'tilesweep[plots]'"

SPEEDUP_PAGE = 40  # problems per speedup chart
_GREEN, _GREY, _RED = "tab:green", "0.6", "tab:red"
_EVEN_BAND = 0.02  # speedups within 2% of 1 are drawn grey: not a win either way
SCREENED_LEGEND = "screened: timed by one screening sample only (halving); never a best"


def plot_filename(key: ProblemKey, with_tag: bool = False) -> str:
    parts = [
        key.dtype,
        f"d{key.head_dim}",
        f"s{key.seq}",
        f"b{key.batch}",
        f"h{key.heads}",
        key.mode,
        *key.variant().split(),
    ]
    if with_tag and key.tag is not None:
        parts.append(str(key.tag))
    name = "_".join(str(p) for p in parts)
    return "heatmap_" + re.sub(r"[^A-Za-z0-9_.-]+", "-", name) + ".png"


@dataclass(frozen=True)
class WrittenPlots:
    """What ``write_plots`` drew: the files, and how many of the document's problems they cover."""

    files: list[Path]
    drawn: int  # problems whose plots were drawn (the first ones in document order)
    problems: int  # problems in the document

    @property
    def folded(self) -> int:
        """Problems left out by the cap."""
        return self.problems - self.drawn


def write_plots(
    doc: ResultsDoc,
    out_dir: str | os.PathLike[str],
    *,
    max_problems: int | None = None,
    on_problem: Callable[[int, int], None] | None = None,
) -> WrittenPlots:
    """Write the heatmaps and speedup charts of the first ``max_problems`` problems (all when
    ``None``) into ``out_dir``. A heatmap takes about 0.4 s, so thousands of problems need a
    cap (the CLI sets one and says what it left out; the HTML page shows every problem).
    ``on_problem(done, total)``: called after each problem's heatmap (the CLI's progress)."""
    mpl = _matplotlib()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TilesweepError(f"{out}: cannot create the plot directory ({exc.strerror or exc})") from None
    groups = group_by_problem(doc.results)
    with_tag = len({k[6] for k in groups}) > 1
    n = len(groups) if max_problems is None else min(max_problems, len(groups))
    written = []
    for done, (k, recs) in enumerate(list(groups.items())[:n], 1):
        data = heatmap_data(ProblemKey(*k), recs)
        if data is None:
            log.info("no heatmap for %s: no forced config with a record on two tile axes", k)
        else:
            path = out / plot_filename(data.key, with_tag)
            _save(mpl, _heatmap_figure(mpl, data, with_tag), path)
            written.append(path)
        if on_problem is not None:
            on_problem(done, n)
    summaries = best_table(doc)[:n]
    pages = [summaries[i : i + SPEEDUP_PAGE] for i in range(0, len(summaries), SPEEDUP_PAGE)]
    for i, page in enumerate(pages, 1):
        # one tall figure for thousands of problems would exceed Agg's size limit and be unreadable
        path = out / ("speedup_over_auto.png" if i == 1 else f"speedup_over_auto_{i}.png")
        title_page = f" ({i}/{len(pages)})" if len(pages) > 1 else ""
        _save(mpl, _speedup_figure(mpl, page, with_tag, title_page), path)
        written.append(path)
    return WrittenPlots(written, n, len(groups))


# --------------------------------------------------------------------------- drawing


@dataclass(frozen=True)
class Matplotlib:
    """The matplotlib names the drawing code needs, imported only when plots are drawn."""

    colormaps: ColormapRegistry
    log_norm: type[LogNorm]
    rectangle: type[Rectangle]
    patch: type[Patch]
    formatter: type[FormatStrFormatter]
    figure: type[Figure]
    canvas: type[FigureCanvasAgg]


def _matplotlib() -> Matplotlib:
    try:
        import matplotlib
        from matplotlib import colors, patches, ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TilesweepError(INSTALL_HINT) from None
    return Matplotlib(
        colormaps=matplotlib.colormaps,
        log_norm=colors.LogNorm,
        rectangle=patches.Rectangle,
        patch=patches.Patch,
        formatter=ticker.FormatStrFormatter,
        figure=Figure,
        canvas=FigureCanvasAgg,
    )


def _save(mpl: Matplotlib, fig: Figure, path: Path) -> None:
    """The figure as a PNG at ``path``, through a temp file (``atomic_open``): a full disk or a
    stop mid-write leaves the earlier file whole, never a cut-off PNG in its place."""
    mpl.canvas(fig)
    with atomic_open(path, "wb", fsync=False) as f:
        fig.savefig(f, dpi=120, format="png")


def _heatmap_figure(mpl: Matplotlib, d: HeatmapData, with_tag: bool) -> Figure:
    nr, nc = len(d.rows), len(d.cols)
    fig = mpl.figure(figsize=(max(5.5, 1.25 * nc + 2.8), max(4.0, 0.95 * nr + 2.2)), layout="constrained")
    ax = fig.add_subplot()
    cmap, norm = _time_scale(mpl, d)
    grid = [[_timed_ms(c) for c in line] for line in d.cells]
    im = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto", origin="upper")
    for i, line in enumerate(d.cells):
        for j, c in enumerate(line):
            _draw_cell(mpl, ax, (i, j), c, cmap, norm)
    best_rc = d.best()
    if best_rc is not None:
        i, j = best_rc
        ax.add_patch(mpl.rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=3))
    ax.set_xticks(range(nc), [str(c) for c in d.cols])
    ax.set_yticks(range(nr), [str(r) for r in d.rows])
    ax.set_xlabel(f"{d.col_axis} (tile size)")
    ax.set_ylabel(f"{d.row_axis} (tile size)")
    auto = "auto: failed/absent" if d.auto_ms is None else f"auto {d.auto_ms:.4g} ms"
    timed = f"median ms, best over {d.folded}; red box = best" if best_rc is not None else "no config timed in full"
    ax.set_title(f"{problem_title(d.key, with_tag)}\n{timed}; {auto}", fontsize=10)
    if best_rc is not None:  # a scale of times only where a cell has one, not one made up for none
        _time_colorbar(mpl, fig.colorbar(im, ax=ax))
    if any(c.status == "screened" for line in d.cells for c in line):
        mark = mpl.patch(facecolor="0.94", edgecolor="0.45", hatch="..", label=SCREENED_LEGEND)
        fig.legend(handles=[mark], loc="outside lower center", fontsize=8, frameon=False)
    return fig


def _timed_ms(c: Cell) -> float:
    """A cell's time, or NaN (drawn white) where it has none."""
    return c.median_ms if c.status == "ok" and c.median_ms is not None else math.nan


def _time_scale(mpl: Matplotlib, d: HeatmapData) -> tuple[Colormap, LogNorm]:
    """The colour of a time: a log scale over the problem's timed cells, white where none."""
    values = [m for line in d.cells for c in line if not math.isnan(m := _timed_ms(c))]
    lo, hi = (min(values), max(values)) if values else (1.0, 2.0)
    if hi <= lo:
        hi = lo * 1.01
    return mpl.colormaps["viridis_r"].with_extremes(bad="white"), mpl.log_norm(vmin=lo, vmax=hi)


def _draw_cell(mpl: Matplotlib, ax: Axes, at: tuple[int, int], c: Cell, cmap: Colormap, norm: LogNorm) -> None:
    """A cell's text: its time and winning config, what failed in it, or that it was not run."""
    i, j = at
    if c.status == "ok" and c.median_ms is not None:
        rgba = cmap(norm(c.median_ms))
        color = ink("#" + "".join(f"{round(255 * v):02x}" for v in rgba[:3]))  # the page's cells' rule
        ax.text(
            j,
            i - 0.12,
            f"{c.median_ms:.4g}",
            ha="center",
            va="center",
            fontsize=10,
            fontweight="bold",
            color=color,
        )
        detail = c.detail + (f"\n{c.n_failed}/{c.n_total} failed" if c.n_failed else "")
        ax.text(j, i + 0.25, detail, ha="center", va="center", fontsize=7.5, color=color)
    elif c.status == "screened" and c.median_ms is not None:
        _draw_screened_cell(mpl, ax, at, c)
    elif c.status in ("failed", "pruned"):
        _draw_failed_cell(mpl, ax, at, c)
    else:
        ax.text(j, i, "not run", ha="center", va="center", fontsize=8, color="0.35")  # 7:1 on white


def _draw_failed_cell(mpl: Matplotlib, ax: Axes, at: tuple[int, int], c: Cell) -> None:
    """A hatched cell where every config failed (crossed) or was pruned (striped), with counts."""
    i, j = at
    ax.add_patch(
        mpl.rectangle(
            (j - 0.5, i - 0.5),
            1,
            1,
            facecolor="0.85",
            edgecolor="0.45",
            hatch="xx" if c.status == "failed" else "//",
            linewidth=0,
        )
    )
    ax.text(
        j,
        i,
        f"{c.status}\n({c.n_failed}/{c.n_total})",
        ha="center",
        va="center",
        fontsize=9,
        color="black",
        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
    )


def _draw_screened_cell(mpl: Matplotlib, ax: Axes, at: tuple[int, int], c: Cell) -> None:
    """A dotted, uncoloured cell timed by screening samples only: its best screen, in italics."""
    i, j = at
    ax.add_patch(mpl.rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.94", edgecolor="0.45", hatch="..", linewidth=0))
    box = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"}
    ax.text(j, i - 0.12, f"{c.median_ms:.4g}", ha="center", va="center", fontsize=10, fontstyle="italic", bbox=box)
    ax.text(j, i + 0.25, f"screened {c.detail}", ha="center", va="center", fontsize=7.5, color="0.25", bbox=box)


def _time_colorbar(mpl: Matplotlib, cb: Colorbar) -> None:
    cb.set_label("median time per call (ms, log scale; lower is better)")
    cb.ax.yaxis.set_major_formatter(mpl.formatter("%.3g"))
    cb.ax.yaxis.set_minor_formatter(mpl.formatter("%.3g"))
    cb.ax.tick_params(labelsize=7, which="both")


def _speedup_figure(mpl: Matplotlib, summaries: list[ProblemSummary], with_tag: bool, page: str = "") -> Figure:
    n = len(summaries)
    fig = mpl.figure(figsize=(8.5, max(2.6, 0.42 * n + 1.6)), layout="constrained")
    ax = fig.add_subplot()
    labels = [problem_title(s.key, with_tag) for s in summaries]
    ys = list(range(n))
    vals = [s.speedup if s.speedup is not None else 0.0 for s in summaries]
    band = _EVEN_BAND
    colors = [_GREEN if v > 1 + band else _RED if v < 1 - band else _GREY for v in vals]
    ax.barh(ys, vals, color=colors, height=0.65)
    xmax = max([1.0] + [v for v in vals if math.isfinite(v)]) * 1.45
    for y, s, v in zip(ys, summaries, vals, strict=True):
        # labels start right of the 1.0 line or the bar, whichever is further, so never cross it
        x = max(v, 1.0) + 0.015 * xmax
        if s.speedup is None:
            no_best = s.best_ms is None
            if s.auto_status == "failed":
                why = "all failed" if no_best else "auto failed"
            else:
                why = "no auto" if s.auto_status == "absent" else "no forced timing"
            ax.text(x, y, f"n/a ({why})", va="center", fontsize=8, color="0.35")
        else:
            ax.text(x, y, f"{v:.2f}x  {s.best_label}", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=1, linestyle="--")
    handles = [
        mpl.patch(color=_GREEN, label=f"tuned faster (> {1 + band:.2f}x)"),
        mpl.patch(color=_GREY, label=f"even (within {band:.0%})"),
        mpl.patch(color=_RED, label=f"auto faster (< {1 - band:.2f}x)"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)  # first problem on top, no empty margin
    ax.set_xlim(0, xmax)
    ax.set_xlabel("speedup over auto (auto ms / best ms; > 1: tuned config is faster)")
    ax.set_ylabel("problem")
    ax.set_title(f"Best forced config vs auto, per problem{page}")
    return fig
