"""Following a local sweep that other processes run: another ``tilesweep run``, or a ``resume``
that runs it here (``run`` of the same sweep follows it instead of starting a second run beside
it), or the workers that ``resume --no-wait`` left running (``run`` follows them instead of
starting a second worker on their units). The progress bar is the one of ``run`` and ``wait``;
each look at the sweep directory is a second after the last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator import word
from orchestrator.cli.common import PROG, Progress, warn
from orchestrator.cli.finish import finish_sweep, unfinished_unit_lines

if TYPE_CHECKING:
    from orchestrator.control.status_model import SweepStatus
    from orchestrator.store.leases import Holder
    from orchestrator.store.sweepdir import SweepDir

LOOK_EVERY_S = 1.0


def follow(sd: SweepDir, going: Callable[[SweepStatus], bool], said: str | None = None) -> SweepStatus:
    """Show the sweep's progress while ``going(status)``; the last status. ``said``: the note
    that says whose work is followed, printed where a Ctrl-C from then on stops the following."""
    from orchestrator.control.status import sweep_status

    progress: Progress | None = None
    try:  # closed on Ctrl-C too: else tqdm draws the bar once more after the one-line message
        if said is not None:
            warn(said)
        progress = Progress(sd.planned)
        while True:
            st = sweep_status(sd, query_slurm=False)
            progress.sweep(st)
            if not going(st):
                return st
            time.sleep(LOOK_EVERY_S)
    except KeyboardInterrupt:  # what runs the sweep is another process: it goes on
        here = word(sd.root)
        raise KeyboardInterrupt(
            f"stopped following; what runs the sweep goes on: `{PROG} wait {here}` follows it again, "
            f"`{PROG} cancel {here}` stops it"
        ) from None
    finally:
        if progress is not None:
            progress.close()


def follow_units(sd: SweepDir, held: list[str]) -> SweepStatus:
    """Follow until no other process runs any of the ``held`` units (``UnitStatus.run_elsewhere``)."""
    return follow(sd, lambda st: any(u.run_elsewhere for u in st.units if u.id in held))


def follow_run(sd: SweepDir, other: Holder, *, redo: str, html: bool, overwrite: bool = False) -> int:
    """Another command runs this sweep (``other``: a ``tilesweep run``, or a ``resume`` here): show
    its progress until it ends, then merge and report (``redo``: the command that reruns what it
    left unfinished)."""
    from orchestrator.control.sweeps import other_run_live

    said = (
        f"note: {sd.root} is being run by another {other.command()} ({other.describe()}); following its "
        "progress instead of starting a second run beside it (Ctrl-C stops following, not that run)"
    )
    st = follow(sd, lambda _: other_run_live(sd), said)
    return finish_sweep(sd, overwrite=overwrite, html=html, failed=unfinished_unit_lines(st), redo=redo)
