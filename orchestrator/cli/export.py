"""``tilesweep export DOC... --out FILE``: the tuned table ``kernels.tuned`` loads
(``orchestrator.analysis.export`` makes it), or, with ``--format tokamax``, tokamax's own tables
(``cli.tokamax``).

A tuned table written over an earlier one replaces it whole (one table is one export: its device
block and its winners are its own); the line that says what was written says what became of the
table there, and where that drops entries of problems the export does not hold, the table before
is kept beside it as ``<out>.prev`` (one generation: a ``.prev`` there already is refused in one
line before anything is written, as ``export --format tokamax`` does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.spelling import as_json
from orchestrator.cli.common import MAKES_FOLDERS, PROG, Subparsers, counted
from orchestrator.cli.outputs import check_output, is_tuned_table, refuse_unwritable, write_failed
from orchestrator.errors import TilesweepError
from orchestrator.store.files import same_file
from orchestrator.store.sweep_paths import sweep_holding

if TYPE_CHECKING:
    from orchestrator.analysis.combine import Combined
    from orchestrator.analysis.export import ExportSummary, Replaced
    from orchestrator.store.document import ResultsDoc


def register(subparsers: Subparsers) -> None:
    """Add ``export`` to an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "export",
        help="write the tuned table that kernels.tuned loads, or tokamax's autotuning tables",
        description="Write the best config per problem as a versioned tuned table "
        "(format tilesweep-tuned) for kernels.tuned.TunedTable. A problem where auto was "
        "faster than every forced config gets config null (use auto); one whose configs are not "
        "timed in full yet (a halving sweep before its round 2 timed them) gets no entry; one with planned configs "
        "not measured yet (a sweep stopped, then merged) gets the best measured so far, said in a note. "
        "--format tokamax writes "
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
    p.add_argument(
        "--device",
        metavar="KIND",
        help="device kind to export (default: the first document's, else the first kind the documents name)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help=f"tuned table to write (atomically, {MAKES_FOLDERS}; -: stdout); an existing file of another kind is "
        "refused; an earlier table it drops entries of is kept as FILE.prev; with --format tokamax: DIR",
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


def cmd_export(args: argparse.Namespace) -> int:
    from orchestrator.analysis import export
    from orchestrator.analysis.devices import kinds
    from orchestrator.store import document as results_doc
    from orchestrator.store.replayed import count_replayed

    target = _export_target(args)
    docs = [results_doc.load(path) for path in args.results]
    if args.format == "tokamax":
        return _export_tokamax(args, docs)
    doc, combined = docs[0], None
    if len(docs) > 1 or args.device is not None or any(count_replayed(d) for d in docs) or len(kinds(docs)) > 1:
        doc, combined = _combined(docs, args)
    table, summary = export.tuned_table(doc, keep_slower=args.keep_slower, combined=combined)
    if not summary.entries:  # an earlier table is not replaced by an empty one
        raise TilesweepError(_nothing_to_export(summary, doc, ", ".join(args.results)))
    over = None if args.out == "-" else _over(target, args.out, table)  # a refusal comes before any note
    if summary.refused:
        print(f"{PROG}: note: {_refused(summary)}", file=sys.stderr)
    if summary.searching:
        print(f"{PROG}: note: {_searching(summary.searching)}", file=sys.stderr)
    if summary.unmeasured:
        print(f"{PROG}: note: {_unmeasured(summary.unmeasured)}", file=sys.stderr)
    if summary.auto_unknown:
        print(f"{PROG}: note: {_auto_unknown(summary)}", file=sys.stderr)
    if over is None:  # the table on stdout, what was written on stderr
        if not _table_to_stdout(table):
            return 0
        done = ""
    else:
        done = _write_table(target, args.out, table, over)
    replayed = f", {summary.replayed} of them replayed, not measured" if summary.replayed else ""
    skipped = _skipped(summary)
    print(
        f"wrote {'the table to stdout' if args.out == '-' else args.out}: {_entries(summary.entries)} "
        f"({summary.tuned} tuned, {summary.use_auto} use auto{replayed}){skipped}{done}",
        file=sys.stderr if args.out == "-" else sys.stdout,
    )
    return 0


UNTIMED = "not timed in full yet, so their best is not known (resume their sweep to time them)"


def _skipped(summary: ExportSummary) -> str:
    """The problems an export wrote no entry for: those with no timing, and those whose configs
    are still to be timed in full (``export.untimed``), where auto is not known to win."""
    said = []
    if summary.skipped - summary.untimed:
        said.append(f", {counted(summary.skipped - summary.untimed, 'problem')} with no timing skipped")
    if summary.untimed:
        n = summary.untimed
        said.append(f", {counted(n, 'problem')} skipped: {'its' if n == 1 else 'their'} configs are {UNTIMED}")
    return "".join(said)


def _searching(n: int) -> str:
    """Entries of problems whose search has not ended: the best of what it measured so far."""
    which = "its entry is" if n == 1 else "their entries are"
    return (
        f"the search of {counted(n, 'problem')} has not ended: {which} the best of what it measured so far, "
        "which its next rounds may change (resume its sweep, then export again)"
    )


def _unmeasured(n: int) -> str:
    """Entries of problems with planned configs not measured yet (``export.unmeasured``): the best so far."""
    which = "its entry is" if n == 1 else "their entries are"
    return (
        f"{counted(n, 'problem')} {'has' if n == 1 else 'have'} planned configs not measured yet: {which} the "
        "best of what was measured so far, which those may beat (resume the sweep, then export again)"
    )


def _auto_unknown(summary: ExportSummary) -> str:
    """ "use auto" entries of jax's Mosaic GPU kernel whose auto config could not be lowered here, and why."""
    labels = summary.auto_unknown
    more = f" (and {counted(len(labels) - 1, 'other')})" if len(labels) > 1 else ""
    return (
        f'the "use auto" entry of {labels[0]}{more} names no auto_config, so TunedTable.lookup has no config '
        f"there (jax's Mosaic GPU kernel has no default config, and its auto is tilesweep's pick by lowering): "
        f"{summary.auto_unknown_why}; --keep-slower exports the best forced config there instead"
    )


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
            raise TilesweepError(f"--out {as_json(args.out)} names no folder; name the folder tokamax's tables go to")
        out = Path(args.out)
        if args.out == "-" or (out.exists() and not out.is_dir()):
            raise TilesweepError(
                f"--format tokamax writes a folder of tables; --out names that folder, and {args.out} is "
                f"{'standard output' if args.out == '-' else 'a file' if out.is_file() else 'not a folder'}"
            )
        from orchestrator.cli.tokamax import refuse_kind_folder

        refuse_kind_folder(args.out)
        where = out / "device" / "table.json"  # a table's place: said before anything is read or printed
        sweep = sweep_holding(where)
        if sweep is not None:
            raise TilesweepError(
                f"--out {args.out} is the sweep directory {sweep} or one of its folders, where tokamax's tables "
                "would be taken for the sweep's files; name a folder outside it"
            )
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
    return export_tokamax(
        docs, args.out, args.device, keep_slower=args.keep_slower, include_replays=args.include_replays
    )


def _combined(docs: list[ResultsDoc], args: argparse.Namespace) -> tuple[ResultsDoc, Combined]:
    """The documents as one (``analysis.combine``), with the line that says what was dropped, and
    what combining kept of them beside their records (their plans and survivors); a refusal where
    nothing is left to export."""
    from kernels.spelling import as_json
    from orchestrator.analysis.combine import combine, describe

    doc, combined = combine(docs, args.device, include_replays=args.include_replays)
    if not combined.kept and combined.replayed_left:
        raise TilesweepError(
            f"every record of device {as_json(combined.device_kind)} in {', '.join(args.results)} is replayed "
            "(a replay's times, drawn on a virtual clock, not measured); export measured documents, or pass "
            "--include-replays to export the replayed ones anyway (their entries then say replayed)"
        )
    if not combined.kept:
        raise TilesweepError(_no_record_of_kind(docs, args.results, combined.device_kind))
    print(describe(combined, len(docs)), file=sys.stderr if args.out == "-" else sys.stdout)  # stdout: the table
    return doc, combined


def _no_record_of_kind(docs: list[ResultsDoc], names: list[str], kind: object) -> str:
    """Why documents combined hold no record of the device ``kind``: they hold records of other
    kinds (named, to pass to --device), no record at all, or records that name no device kind."""
    from orchestrator.analysis.devices import kinds

    one, held, given = len(docs) == 1, kinds(docs), ", ".join(names)
    if held:
        return (
            f"no record of device {as_json(kind)} in {given}; {'it holds' if one else 'they hold'} "
            f"{', '.join(map(as_json, held))}: pass --device with one of those"
        )
    if not any(d.results for d in docs):
        return f"nothing to export: {given} {'holds' if one else 'hold'} no record; nothing written"
    return (
        f"no record of device {as_json(kind)} in {given}: {'its' if one else 'their'} records name no device kind "
        f"(no device_kind in {'its' if one else 'their'} device block); export {'it' if one else 'each'} alone, "
        "without --device"
    )


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _nothing_to_export(summary: ExportSummary, doc: ResultsDoc, docs: str) -> str:
    """Why an export has no entry to write, true of each case: its best configs refused, no
    record at all, or records of which none holds a timing."""
    n, unrecorded = summary.skipped, summary.unrecorded
    if summary.refused:
        untimed = f"; {counted(n, 'other problem')} with no timed record" if n else ""
        return f"nothing to export from {docs}: {_refused(summary)}{untimed}; nothing written"
    if not doc.results:
        planned = "its one planned problem was not measured"
        if n > 1:
            planned = f"none of its {n} planned problems was measured"
        return f"nothing to export: {docs} holds no record{': ' + planned if n else ''}; nothing written"
    if summary.untimed:
        what = f"the configs of {counted(summary.untimed, 'problem')} in {docs} are {UNTIMED}"
        if n > summary.untimed:
            what += f"; {counted(n - summary.untimed, 'other problem')} with no timed record"
    elif n == 1:
        what = f"the one problem in {docs} has records, none of them timed"
    elif not unrecorded:
        what = f"each of the {n} problems in {docs} has records, none of them timed"
    else:
        recorded = n - unrecorded
        what = (
            f"none of the {n} problems in {docs} has a timed record ({recorded} with records, none of them timed; "
            f"{unrecorded} with none)"
        )
    return f"nothing to export: {what}; nothing written"


def _table_to_stdout(table: dict[str, object]) -> bool:
    """``--out -``: the table on standard output; whether all of it was read."""
    print(json.dumps(table, indent=1))
    sys.stdout.flush()
    if getattr(sys.stdout, "closed_at_start", False):  # `>&-`: the table, the command's product, went nowhere
        raise TilesweepError("cannot write the table to standard output: it is closed; write it to --out FILE")
    if getattr(sys.stdout, "reader_gone", False):  # `| head`: not all of it was read
        print(f"{PROG}: the table was cut short: its reader closed standard output", file=sys.stderr)
        return False
    return True


def _over(target: str, out: str, table: dict[str, object]) -> tuple[bytes | None, Replaced | None]:
    """The tuned table there (None: none) and what writing ``table`` over it does to its entries;
    refused in one line, before anything is written, where it drops entries and a ``.prev``
    keeps an earlier table already."""
    from orchestrator.analysis import export
    from orchestrator.store.target import prev_path

    path = Path(target)
    before = path.read_bytes() if path.is_file() else b""
    if not before.strip():  # none there, or an empty file (`touch`): no table is replaced
        return None, None
    done = export.replaced(before, table)
    prev = prev_path(path)
    if done.dropped and prev.exists():
        raise TilesweepError(
            f"{out}: this export drops {_entries(done.dropped)} of the tuned table there (problems it does not hold), "
            f"and {prev.name} there already keeps an earlier table: nothing written; move {prev} away and export again"
        )
    return before, done


def _write_table(target: str, out: str, table: dict[str, object], over: tuple[bytes | None, Replaced | None]) -> str:
    """Write the table over the one there (``_over``), kept as ``.prev`` where entries are
    dropped; what became of it, as the line that says what was written ends."""
    from orchestrator.analysis import export
    from orchestrator.store.files import atomic_open
    from orchestrator.store.target import prev_path

    (before, done), prev = over, prev_path(Path(target))
    keeps = done is not None and done.dropped and before is not None
    try:
        if keeps:
            with atomic_open(prev, "wb") as fh:
                fh.write(before)
        export.write_atomic(target, table)
    except OSError as exc:
        if keeps:  # the table there is as it was: a .prev of it would refuse the export run again
            prev.unlink(missing_ok=True)
        raise TilesweepError(write_failed(out, "the tuned table", exc)) from None
    return "" if done is None else _said(done, prev.name)


def _said(done: Replaced, prev: str) -> str:
    """What became of the table there: its entries written again the same or changed, the new
    ones, those dropped (kept in ``prev``)."""
    if not (done.changed or done.new or done.dropped):
        return f"; replaced the table there with the same {_entries(done.same)} (nothing changed)"
    said = [f"{_entries(done.same)} the same"] if done.same else []
    said += [f"{_entries(done.changed)} changed"] if done.changed else []
    said += [f"{done.new} new entr{'y' if done.new == 1 else 'ies'}"] if done.new else []
    if done.dropped:
        gone = f"{_entries(done.dropped)} of problems this export does not hold dropped"
        said.append(f"{gone}; the table before is kept as {prev}")
    return f"; replaced the table there ({', '.join(said)})"
