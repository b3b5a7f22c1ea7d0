"""What a finished sweep does, whichever command saw it finish: ``run`` (here, or following
another ``run``, or on SLURM) and ``wait``.

``finish_sweep`` merges and says so in this order: the merge line (stderr), the best-config
table when the document holds records, one line per unit that ended unfinished, how much is
missing and the command that redoes only that, and last the report page's path when the spec
asks for it (``report.html``), so that ``tail -1`` of standard output finds it. Its exit code
is 1 when anything is left to redo: items without a record, or units that ended unfinished.
"""

from __future__ import annotations

import sys
from collections.abc import Container
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import word
from orchestrator.cli.common import PROG, counted, warn

if TYPE_CHECKING:  # the control flows import submitit: loaded when a command runs, not for --help
    from orchestrator.control.dispatch import UnitOutcome
    from orchestrator.control.status import SweepStatus
    from orchestrator.store.document import ResultsDoc
    from orchestrator.store.merge import MergeSummary
    from orchestrator.store.sweepdir import SweepDir


def merge_line(summary: MergeSummary) -> str:
    """One line on what a merge did, naming what it set aside (the warnings name the files)."""
    if not summary.written and not summary.quarantined:  # a sweep's end, where no unit recorded anything
        left = "is left as it was" if summary.output.exists() else "is not written"
        return f"nothing was measured: no unit wrote a record, so {summary.output} {left}"
    if not summary.written:
        return (
            f"wrote nothing: every partial with records was quarantined (see the warnings above); "
            f"{summary.output} is unchanged"
        )
    text = (
        f"merged {counted(summary.records, 'record')} ({counted(summary.errors, 'error')}, {summary.missing} of "
        f"{summary.planned} planned missing) into {summary.output}"
    )
    if summary.prev is not None:
        text += f"; the document it replaced held {counted(summary.replaced, 'record')}: kept as {summary.prev}"
    if summary.skipped_lines:
        what = "items without a record are redone by resume" if summary.missing else "items have records"
        text += f"; skipped {summary.skipped_lines} torn or invalid partial lines (their {what})"
    if summary.quarantined:
        text += f"; quarantined {counted(len(summary.quarantined), 'partial file')} (see the warnings above)"
    return text


def print_table(output: Path) -> None:
    """The best-config table of a results document (what `tilesweep report` prints): of one that
    mixes device kinds, its own kind's records, and a note naming the others."""
    from orchestrator.analysis import report
    from orchestrator.analysis.devices import one_device
    from orchestrator.store import document as results_doc

    narrowed = one_device(results_doc.load(output))
    doc = narrowed.doc
    note = narrowed.note(doc.name, "this table shows", f"{PROG} report {word(output)}")
    print(report.format_table(report.best_table(doc)))
    if note is not None:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    print_reused(doc)


def print_reused(doc: ResultsDoc) -> None:
    """Below a document's table: how many of its records reuse carried, from where, measured when."""
    from orchestrator.analysis.origins import carried_text

    carried = carried_text(doc)
    if carried is not None:
        print(f"\nreused: {carried}")


def print_page(output: Path) -> None:
    """Write the report page of ``report.html: true`` and print its path."""
    from orchestrator.analysis.html import write_report

    print(f"report page: {write_report(output)}")


def failed_unit_lines(outcomes: list[UnitOutcome]) -> list[str]:
    """One line per unit run here that ended unfinished: failed, with the worker's error (or
    the signal that killed it), or interrupted by a stop signal; and its log."""
    return [
        f"unit {o.unit} {'interrupted' if o.interrupted else 'failed'}: {o.error}"
        + (f" (log: {o.log})" if o.log else "")
        for o in outcomes
        if not o.ok
    ]


def unfinished_unit_lines(st: SweepStatus, only: Container[str] | None = None) -> list[str]:
    """One line per unit that ended unfinished and that no later unit took over (status's view:
    its state and why, how far it got, its log); ``only``: of those units."""
    return [
        f"unit {u.id} {u.state}"
        + (f" ({u.detail})" if u.detail else "")
        + f": {u.done}/{u.total} items"
        + (f"; log: {u.log}" if u.log else "")
        for u in st.ended_unfinished()
        if only is None or u.id in only
    ]


def finish_sweep(sd: SweepDir, *, overwrite: bool, html: bool, failed: list[str], redo: str) -> int:
    """Merge a sweep whose units have all ended and report it (see the module docstring).
    ``failed``: the lines of the units that ended unfinished; ``redo``: the command that redoes
    only what is missing; ``html``: whether to write the report page."""
    from orchestrator.control.sweeps import merge_sweep

    summary = merge_sweep(sd, overwrite=overwrite, skip_empty=True)
    print(merge_line(summary), file=sys.stderr)
    if summary.records:
        print_table(summary.output)
    for line in failed:
        warn(line)
    untimed = _survivors_untimed(sd)
    if summary.missing or failed or untimed:
        has = "has" if summary.missing == 1 else "have"
        left = [f"{counted(summary.missing, 'item')} {has} no record"] if summary.missing else []
        if untimed:
            left.append(f"{counted(untimed, 'survivor')} of round 2 not timed in full yet")
        warn(f"{'; '.join(left or [f'{counted(len(failed), "unit")} ended unfinished'])}; {redo} redoes only those")
    if summary.records and html:
        print_page(summary.output)
    return 1 if summary.missing or failed or untimed else 0


def _survivors_untimed(sd: SweepDir) -> int:
    """A halving sweep's survivors of round 2 whose full timing no record holds yet (merge counts
    items, each of which has its screen's record): what resume redoes besides the missing items."""
    if sd.spec.timing.strategy != "halving":
        return 0
    from orchestrator.control.status import sweep_status

    st = sweep_status(sd, query_slurm=False)
    return max(0, st.round2_total - st.done_of(2, st.round2_total)) if st.round2 is not None else 0
