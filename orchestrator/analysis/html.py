"""``tilesweep report RESULTS --html OUT.html``: one page to open in a browser and send on.

On top, the provenance (device, jax, sweep, dates, GPU-hours, the spec) and a summary table of
every problem, sortable and filterable (``page``). Below, one card per problem: the best config
and its q1-q3 spread, auto, speedup, TFLOP/s, the noise flag, the tile heatmap (``svg``: failed
and pruned cells marked), and the configs that failed or are missing (planned but without a
record, when the document says what was planned: the summary's ``coverage``, the same the text
report counts), and those a search never measured, as such.

Thousands of problems stay readable and fast: the cards are grouped by dtype and head_dim, the
groups start folded above ``FOLD_ABOVE`` problems (the page says so; nothing is left out, a
folded group is one click away and a problem's number in the table opens its group), and the
browser lays out only the cards on screen (CSS ``content-visibility``). Every string from the
document is escaped. The page is written atomically: a reader sees the old page or the new one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from orchestrator import PROG, word
from orchestrator.analysis import winners
from orchestrator.analysis.devices import device_flag
from orchestrator.analysis.heatmap import HeatmapData, problem_title
from orchestrator.analysis.legend import table_legend
from orchestrator.analysis.page import Column, ms_cell, num, provenance, shell, table, td
from orchestrator.analysis.report import (
    ProblemKey,
    ProblemSummary,
    axis_cells,
    axis_columns,
    tflops_text,
)
from orchestrator.analysis.scan import is_success
from orchestrator.analysis.summary import AUTO_FASTER
from orchestrator.analysis.svg import esc, heatmap_svg, legend
from orchestrator.analysis.tables import fmt_ms
from orchestrator.analysis.views import ProblemView, problem_views
from orchestrator.errors import TilesweepError
from orchestrator.store.document import ResultsDoc, load
from orchestrator.store.files import remove_dead_temps, write_advice
from orchestrator.store.lowering import REFUSED as LOWERING_REFUSED
from orchestrator.store.page_file import page_path, page_target
from orchestrator.store.sweepdir import atomic_open

FOLD_ABOVE = 60  # more problems than this: the groups start folded
GROUP_AXES = ("dtype", "head_dim")  # cards are grouped by these problem fields
EVEN_BAND = 0.02  # a speedup or ratio within 2% of 1 is shown as even


def _label_cell(label: str) -> str:
    """A config's name in the summary table, free to wrap between its fields (``bq128 bk64``
    at its spaces, ``64/64/num_stages=2`` after each slash), so the table fits the window."""
    return td(esc(label).replace("/", "/<wbr>"), label, cls="l mono", raw=True)


# --------------------------------------------------------------------------- cards


def ratio_cls(x: float | None, higher_is_better: bool = True) -> str:
    if x is None or abs(x - 1) <= EVEN_BAND:
        return ""
    return "win" if (x > 1) == higher_is_better else "lose"


def _short(text: str, most: int = 160) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def facts(s: ProblemSummary) -> str:
    """One line of numbers: best config, its spread, auto, speedup, TFLOP/s, runner-up, noise."""
    if s.best_ms is None:
        why = "every forced config failed" if s.n_configs else s.unmeasured
        best = f'<span class="warn">no best config: {esc(why)}</span>'
    else:
        best = (
            f"best <b>{esc(s.best_label)}</b> <b>{s.best_ms:.4g} ms</b> (q1-q3 {s.best_q1_ms:.4g}-{s.best_q3_ms:.4g})"
        )
    auto = {
        "ok": f"auto {s.auto_ms:.4g} ms" if s.auto_ms is not None else "",
        "failed": f"auto failed ({esc(_short(s.auto_error or 'no timing recorded'))})",
        "absent": "no auto record",
    }[s.auto_status]
    if s.auto_label:
        auto += f" (auto runs <b>{esc(s.auto_label)}</b>)"
    elif s.auto_choice:
        auto += f" (auto's config: <b>{esc(s.auto_choice)}</b>, which the document does not name)"
    else:
        auto += " (auto's config unknown)"
    parts = [best, auto]
    if s.speedup is not None:
        parts.append(f'<b class="{ratio_cls(s.speedup)}">{s.speedup:.2f}x</b> over auto')
    if s.auto_faster and not s.best_is_auto:
        parts.append(f'<b class="warn">{esc(AUTO_FASTER)}</b>')
    auto_noise = s.best_is_auto and s.timing_ratio is not None
    if auto_noise:
        parts.append(f"the best is auto's own config: its two timings {s.timing_ratio:.2f}x apart are noise")
    if s.replayed:
        parts.append('<b class="warn">replayed, not measured</b>')
    if s.tflops is not None:
        parts.append(f"{tflops_text(s.tflops)} TFLOP/s")
    if s.runner_up_label is not None and s.runner_up_ms is not None:
        # noise said once: where the line calls auto's two timings noise, the overlap is said in its own words
        overlap = "q1-q3 overlapping the best's" if auto_noise else "within noise"
        noise = f' <b class="warn">{overlap}</b>' if s.within_noise else ""
        parts.append(f"runner-up {esc(s.runner_up_label)} {s.runner_up_ms:.4g} ms{noise}")
    return '<p class="facts">' + " &middot; ".join(p for p in parts if p) + "</p>"


def plot(d: HeatmapData | None, n_configs: int, scale_ms: float | None = None) -> str:
    """A problem's heatmap and its caption (``scale_ms``: ``heatmap_svg``'s), or why it has none:
    no forced config has a record (``n_configs``: how many have), or theirs have no two tile axes."""
    if d is None:
        why = "its configs have no two tile axes" if n_configs else "no forced config has a record"
        return f'<p class="facts">no heatmap: {why}</p>'
    auto = "auto failed or absent" if d.auto_ms is None else f"auto {d.auto_ms:.4g} ms"
    caption = f"median ms per {d.row_axis} x {d.col_axis}, best over {d.folded}; red box = best; {auto}"
    return f'{heatmap_svg(d, scale_ms)}<p class="facts">{esc(caption)}</p>'


def _codes(labels: list[str]) -> str:
    return " ".join(f"<code>{esc(x)}</code>" for x in labels)


def lists(v: ProblemView) -> str:
    """The failed configs grouped by their error (pruned ones with the predicted bytes), and the
    missing ones, folded."""
    out = []
    if v.failed:
        by_error: dict[str, list[str]] = {}
        pruned: dict[str, list[str]] = {}
        for f in v.failed:
            if f.pruned:
                why = (
                    "pruned (pre-flight lowering refused it; not run)"
                    if f.error.startswith(LOWERING_REFUSED)
                    else "pruned (the shared-memory model predicted over the limit; not run)"
                )
                pruned.setdefault(why, []).append(
                    f"{f.label} ({f.smem_bytes // 1024} KiB)" if f.smem_bytes else f.label
                )
            else:
                by_error.setdefault(f.error, []).append(f.label)
        items = "".join(f"<li>{esc(err)}: {_codes(labels)}</li>" for err, labels in by_error.items())
        items += "".join(f"<li>{why}: {_codes(labels)}</li>" for why, labels in pruned.items())
        n_pruned = sum(map(len, pruned.values()))
        extra = f" ({n_pruned} pruned)" if n_pruned else ""
        out.append(
            f'<details class="list"><summary>{len(v.failed)} failed config'
            f"{'s' if len(v.failed) != 1 else ''}{extra}</summary><ul>{items}</ul></details>"
        )
    if v.missing:
        out.append(
            f'<details class="list"><summary class="warn">{len(v.missing)} planned config'
            f"{'s' if len(v.missing) != 1 else ''} without a record (resume redoes them)</summary>"
            f"<ul><li>{_codes(v.missing)}</li></ul></details>"
        )
    if v.never:
        searching = v.summary.coverage is not None and v.summary.coverage.searching
        why = (
            "not measured yet (the search has not ended: `resume` plans its next round)"
            if searching
            else "never measured (the search did not need them; not missing, not failed)"
        )
        out.append(
            f'<details class="list"><summary>{len(v.never)} planned config{"s" if len(v.never) != 1 else ""} '
            f"{why}</summary>"
            f"<ul><li>{_codes(v.never)}</li></ul></details>"
        )
    return "".join(out)


def card(v: ProblemView, with_tag: bool) -> str:
    title = esc(problem_title(v.summary.key, with_tag))
    return (
        f'<section class="problem" id="{v.anchor}"><h3><a href="#{v.anchor}">#{v.number}</a> {title}</h3>'
        f"{facts(v.summary)}{plot(v.heatmap, v.summary.n_configs)}{lists(v)}</section>"
    )


def grouped(keys: list[ProblemKey], render: Callable[[int], str], header: Callable[[list[int]], str]) -> str:
    """Cards grouped by ``GROUP_AXES`` in first-seen order; folded above ``FOLD_ABOVE`` problems.
    ``render(i)`` is the card of problem ``i``; ``header(indices)`` the group's count line."""
    groups: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(tuple(getattr(k, a) for a in GROUP_AXES), []).append(i)
    folded = len(keys) > FOLD_ABOVE
    axes = " and ".join(GROUP_AXES)
    if folded:
        intro = (
            f'<p class="note">{len(keys)} problems in {len(groups)} group{"s" if len(groups) != 1 else ""} by {axes}. '
            "The groups are folded to keep the page quick: open one, or click a problem's # in the table. Nothing is "
            "left out: every problem's card and heatmap is on this page.</p>"
        )
    else:
        intro = f'<p class="sub">{len(keys)} problem{"s" if len(keys) != 1 else ""}, grouped by {axes}.</p>'
    out = [intro]
    for g, (values, idx) in enumerate(groups.items(), 1):
        name = " &middot; ".join(f"{a} {esc(v)}" for a, v in zip(GROUP_AXES, values, strict=True))
        out.append(
            f'<details class="group" id="g-{g}"{"" if folded else " open"}><summary>{name}: '
            f'{header(idx)}</summary><div class="cards">{"".join(render(i) for i in idx)}</div></details>'
        )
    return "".join(out)


