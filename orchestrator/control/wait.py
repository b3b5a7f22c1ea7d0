"""Waiting for a sweep to settle: every unit done, or ended without finishing.

The partial files are read often (they are cheap: counted on bytes); SLURM is asked
(one squeue + one sacct) less often, and once more before the wait declares the sweep
settled, so a lagging view never ends it early. A sweep with no job on SLURM (run here) has
nothing to confirm: it is settled once no worker of it lives, whether its units finished or
not. Every poll sleeps, so a wait never spins a core. Nothing here prints: ``on_poll`` hands
each status to the caller (the CLI draws a progress line from it).

A sweep on SLURM whose strategy has a round still to plan once every unit has settled (the
final merge job usually has planned it; it cannot where compute nodes have no sbatch) is
advanced here (``rounds.advance``), and the wait goes on until that round settles. A
``plan --lower`` of the sweep that runs then is waited for first (the merge job leaves the round
to this wait where one runs), so that no unit of the round compiles a config it is about to refuse.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from orchestrator import PROG, word
from orchestrator.control.rounds import advance, pending_round
from orchestrator.control.scheduler import SchedulerView
from orchestrator.control.status import ACTIVE, SweepStatus, sweep_status
from orchestrator.control.sweeps import slurm_jobs
from orchestrator.errors import DispatchError
from orchestrator.store.sweepdir import SweepDir

# A scheduler's answer younger than this confirms that a settled sweep is settled.
FRESH_VIEW_S = 1.0


def wait_until_settled(
    sd: SweepDir,
    *,
    interval: float,
    slurm_interval: float,
    timeout: float | None,
    on_poll: Callable[[SweepStatus], None] | None = None,
    wait_lowering: Callable[[Path], None] | None = None,
) -> SweepStatus:
    """Poll until no unit is pending or running, or ``timeout`` seconds have passed (the
    status returned then is not settled). The partials are read every ``interval``; SLURM
    is asked at most every ``slurm_interval``. Units that were never submitted, with
    nothing else left to wait for, are refused: the wait would never end. ``wait_lowering``
    is given the sweep directory before a next round is planned, to wait for a ``plan --lower``
    of it."""
    start = time.monotonic()
    view = None
    while True:
        stale = view is None or time.time() - view.taken >= slurm_interval
        st = sweep_status(sd, query_slurm=stale, view=None if stale else view)
        if st.view is not None:
            view = st.view
        never = [u.id for u in st.never_started()]
        if never and not any(u.state in ACTIVE and (u.submitted or u.leased) for u in st.units):
            raise DispatchError(
                f"{len(never)} unit{'s' if len(never) != 1 else ''} of {sd.root} "
                f"{'were' if len(never) != 1 else 'was'} never submitted (e.g. {never[0]}); "
                f"`{PROG} resume {word(sd.root)}` submits {'them' if len(never) != 1 else 'it'}"
            )
        if on_poll is not None:
            on_poll(st)
        pause = interval
        if st.settled and pending_round(sd) is not None and _advance_on_slurm(sd, wait_lowering):
            view = None
        elif st.settled:
            if _certain(st, view, asked=stale):
                return st
            view = None  # confirm with a fresh answer, after a short pause
            pause = min(interval, FRESH_VIEW_S / 4)
        elif timeout is not None and time.monotonic() - start > timeout:
            return st
        time.sleep(pause)  # every poll sleeps: a wait never spins a core


def _certain(st: SweepStatus, view: SchedulerView | None, *, asked: bool) -> bool:
    """Whether a settled status is final: every unit is done, the scheduler's answer is fresh,
    or there is nothing the scheduler could say (a sweep run here: no job of it is on SLURM)."""
    if all(u.state == "done" for u in st.units):
        return True
    if view is not None and time.time() - view.taken < FRESH_VIEW_S:
        return True
    return asked and st.view is None


def _advance_on_slurm(sd: SweepDir, wait_lowering: Callable[[Path], None] | None) -> bool:
    """Advance a SLURM sweep to its next round, once no ``plan --lower`` of it runs
    (``wait_lowering``); whether units of it were submitted now."""
    if not slurm_jobs(sd):
        return False  # run here: `run` and `resume` run the next round themselves
    if wait_lowering is not None:  # before the sweep's lock, which other commands take meanwhile
        wait_lowering(sd.root)
    done = advance(sd, sd.spec.executor.model_copy(update={"kind": "slurm"}))
    return done is not None and bool(done.units)
