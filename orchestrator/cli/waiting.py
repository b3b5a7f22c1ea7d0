"""``tilesweep wait``: a progress line until every unit of a sweep has settled, from any shell,
then what a finished sweep does (the merge, the best-config table, what is left to resume).
``run`` with the slurm executor ends in it too (``slurm.run_on_slurm``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from orchestrator import word
from orchestrator.cli.common import PROG, Progress, counted, wait_for_lowering, warn
from orchestrator.cli.finish import finish_sweep, unfinished_unit_lines
from orchestrator.store.sweepdir import SweepDir

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.control.status import SweepStatus


class _WaitDisplay:
    """The progress line of ``wait``, fed each status: a warning once for each unit that cannot
    start, a note once when round 2 is planned, and the records and unit states; and the line
    that says a next round waits for a ``plan --lower``."""

    def __init__(self, planned: int) -> None:
        self.progress = Progress(planned)
        self.warned: set[str] = set()
        self.announced = False
        self.rounds: set[int] = set()  # a search's rounds announced
        self.ended = False

    def __call__(self, st: SweepStatus) -> None:
        for u in st.units:
            if u.state == "pending" and u.stuck and u.id not in self.warned:
                self.warned.add(u.id)
                self.progress.note(f"{PROG}: warning: unit {u.id} (job {u.job_id}) waits for {u.detail}")
        if st.round2 is not None and not self.announced and st.halving:
            self.announced = True
            survivors, screened = st.round2.get("survivors", 0), st.round2.get("screened", 0)
            self.progress.note(
                f"{PROG}: round 2 times in full the {survivors} of {counted(screened, 'screened config')} "
                f"that can still win"
            )
        extra = "; units: " + ", ".join(f"{n} {s}" for s, n in st.counts().items())
        self.progress.sweep(st, extra)  # first: a search's round that ended shows its last count above the next's note
        for r in (st.search or [])[1:]:
            if r["round"] not in self.rounds:
                self.rounds.add(r["round"])
                planned = counted(r["planned"], "config")
                self.progress.note(f"{PROG}: round {r['round']} of the search: {planned} ({r['kind']})")
        if st.search_end is not None and not self.ended:
            self.ended = True
            self.progress.note(f"{PROG}: the search ended after {counted(st.search_end['search_round'], 'round')}")

    def lowering(self, root: Path) -> None:
        """Before a next round is submitted: wait for a ``plan --lower`` of the sweep, as ``submit``
        does, saying so above the bar."""
        wait_for_lowering(root, "submitted", say=lambda text: self.progress.note(f"{PROG}: {text}"))


def wait_and_merge(
    sd: SweepDir,
    *,
    interval: float = 2.0,
    slurm_interval: float = 10.0,
    timeout: float | None = None,
    html: bool | None = None,
    overwrite: bool = False,
) -> int:
    """A progress line until every unit has settled (warning once of each unit that cannot
    start), then what a finished sweep does (``finish.finish_sweep``: the merge, the best-config
    table, what is left to resume and, when asked (``html``, default: the sweep's frozen spec's
    ``report.html``), the report page's path)."""
    from orchestrator.control.wait import wait_until_settled
    from orchestrator.store.merge_output import check_target

    if not overwrite:
        check_target(sd)  # refuse before waiting, not after, to drop another sweep's records
    display = _WaitDisplay(sd.planned)
    try:  # closed on Ctrl-C too: else tqdm draws the bar once more after the one-line message
        st = wait_until_settled(
            sd,
            interval=interval,
            slurm_interval=slurm_interval,
            timeout=timeout,
            on_poll=display,
            wait_lowering=display.lowering,
        )
    except KeyboardInterrupt as stop:  # what runs the units outlives this command: say so, and how to stop it
        if stop.args:  # stopped waiting for a lowering, which said what it left
            raise
        here = word(sd.root)
        raise KeyboardInterrupt(
            f"the sweep's units go on: `{PROG} wait {here}` follows them again, `{PROG} cancel {here}` stops them"
        ) from None
    finally:
        display.progress.close()
    if not st.settled:
        warn(_unsettled_line(st, timeout, word(sd.root)))
        return 1
    code = finish_sweep(
        sd,
        overwrite=overwrite,
        html=sd.spec.report.html if html is None else html,
        failed=unfinished_unit_lines(st),
        redo=f"`{PROG} resume {word(sd.root)}`",
    )
    return max(code, _round_left_here(sd, st))


def _unsettled_line(st: SweepStatus, timeout: float | None, here: str) -> str:
    """What ``wait --timeout`` says of the units still unsettled when it gives up: that they
    run or wait, and of those SLURM holds, that they start only once released, and how."""
    unsettled = st.unsettled()
    held = [u for u in unsettled if u.held]
    after, again = f"after {timeout:.0f} s", f"`{PROG} wait {here}` again"
    if not held:
        return f"still running {after}: {counted(len(unsettled), 'unit')} pending or running; {again} later"
    mine = sorted({str(u.job_id) for u in held if u.held != "JobHeldAdmin"})
    them = "it" if len(held) == 1 else "them"
    if mine:
        start = f"`scontrol release {','.join(mine)}` starts {them}"
        if len(mine) < len(held):
            start += "; a SLURM administrator holds the rest, and only they can release those"
    else:
        start = f"a SLURM administrator holds {them}, and only they can release {them}"
    if len(held) == len(unsettled):
        return f"not started {after}: {counted(len(held), 'unit')} held by SLURM ({start}); {again} once released"
    return (
        f"still running {after}: {counted(len(unsettled), 'unit')} pending or running, "
        f"{len(held)} of them held by SLURM ({start}); {again} later"
    )


def _round_left_here(sd: SweepDir, st: SweepStatus) -> int:
    """A sweep run here whose strategy has a round still to plan once its units ended (wait
    plans rounds on SLURM only): say who does, exit 1."""
    from orchestrator.control.rounds import pending_round
    from orchestrator.control.sweeps import slurm_jobs

    number = pending_round(sd)
    if number is None or st.ended_unfinished() or st.items_done < st.planned or slurm_jobs(sd):
        return 0
    warn(f"round {number} of {sd.root} is still to plan and run: `{PROG} resume {word(sd.root)}` does it here")
    return 1


def cmd_wait(args: argparse.Namespace) -> int:
    from orchestrator.store.parse_procs import requested

    requested()  # a bad TILESWEEP_MERGE_PROCS is said before the wait, not after it
    sd = SweepDir.open(args.sweep_dir)
    return wait_and_merge(
        sd, interval=args.interval, slurm_interval=args.slurm_interval, timeout=args.timeout, overwrite=args.overwrite
    )
