"""What the one line of a stopped command says it leaves (``main``: Ctrl-C, SIGTERM, SIGHUP),
by the command and its arguments: what a measuring command kept and that a rerun continues; that
a command which measures nothing changed nothing, or wrote each file whole; and of ``submit``,
``resume`` and ``run`` (the slurm executor's, which submits, then waits) once sbatch accepted
jobs, that those run on, and what follows, shows or stops them."""

from __future__ import annotations

import os
import sys

from orchestrator import PROG, word

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

INTERRUPTED_NOTE = "finished records are kept, rerun to continue"
# what a stop means for the commands that measure nothing (the others: ``INTERRUPTED_NOTE``)
_STOPPED_NOTES = {
    "merge": "a merge cut short leaves the results document as it was",
    **dict.fromkeys(("spec", "report", "export", "compare", "status", "ls", "logs", "impls"), "nothing was changed"),
}
# what a stop means for those of them that write files, where asked to (--html, --plots, --out):
# each is written whole (a temp file renamed into place) or not at all
_WROTE_NOTE = "each file written before the stop is whole; none is half-written"
_WRITERS, _WRITES = ("report", "export", "compare"), ("html", "plots", "out")
# the commands that hand units to sbatch (``run`` where its executor is slurm)
_SUBMITTERS = ("submit", "resume", "run")


def stop_note(command: str, args: argparse.Namespace | None) -> str:
    """What a stop of ``command`` means (``args``: its arguments, where they were parsed)."""
    if command in _WRITERS and any(getattr(args, a, None) not in (None, "-") for a in _WRITES):
        return _WROTE_NOTE
    if command in _SUBMITTERS and (root := _recorded_a_job()) is not None:
        return _accepted_note(root)
    if command == "submit":
        return "nothing was submitted"
    if command == "plan":  # it measures nothing; it writes a sweep directory only where given one
        lower = args is not None and args.lower
        shown = args is None or args.dry_run or (args.json and not lower) or not args.sweep_dir
        if shown:
            return "nothing was written"
        if lower:  # stopped before it lowered (once it lowers, or waits for another lowering, it says more)
            return "nothing was lowered; rerun it to finish the sweep directory and lower its configs"
        return "nothing was measured; rerun it to finish the sweep directory"
    return _STOPPED_NOTES.get(command, INTERRUPTED_NOTE)


def _recorded_a_job() -> os.PathLike[str] | None:
    """The sweep directory in whose history this process put a job (sbatch accepted it), if any."""
    sweepdir = sys.modules.get("orchestrator.store.sweepdir")
    return None if sweepdir is None else sweepdir.SweepDir.recorded_a_job


def _accepted_note(root: os.PathLike[str]) -> str:
    """What a stop of ``submit``, ``resume`` or ``run`` after sbatch accepted jobs leaves: those
    jobs, which run on (a rerun submits none of the units they run), and what follows, shows or
    stops them."""
    here = word(root)
    return (
        f"what sbatch accepted before the stop is recorded and runs on: `{PROG} wait {here}` follows it, "
        f"`{PROG} status {here}` shows it, `{PROG} cancel {here}` stops it"
    )