def key_cells(number: int, anchor: str, k: ProblemKey, with_tag: bool, axes: list[str]) -> tuple[list[str], list[str]]:
    """The leading cells of a summary row (number, problem axes, the optional ``axes`` of
    ``report.axis_columns``) and its filter values."""
    extra = axis_cells(k, axes)
    cells = [
        td(f'<a href="#{anchor}">{number}</a>', number, raw=True),
        td(k.dtype, cls="l"),
        td(k.head_dim),
        td(k.seq),
        td(k.batch),
        td(k.heads),
        *(td(v, cls="l") for v in extra),
        td(k.mode, cls="l"),
    ]
    fvals = [k.dtype, str(k.head_dim), str(k.seq), *extra, k.mode]
    if with_tag:
        tag = str(k.tag) if k.tag else "(no tag)"  # "" would be the filter's "all"
        cells.append(td(tag, cls="l"))
        fvals.append(tag)
    return cells, fvals


_AXIS_HINTS = {
    "causal": "causal masking",
    "KV": "key/value heads (grouped-query attention below H)",
    "impl": "kernel implementation",
}


def key_columns(with_tag: bool, axes: list[str]) -> list[Column]:
    """The leading columns, with the optional ``axes`` (causal, KV, impl) a table's problems need."""
    cols = [
        Column("n", "#", num=True, hint="document order; links to the problem's card"),
        Column("dtype", "dtype", left=True, filter=True),
        Column("head_dim", "D", num=True, filter=True),
        Column("seq", "seq", num=True, filter=True),
        Column("batch", "B", num=True),
        Column("heads", "H", num=True),
        *(Column(a.lower(), a, left=True, filter=True, hint=_AXIS_HINTS[a]) for a in axes),
        Column("mode", "mode", left=True, filter=True),
    ]
    if with_tag:
        cols.append(Column("tag", "tag", left=True, filter=True))
    return cols


