"""The ``report``, ``export`` and ``compare`` subcommands (``export`` lives in ``cli.export``).

``register(subparsers)`` adds them to the main parser (``orchestrator.cli.main`` calls it). Each
handler takes the parsed ``argparse.Namespace``, prints its result on stdout (side notes such
as written files go to stderr, so ``--json`` output stays parseable) and returns an exit code.
Expected failures are raised as ``TilesweepError``; the caller turns them into one line on
stderr and exit code 2 (``main`` below does the same when this module is run on its own).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli import export
from orchestrator.cli.common import MAKES_FOLDERS, PROG, Subparsers, counted, non_negative_int
from orchestrator.cli.finish import print_reused
from orchestrator.cli.outputs import check_output, refuse_unwritable
from orchestrator.devicefiles import what_it_is
from orchestrator.errors import TilesweepError
from orchestrator.store.page_file import is_page

if TYPE_CHECKING:
    from orchestrator.store.document import ResultsDoc

# --plots draws this many problems unless told otherwise: about 25 s of matplotlib
DEFAULT_MAX_PLOTS = 64


def register(subparsers: Subparsers) -> None:
    """Add ``report``, ``export`` and ``compare`` to an ``add_subparsers()`` object."""
    _add_report(subparsers)
    export.register(subparsers)
    _add_compare(subparsers)


def _add_report(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="best config per problem, speedup over auto, TFLOP/s; optional plots",
        description="Best config per problem of a results document: its median and q1-q3, "
        "auto's median, speedup over auto, TFLOP/s (non-causal: fwd 4*B*H*S*S*D, "
        "fwd_bwd 3.5x that), configs measured and failed, and whether the best is within "
        "noise of the runner-up.",
    )
    p.add_argument("results", help="results document (JSON)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="a JSON array, one object per problem")
    fmt.add_argument("--markdown", action="store_true", help="a GitHub-flavoured table")
    p.add_argument(
        "--html",
        metavar="OUT.html",
        help="also write one self-contained page: summary table, provenance, a heatmap per problem "
        f"({MAKES_FOLDERS}; an existing file is replaced only if it is a page tilesweep wrote)",
    )
    p.add_argument(
        "--device",
        metavar="KIND",
        help="of a document that mixes device kinds (merge.mix_devices), the kind to report (default: the "
        "document's own, its device block's); the others are left out, and a note says how many",
    )
    p.add_argument(
        "--plots",
        metavar="DIR",
        help=f"also write PNG heatmaps and a speedup chart into DIR ({MAKES_FOLDERS}; needs matplotlib)",
    )
    p.add_argument(
        "--max-plots",
        type=non_negative_int,
        metavar="N",
        help=f"--plots draws the first N problems only (default {DEFAULT_MAX_PLOTS}; 0: all, about 0.4 s each)",
    )
    p.set_defaults(func=cmd_report)


def _add_compare(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="best config and median per problem in two results documents, and B/A",
        description="Compare two results documents problem by problem: best config and median "
        "in A and in B, the ratio B/A (below 1: B is faster), and problems found in only one.",
    )
    p.add_argument("a", metavar="A", help="first results document")
    p.add_argument("b", metavar="B", help="second results document")
    p.add_argument(
        "--device",
        metavar="KIND",
        help="compare the records of this device kind in both (default: each document's own, its device "
        "block's); of a document that mixes device kinds (merge.mix_devices) the others are left out, and a "
        "note says how many",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="a JSON object with a 'problems' array")
    fmt.add_argument("--markdown", action="store_true", help="a GitHub-flavoured table")
    p.add_argument(
        "--html",
        metavar="OUT.html",
        help=f"also write one self-contained page with A and B side by side ({MAKES_FOLDERS}; an existing file is "
        "replaced only if it is a page tilesweep wrote)",
    )
    p.set_defaults(func=cmd_compare)


def _style(args: argparse.Namespace) -> str:
    return "markdown" if getattr(args, "markdown", False) else "text"


def _page(html: str | None, inputs: list[str]) -> str:
    """Where the ``--html`` page goes ("" where none was asked for), refused before anything is read
    where it would destroy data (``outputs.check_output``)."""
    return "" if html is None else check_output(html, inputs, writes="tilesweep page", flag="--html", of_kind=is_page)


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.analysis import report, winners
    from orchestrator.store import document as results_doc

    if args.max_plots is not None and args.plots is None:
        raise TilesweepError("--max-plots caps what --plots DIR draws: add --plots DIR, or drop --max-plots")
    if args.plots is not None:
        _check_plots(args.plots)
    page = _page(args.html, [args.results])
    doc, notes = _one_device(results_doc.load(args.results), args.device, "this report shows")
    summaries = report.best_table(doc)
    found = winners.contests(summaries)
    if args.json:
        print(json.dumps(winners.with_winners(report.to_json(summaries), found), indent=1))
    else:
        print(report.format_table(summaries, _style(args)))
        print_reused(doc)
        if found:  # several implementations measured the same problems
            print(f"\nimplementations compared ({len(found)} problems):")
            print(winners.format_contests(found, _style(args)))
    if args.html is not None:
        from orchestrator.analysis import html

        html.write_page(page, html.report_page(doc, notes))
        print(f"wrote {args.html}", file=sys.stderr)
    if args.plots is not None:
        max_plots = DEFAULT_MAX_PLOTS if args.max_plots is None else args.max_plots
        _write_plots(doc, args.plots, max_plots, html_given=bool(args.html))
    return 0


def _one_device(doc: ResultsDoc, kind: str | None, reads: str) -> tuple[ResultsDoc, list[str]]:
    """``doc``'s records of one device kind (``analysis.devices``), and the note, said on stderr
    and kept for the page, where it left others out (``reads``: what the command does with the
    ones it kept)."""
    from orchestrator.analysis.devices import one_device

    narrowed = one_device(doc, kind)
    note = narrowed.note(doc.name, reads)
    if note is None:
        return narrowed.doc, []
    print(f"{PROG}: note: {note}", file=sys.stderr)
    return narrowed.doc, [note]


def _check_plots(out_dir: str) -> None:
    """Refuse, before the report is read or printed, a ``--plots`` folder no PNG could be written in."""
    if not out_dir.strip():
        raise TilesweepError("--plots '' names no folder; name the folder for the PNGs")
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise TilesweepError(f"--plots {out_dir} is {what_it_is(folder)}, not a folder; name a folder for the PNGs")
    refuse_unwritable(
        "--plots", out_dir, folder / "plot.png", instead="name a folder for the PNGs", another="name another"
    )


def _write_plots(doc: ResultsDoc, out_dir: str, max_plots: int, *, html_given: bool) -> None:
    """The PNGs, and a line on what the cap left out and how to get it."""
    from orchestrator.analysis import plots
    from orchestrator.cli.progress import Progress

    progress = Progress(1, label="problem")
    try:
        written = plots.write_plots(
            doc, out_dir, max_problems=max_plots or None, on_problem=lambda done, n: progress.update(done, total=n)
        )
    except OSError as exc:
        from orchestrator.store.files import write_advice

        raise TilesweepError(
            f"--plots {out_dir}: cannot write the plots ({exc.strerror or exc}): {write_advice(exc)}"
        ) from None
    finally:
        progress.close()
    if not written.files:
        print(f"{PROG}: note: {_no_plots(doc, out_dir)}", file=sys.stderr)
        return
    print(f"wrote {counted(len(written.files), 'plot')} to {out_dir}", file=sys.stderr)
    if written.folded:
        page = "the --html page has every problem" if html_given else "--html OUT.html shows every problem on one page"
        print(
            f"{PROG}: note: plotted the first {written.drawn} of {written.problems} problems (--max-plots "
            f"{max_plots}); {written.folded} not plotted: --max-plots 0 plots all (about 0.4 s each), "
            f"{page}",
            file=sys.stderr,
        )


def _no_plots(doc: ResultsDoc, out_dir: str) -> str:
    """Why ``--plots`` drew nothing (a document with no record: the plots draw records, failed
    ones too), and what measures the problems: the sweep that wrote it, where it names one."""
    from orchestrator import word
    from orchestrator.analysis.report import best_table
    from orchestrator.store.provenance import own_block

    n = len(best_table(doc))
    if n == 0:
        planned = ""
    elif n == 1:
        planned = ": its one planned problem was not measured"
    else:
        planned = f": none of its {n} planned problems was measured"
    block = own_block(doc.extra.get("tilesweep"))
    sweep = word(str(block["sweep_dir"])) if block is not None and block.get("sweep_dir") else None
    then = (
        f"`{PROG} status {sweep}` says why, `{PROG} resume {sweep}` measures them"
        if sweep
        else f"measure its problems first (`{PROG} run SPEC`)"
    )
    return f"no plot written to {out_dir}: {doc.name} holds no record{planned}; {then}"


def cmd_compare(args: argparse.Namespace) -> int:
    from orchestrator.analysis import compare
    from orchestrator.store import document as results_doc

    page = _page(args.html, [args.a, args.b])
    (doc_a, notes_a), (doc_b, notes_b) = (
        _one_device(results_doc.load(path), args.device, "compare reads") for path in (args.a, args.b)
    )
    rows = compare.compare(doc_a, doc_b)
    for line in compare.caveats(rows, doc_a, doc_b):
        print(f"{PROG}: note: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(compare.to_json(rows, doc_a, doc_b), indent=1))
    else:
        print(compare.format_compare(rows, _style(args), doc_a=doc_a, doc_b=doc_b))
    if args.html is not None:
        from orchestrator.analysis import compare_html, html

        html.write_page(page, compare_html.compare_page(doc_a, doc_b, [*notes_a, *notes_b]))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one of these subcommands without the main CLI (``python -m orchestrator.cli.analysis``)."""
    parser = argparse.ArgumentParser(prog=PROG)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TilesweepError as exc:
        print(f"{PROG}: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
