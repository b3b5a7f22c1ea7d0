"""Waiting for a sweep to settle: every unit done, or ended without finishing.

The partial files are read often (they are cheap: counted on bytes); SLURM is asked
(one squeue + one sacct) less often, and once more before the wait declares the sweep
settled, so a lagging view never ends it early. Nothing here prints: ``on_poll`` hands
each status to the caller (the CLI draws a progress line from it).

A halving sweep on SLURM whose round 1 has settled complete, and whose round 2 nobody has
planned yet (the final merge job usually has; it cannot where compute nodes have no sbatch),
gets round 2 planned and submitted here, and the wait goes on until round 2 settles.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator import PROG
from orchestrator.control.status import ACTIVE, SweepStatus, sweep_status
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
) -> SweepStatus:
    """Poll until no unit is pending or running, or ``timeout`` seconds have passed (the
    status returned then is not settled). The partials are read every ``interval``; SLURM
    is asked at most every ``slurm_interval``. Units that were never submitted, with
    nothing else left to wait for, are refused: the wait would never end."""
    start = time.monotonic()
    view = None
    while True:
        stale = view is None or time.time() - view.taken >= slurm_interval
        st = sweep_status(sd, query_slurm=stale, view=None if stale else view)
        if st.view is not None:
            view = st.view
        never = [u.id for u in st.units if not u.submitted and u.state != "done"]
        if never and not any(u.state in ACTIVE and u.submitted for u in st.units):
            raise DispatchError(
                f"{len(never)} units of {sd.root} were never submitted (e.g. {never[0]}); "
                f"`{PROG} resume {sd.root}` submits them"
            )
        if on_poll is not None:
            on_poll(st)
        if st.settled and st.round2_pending and _next_round(sd):
            view = None
            continue
        if st.settled:
            fresh = view is not None and time.time() - view.taken < FRESH_VIEW_S
            if fresh or all(u.state == "done" for u in st.units):
                return st
            view = None  # confirm with a fresh answer
            continue
        if timeout is not None and time.monotonic() - start > timeout:
            return st
        time.sleep(interval)


def _next_round(sd: SweepDir) -> bool:
    """Plan and submit round 2 of a halving SLURM sweep; whether it was submitted now."""
    from orchestrator.control.submit import next_round
    from orchestrator.control.sweeps import slurm_jobs

    if not slurm_jobs(sd):
        return False  # run here: `run` and `resume` run round 2 themselves
    settings = sd.spec.executor.model_copy(update={"kind": "slurm"})
    done = next_round(sd, settings)
    return done is not None and bool(done.round2.units)