# --------------------------------------------------------------------------- the report page


def _columns(with_tag: bool, axes: list[str]) -> list[Column]:
    return key_columns(with_tag, axes) + [
        Column("best", "best config", left=True),
        Column("ms", "ms", num=True),
        Column("spread", "q1-q3 ms", num=True, hint="q1 and q3 of the best config's samples"),
        Column("auto", "auto ms", num=True),
        Column("speedup", "speedup", num=True, desc_first=True, hint="auto ms / best ms"),
        Column("tflops", "TFLOP/s", num=True, desc_first=True),
        Column("configs", "configs", num=True),
        Column("failed", "failed", num=True, desc_first=True),
        Column(
            "pruned",
            "pruned",
            num=True,
            desc_first=True,
            hint="failed configs refused before running (the smem model, or pre-flight lowering)",
        ),
        Column("missing", "missing", num=True, desc_first=True, hint="planned configs without a record"),
        Column("auto_config", "auto config", left=True, hint="the config auto runs there"),
        Column("note", "note", left=True),
    ]


def _spread_cell(s: ProblemSummary) -> str:
    """The best config's q1-q3, free to wrap after its dash ("0.9900-" over "1.0100") where the
    table needs the room at 1280 px; sorted by its width."""
    if s.best_q1_ms is None or s.best_q3_ms is None:
        return td("-")
    text = f"{esc(fmt_ms(s.best_q1_ms))}-<wbr>{esc(fmt_ms(s.best_q3_ms))}"
    return td(text, repr(s.best_q3_ms - s.best_q1_ms), cls="range", raw=True)


