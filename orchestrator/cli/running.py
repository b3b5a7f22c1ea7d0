"""``tilesweep run`` here (the local and debug executors): the units not done yet run with a
progress bar, and those other processes run are followed, then each round of the sweep's
strategy that they make due, then what a finished
sweep does (``finish.finish_sweep``). Before each such round it waits for a ``plan --lower`` of
the sweep, as ``common.prepare_run`` waits for one before the first units: a unit of a later round started
meanwhile could compile a config the lowering is about to refuse."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import word
from orchestrator.cli.common import (
    PROG,
    Progress,
    counted,
    items_in_units,
    planned_units,
    round_note,
    units_capped,
    wait_for_lowering,
    warn,
)
from orchestrator.cli.finish import failed_unit_lines, finish_sweep, unfinished_unit_lines
from orchestrator.cli.following import follow_units

if TYPE_CHECKING:  # the control flows import submitit: loaded when a command runs, not for --help
    from orchestrator.control.dispatch import UnitOutcome
    from orchestrator.spec.model import SweepSpec
    from orchestrator.store.sweepdir import SweepDir


def later_rounds_wait(progress: Progress) -> Callable[[Path], None]:
    """What ``run`` and ``resume`` here do before they plan a next round: wait while a ``plan
    --lower`` of the sweep runs, saying so above the progress bar (``common.wait_for_lowering``)."""

    def say(text: str) -> None:
        progress.note(f"{PROG}: {text}")

    def wait(root: Path) -> None:
        wait_for_lowering(root, "run", say=say, units="unit of its next round")

    return wait


def rerun_command(spec_path: str, sd: SweepDir) -> str:
    """The command that reruns a sweep here, redoing only what is missing."""
    return f"`{PROG} run {word(spec_path)} --sweep-dir {word(sd.root)}`"


def run_here(
    sd: SweepDir, unit_ids: list[str], existed: bool, kind: str, args: argparse.Namespace, *, html: bool
) -> int:
    """Run the units that are not done here (local or debug executor), merge, report."""
    from orchestrator.control.status import sweep_status
    from orchestrator.control.sweeps import check_interpreter_env

    st = sweep_status(sd, query_slurm=False)
    # a unit `resume` handed its missing items to is not run again: its later unit runs them; nor
    # one whose every item other units recorded (status: replaced); one a live worker holds
    # (`resume --no-wait` left it running) is followed, not run a second time
    held = [u.id for u in st.units if not u.complete and u.run_elsewhere]
    todo = [u.id for u in st.units if u.to_run_here]
    if todo:  # their workers run this interpreter: one the sweep's workers would all refuse is refused here
        check_interpreter_env(sd)
    print(
        f"sweep {sd.root}: {items_in_units(sd.planned, len(unit_ids))}"
        + (f", {st.done} already recorded" if existed and st.done else ""),
        file=sys.stderr,
    )
    if existed:
        _warn_kept_plan(sd, args)
    else:
        units_capped(args.units or sd.spec.sharding.units, planned_units(sd))
    if held:
        warn(
            f"note: {counted(len(held), 'unit')} of {sd.root} {'is' if len(held) == 1 else 'are'} run by a worker "
            f"already (e.g. {held[0]}, "
            f"`{PROG} status {word(sd.root)}` names it): following {'it' if len(held) == 1 else 'them'} instead of "
            f"starting a second worker on {'it' if len(held) == 1 else 'each'}"
        )
    if kind == "local" and (note := cpu_workers_note(sd.spec, len(todo), args.workers, "run with --workers 1")):
        warn(note)
    outcomes = _run_rounds_here(sd, todo, kind, args.workers, args.retry_errors)
    failed = failed_unit_lines(outcomes)
    if held:
        failed += follow_then_run_rounds(sd, held, kind, args.workers)
    return finish_sweep(sd, overwrite=args.overwrite, html=html, failed=failed, redo=rerun_command(args.spec, sd))


def cpu_workers_note(spec: SweepSpec, units: int, workers: int | None, alone: str) -> str | None:
    """The note said once where the workers of a run or a resume here time kernels side by side
    on this machine's CPUs (``dispatch.cpu_workers``): nothing keeps one worker's timings from the
    others' load. ``units``: how many units it starts with (a later round's units run side by side
    too); ``alone``: how this command times with one worker."""
    from orchestrator.control import dispatch

    n = dispatch.cpu_workers(spec, workers) if units else 0
    n = n if spec.timing.strategy != "full" else min(n, units)
    if n < 2:
        return None
    return (
        f"note: {n} workers time the kernels side by side on this machine's CPUs (interpret mode), which they "
        f"share, so each one's timings are disturbed by the others'; for timings to compare, {alone}"
    )


def _warn_kept_plan(sd: SweepDir, args: argparse.Namespace) -> None:
    """A reopened sweep directory keeps its plan: say which reuse options of this run it ignores
    (``--units``: ``prepare_run`` says so, where the plan has units that measure)."""
    if args.reuse or args.remeasure or args.reuse_errors or args.include_replays:
        warn(
            f"note: {sd.root} keeps the plan it was made with; --reuse, --remeasure, --reuse-errors and "
            "--include-replays apply when a sweep directory is planned (use a new --sweep-dir)"
        )


def _retry_here(sd: SweepDir, kind: str, retry: str, wait_lowering: Callable[[Path], None]) -> list[UnitOutcome]:
    """``run --retry-errors``: the error records of that kind, redone here in units of their own."""
    from orchestrator.control.resume import resume_sweep

    settings = sd.spec.executor.model_copy(update={"kind": kind})
    result = resume_sweep(
        sd,
        settings,
        force=False,
        units=None,
        max_array_size=None,
        retry=retry,
        include_missing=False,
        wait_lowering=wait_lowering,
    )
    if result.plan.retry:
        print(f"redid {len(result.plan.retry)} {retry} error records", file=sys.stderr)
    return result.outcomes


def follow_then_run_rounds(sd: SweepDir, held: list[str], kind: str, workers: int | None) -> list[str]:
    """Follow the units other processes run (``held``: a worker run by hand, or one a killed
    ``run`` left) to their end, then run here each round they made due (a halving's round 2, a
    search's next round), as ``run`` runs those its own units make due; the lines of the units
    that did not finish. The caller holds the sweep's run lease."""
    from orchestrator.control.rounds import pending_round

    failed = unfinished_unit_lines(follow_units(sd, held), only=held)
    if pending_round(sd) is not None:
        failed += failed_unit_lines(_run_rounds_here(sd, [], kind, workers, None))
    return failed


def _run_rounds_here(
    sd: SweepDir, todo: list[str], kind: str, workers: int | None, retry: str | None
) -> list[UnitOutcome]:
    """Run the units here with a progress bar (and ``--retry-errors``' redos); then each round
    of the sweep's strategy that they make due (``rounds.run_rounds_here``), each once no
    ``plan --lower`` of the sweep runs (``later_rounds_wait``)."""
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import NextRound, run_rounds_here
    from orchestrator.control.status import sweep_status

    progress = Progress(sweep_status(sd, query_slurm=False).total)

    def poll() -> None:
        progress.sweep(sweep_status(sd, query_slurm=False))

    def run(unit_ids: list[str]) -> list[UnitOutcome]:
        return dispatch.run_units_locally(sd, unit_ids, kind=kind, workers=workers, on_poll=poll)

    def announce(nxt: NextRound) -> None:
        poll()  # the round that ended shows its last count above what is said of the next
        progress.note(round_note(nxt))

    settings = sd.spec.executor.model_copy(update={"kind": kind})
    wait = later_rounds_wait(progress)
    try:  # closed on Ctrl-C too: else tqdm draws the bar once more after the one-line message
        outcomes = run(todo) if todo else []
        if retry:
            outcomes += _retry_here(sd, kind, retry, wait)
        outcomes += run_rounds_here(sd, settings, run, on_round=announce, wait_lowering=wait)
        poll()
    finally:
        progress.close()
    return outcomes
