"""The ``report``, ``export`` and ``compare`` subcommands.

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

from orchestrator.cli.common import MAKES_FOLDERS, PROG, Subparsers, counted, non_negative_int
from orchestrator.cli.finish import print_reused
from orchestrator.cli.outputs import check_output, is_tuned_table, refuse_unwritable
from orchestrator.errors import TilesweepError
from orchestrator.store.files import same_file
from orchestrator.store.page_file import is_page

if TYPE_CHECKING:
    from orchestrator.analysis.export import ExportSummary
    from orchestrator.store.document import ResultsDoc

# --plots draws this many problems unless told otherwise: about 25 s of matplotlib
DEFAULT_MAX_PLOTS = 64


def register(subparsers: Subparsers) -> None:
    """Add ``report``, ``export`` and ``compare`` to an ``add_subparsers()`` object."""
    _add_report(subparsers)
    _add_export(subparsers)
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


def _add_export(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write the tuned table that kernels.tuned loads, or tokamax's autotuning tables",
        description="Write the best config per problem as a versioned tuned table "
        "(format tilesweep-tuned) for kernels.tuned.TunedTable. A problem where auto was "
        "faster than every forced config gets config null (use auto). --format tokamax writes "
        "the records of tokamax's kernels as tokamax's own autotuning tables instead: "
        "DIR/<device dir>/<op>.json, one folder per device kind, every measured config with its "
        "raw samples (tokamax then runs the fastest).",
    )
    p.add_argument(
        "results",
        nargs="+",
        help="results documents (JSON); of several, per record identity the "
        "newest record of the chosen device kind is kept",
    )
    p.add_argument("--device", metavar="KIND", help="device kind to export (default: the first document's)")
    p.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help=f"tuned table to write (atomically, {MAKES_FOLDERS}; -: stdout); an existing file of another kind is "
        "refused; with --format tokamax: DIR",
    )
    p.add_argument(
        "--format",
        choices=("tilesweep", "tokamax"),
        default="tilesweep",
        help="tilesweep: the tuned table (default); tokamax: tokamax's autotuning tables (needs tilesweep[tokamax])",
    )
    p.add_argument(
        "--keep-slower",
        action="store_true",
        help="export the best forced config even where auto was faster (--format tokamax: the problem's keys)",
    )
    p.add_argument(
        "--include-replays",
        action="store_true",
        help="also take replayed records (a replay's, on a virtual clock) where no measured record "
        "has their identity; their entries say replayed (default: left out)",
    )
    p.set_defaults(func=cmd_export)


def _add_compare(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="best config and median per problem in two results documents, and B/A",
        description="Compare two results documents problem by problem: best config and median "
        "in A and in B, the ratio B/A (below 1: B is faster), and problems found in only one.",
    )
    p.add_argument("a", metavar="A", help="first results document")
    p.add_argument("b", metavar="B", help="second results document")
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
    doc = results_doc.load(args.results)
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

        html.write_page(page, html.report_page(doc))
        print(f"wrote {args.html}", file=sys.stderr)
    if args.plots is not None:
        max_plots = DEFAULT_MAX_PLOTS if args.max_plots is None else args.max_plots
        _write_plots(doc, args.plots, max_plots, html_given=bool(args.html))
    return 0


def _check_plots(out_dir: str) -> None:
    """Refuse, before the report is read or printed, a ``--plots`` folder no PNG could be written in."""
    if not out_dir.strip():
        raise TilesweepError("--plots '' names no folder; name the folder for the PNGs")
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise TilesweepError(f"--plots {out_dir} is a file; name a folder for the PNGs")
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
    print(f"wrote {counted(len(written.files), 'plot')} to {out_dir}", file=sys.stderr)
    if written.folded:
        page = "the --html page has every problem" if html_given else "--html OUT.html shows every problem on one page"
        print(
            f"{PROG}: note: plotted the first {written.drawn} of {written.problems} problems (--max-plots "
            f"{max_plots}); {written.folded} not plotted: --max-plots 0 plots all (about 0.4 s each), "
            f"{page}",
            file=sys.stderr,
        )


def cmd_export(args: argparse.Namespace) -> int:
    from orchestrator.analysis import export
    from orchestrator.store import document as results_doc
    from orchestrator.store.replayed import count_replayed

    target = _export_target(args)
    docs = [results_doc.load(path) for path in args.results]
    if args.format == "tokamax":
        return _export_tokamax(args, docs)
    doc = docs[0]
    if len(docs) > 1 or args.device is not None or any(count_replayed(d) for d in docs):
        doc = _combined(docs, args)
    table, summary = export.tuned_table(doc, keep_slower=args.keep_slower)
    if not summary.entries:  # an earlier table is not replaced by an empty one
        docs_named = ", ".join(args.results)
        if summary.refused:
            raise TilesweepError(f"nothing to export from {docs_named}: {_refused(summary)}; nothing written")
        none = "the problem" if summary.skipped == 1 else f"none of the {summary.skipped} problems"
        raise TilesweepError(f"nothing to export: {none} in {docs_named} has a timed record; nothing written")
    if summary.refused:
        print(f"{PROG}: note: {_refused(summary)}", file=sys.stderr)
    if args.out == "-":  # the table on stdout, what was written on stderr
        print(json.dumps(table, indent=1))
        sys.stdout.flush()
        if getattr(sys.stdout, "closed_at_start", False):  # `>&-`: the table, the command's product, went nowhere
            raise TilesweepError("cannot write the table to standard output: it is closed; write it to --out FILE")
        if getattr(sys.stdout, "reader_gone", False):  # `| head`: not all of it was read
            print(f"{PROG}: the table was cut short: its reader closed standard output", file=sys.stderr)
            return 0
    else:
        try:
            export.write_atomic(target, table)
        except OSError as exc:
            raise TilesweepError(f"{args.out}: cannot write the tuned table ({exc.strerror or exc})") from None
    replayed = f", {summary.replayed} of them replayed, not measured" if summary.replayed else ""
    skipped = f", {counted(summary.skipped, 'problem')} with no timing skipped" if summary.skipped else ""
    entries = f"{summary.entries} entr{'y' if summary.entries == 1 else 'ies'}"
    print(
        f"wrote {'the table to stdout' if args.out == '-' else args.out}: {entries} "
        f"({summary.tuned} tuned, {summary.use_auto} use auto{replayed}){skipped}",
        file=sys.stderr if args.out == "-" else sys.stdout,
    )
    return 0


def _refused(summary: ExportSummary) -> str:
    """The problems export left out because kernels.tuned refuses their best config, in one line."""
    (label, why), more = summary.refused[0], len(summary.refused) - 1
    also = f" (and {counted(more, 'other problem')})" if more else ""
    return f"left out {label}{also}: its best config is one kernels.tuned refuses: {why}"


def _export_target(args: argparse.Namespace) -> str:
    """Where ``export`` writes (``-``: standard output), each input given once and the options
    of its format checked, before anything is read."""
    for k, path in enumerate(args.results):
        if any(same_file(Path(path), Path(p)) for p in args.results[:k]):
            raise TilesweepError(f"{path} is given twice; give each results document once")
    if args.format == "tokamax":
        if not args.out.strip():
            raise TilesweepError(f"--out {args.out!r} names no folder; name the folder tokamax's tables go to")
        out = Path(args.out)
        if args.out == "-" or (out.exists() and not out.is_dir()):
            raise TilesweepError(
                f"--format tokamax writes a folder of tables; --out names that folder, and {args.out} is "
                f"{'standard output' if args.out == '-' else 'a file' if out.is_file() else 'not a folder'}"
            )
        where = out / "device" / "table.json"  # a table's place: said before anything is read or printed
        refuse_unwritable(
            "--out", args.out, where, instead="name a folder for the tables", another="name another folder"
        )
        return str(args.out)
    if args.out == "-":
        return "-"
    return check_output(args.out, args.results, writes="tuned table", flag="--out", of_kind=is_tuned_table)


def _export_tokamax(args: argparse.Namespace, docs: list[ResultsDoc]) -> int:
    """``export --format tokamax``: replayed records refused unless asked for, then the tables."""
    from orchestrator.cli.tokamax import export_tokamax
    from orchestrator.store.replayed import count_replayed

    replays = {path: n for path, d in zip(args.results, docs, strict=True) if (n := count_replayed(d))}
    if replays and not args.include_replays:
        which = ", ".join(f"{path} ({n})" for path, n in replays.items())
        raise TilesweepError(
            f"replayed records (times drawn on a virtual clock, not measured) in {which}: tokamax would take "
            "them for measurements; export measured documents, or pass --include-replays to export them anyway"
        )
    return export_tokamax(docs, args.out, args.device, keep_slower=args.keep_slower)


def _combined(docs: list[ResultsDoc], args: argparse.Namespace) -> ResultsDoc:
    """The documents as one (``analysis.combine``), with the line that says what was dropped; a
    refusal where nothing is left to export."""
    from kernels.spelling import as_json
    from orchestrator.analysis.combine import combine, describe, kinds

    doc, combined = combine(docs, args.device, include_replays=args.include_replays)
    if not combined.kept and combined.replayed_left:
        raise TilesweepError(
            f"every record of device {as_json(combined.device_kind)} in {', '.join(args.results)} is replayed "
            "(a replay's times, drawn on a virtual clock, not measured); export measured documents, or pass "
            "--include-replays to export the replayed ones anyway (their entries then say replayed)"
        )
    if not combined.kept:
        held = ", ".join(map(as_json, kinds(docs))) or "none named"
        raise TilesweepError(
            f"no record of device {as_json(combined.device_kind)} in {', '.join(args.results)}; they hold {held}: "
            "pass --device with one of those"
        )
    print(describe(combined, len(docs)), file=sys.stderr if args.out == "-" else sys.stdout)  # stdout: the table
    return doc


def cmd_compare(args: argparse.Namespace) -> int:
    from orchestrator.analysis import compare
    from orchestrator.store import document as results_doc

    page = _page(args.html, [args.a, args.b])
    doc_a, doc_b = results_doc.load(args.a), results_doc.load(args.b)
    rows = compare.compare(doc_a, doc_b)
    for line in compare.caveats(rows, doc_a, doc_b):
        print(f"{PROG}: note: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(compare.to_json(rows, doc_a, doc_b), indent=1))
    else:
        print(compare.format_compare(rows, _style(args), doc_a=doc_a, doc_b=doc_b))
    if args.html is not None:
        from orchestrator.analysis import compare_html, html

        html.write_page(page, compare_html.compare_page(doc_a, doc_b))
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