def _rows(views: list[ProblemView], with_tag: bool, axes: list[str]) -> Iterator[tuple[list[str], list[str]]]:
    for v in views:
        s = v.summary
        cells, fvals = key_cells(v.number, v.anchor, s.key, with_tag, axes)
        cells += [
            _label_cell(s.best_label or "-"),
            ms_cell(s.best_ms),
            _spread_cell(s),
            ms_cell(s.auto_ms),
            num(s.speedup, ".2f", ratio_cls(s.speedup)),
            td("-") if s.tflops is None else td(tflops_text(s.tflops), repr(float(s.tflops))),
            td(s.n_configs),
            td(s.n_failed),
            td(s.n_pruned),
            td("-") if v.missing is None else td(len(v.missing), cls="warn" if v.missing else ""),
            _label_cell(s.auto_cell),
            td(s.note, cls="l"),
        ]
        yield cells, fvals


def _group_header(views: list[ProblemView]) -> Callable[[list[int]], str]:
    def header(idx: list[int]) -> str:
        n = len(idx)
        none = sum(1 for i in idx if views[i].summary.best_ms is None)
        gone = sum(1 for i in idx if views[i].missing)
        text = f"{n} problem{'s' if n != 1 else ''}"
        text += f", {none} without a best config" if none else ""
        return text + (f", {gone} with missing configs" if gone else "")

    return header


def use_line(doc: ResultsDoc, summaries: list[ProblemSummary]) -> str:
    """How to use what the table found: the command that writes its best configs (of the device
    kind the page shows) as the tuned table the kernels read, and what it writes where auto won;
    nothing where there is nothing measured to export (replayed timings are exported only when asked)."""
    if not any(not s.replayed and (s.best_ms is not None or s.auto_ms is not None) for s in summaries):
        return ""
    command = f"{PROG} export {word(doc.name)}{device_flag(doc)} --out tuned.json"
    text = (
        f"To use these configs: <code>{esc(command)}</code> writes each problem's best config into the tuned "
        "table that <code>kernels.tuned.config_for</code> answers a call's config from"
    )
    if any(s.use_auto for s in summaries):
        text += (
            f" (config null, answered with auto's config, where the note says &quot;{esc(AUTO_FASTER)}&quot; or "
            "the best is auto's config)"
        )
    return f'<p class="sub">{text}.</p>'


def report_page(doc: ResultsDoc, notes: Sequence[str] = ()) -> str:
    """The whole report page of a results document; ``notes``: what the command said of what it
    read (a mixed document's other devices, left out), at the page's top, as the page is sent on."""
    views = problem_views(doc)
    with_tag = len({v.summary.key.tag for v in views}) > 1
    axes = axis_columns(v.summary.key for v in views)
    limit = doc.max_rel_err
    n_err = sum(1 for r in doc.results if not is_success(r, limit))
    counts = {"records": len(doc.results), "without a timing": n_err, "problems": len(views)}
    body = [
        f"<h1>tilesweep report: {esc(Path(doc.name).name)}</h1>",
        f'<p class="sub">{esc(table_legend([v.summary for v in views]))}</p>',
        *(f'<p class="note">{esc(line)}</p>' for line in notes),
        f"<h2>Provenance</h2>{provenance(doc, counts)}",
        f"<h2>Summary</h2>{table(_columns(with_tag, axes), _rows(views, with_tag, axes), len(views))}"
        + use_line(doc, [v.summary for v in views]),
        f"<h2>Problems</h2>{legend([v.heatmap for v in views])}",
        grouped([v.summary.key for v in views], lambda i: card(views[i], with_tag), _group_header(views)),
    ]
    found = winners.contests([v.summary for v in views])
    if found:  # several implementations measured the same problems: which one wins each
        body.insert(4, f"<h2>Implementations compared</h2><pre>{esc(winners.format_contests(found))}</pre>")
    return shell(f"tilesweep report: {Path(doc.name).name}", "\n".join(body))


def write_page(path: str | os.PathLike[str], text: str) -> Path:
    """Write a page atomically (temp file, then rename; the temp file of a writer killed before,
    here, goes); a one-line error if it cannot be written, with what to do about it."""
    out = Path(path)
    remove_dead_temps(out, min_age_s=0)
    try:
        with atomic_open(out, "w") as f:
            f.write(text)
    except OSError as exc:
        raise TilesweepError(f"{out}: cannot write the page ({exc.strerror or exc}): {write_advice(exc)}") from None
    return out


def write_report(results: str | os.PathLike[str]) -> Path:
    """Read a results document and write its page beside it (``page_path``: a link's target,
    refused where that holds what is not a page: ``page_target``; of a document that mixes device
    kinds, its own kind's records: ``devices.one_device``); return the page's path."""
    from orchestrator.analysis.devices import one_device

    path = Path(results)
    page = page_path(path)
    narrowed = one_device(load(path))
    note = narrowed.note(narrowed.doc.name, "this page shows", f"{PROG} report {word(path)} --html PAGE")
    write_page(page_target(page), report_page(narrowed.doc, [] if note is None else [note]))
    return page
