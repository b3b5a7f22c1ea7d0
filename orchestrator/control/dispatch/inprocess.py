"""A local run's only unit, measured in this process when a worker process would only cost its
start.

A local run on a machine without a GPU runs its units one at a time, each in a worker process
(``local``: submitit's controller, then the worker). For a sweep of one unit, that costs more
than it isolates: a second and a third interpreter start, and the orchestrator's imports
(pydantic, the spec) are paid again in the worker, about one CPU second in a small sweep of
15-20. So a local run of one unit, with one worker and no GPU visible, measures here, as the
debug executor does, with the unit's log (``SweepDir.unit_log``) holding what its worker would
have logged, and the progress bar fed meanwhile from a thread.

The trade is crash isolation: a config that crashes the process (a segfault in XLA) ends this
command too, instead of only its worker, so there is no merge or report line for that run; its
``start`` line stays in the partial, and the rerun counts that death against it and runs it
alone, as after a worker's death. Where such crashes are to be expected, on a GPU (a bad config
can take the CUDA context down with it), units keep their own processes, as they do with more
than one unit or more than one worker, and the local executor's ``timeout_min`` holds only there.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from orchestrator.control.dispatch.nodelog import logs_to
from orchestrator.control.dispatch.tasks import run_unit_job
from orchestrator.control.scheduler import one_line
from orchestrator.control.why import read_failure
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)

POLL_S = 0.5


def wanted(unit_ids: list[str], workers: int, gpus: list[int]) -> bool:
    """Whether a local run of these units measures here (see the module docstring)."""
    return len(unit_ids) == 1 and workers == 1 and not gpus


class Ran(NamedTuple):
    """How the unit run here ended (``local.UnitOutcome`` is made of it)."""

    ok: bool
    job_id: str
    summary: dict[str, Any] | None = None
    error: str | None = None
    log: str | None = None


def run_here(sd: SweepDir, uid: str, prior: dict[str, Any] | None, on_poll: Callable[[], None] | None) -> Ran:
    """Run the unit here; its job is recorded as a local job whose process is this one. A stop
    (Ctrl-C, SIGTERM) ends the unit as it ends a worker (``jobs.in_flight``) and is raised on."""
    path = sd.unit_log(uid)
    path.parent.mkdir(parents=True, exist_ok=True)
    job_id = str(os.getpid())
    sd.record_jobs([{"unit": uid, "executor": "local", "job_id": job_id, "submitted": now_iso(), "log": str(path)}])
    done = threading.Event()
    poller = threading.Thread(target=_poll, args=(done, on_poll), daemon=True) if on_poll else None
    if poller is not None:
        poller.start()
    try:
        with logs_to(path):
            summary = run_unit_job(str(sd.root), uid, prior)
    except Exception as exc:  # the unit failed; its log says why, as a worker's would
        why = read_failure(path, uid) or one_line(exc)
        return Ran(ok=False, job_id=job_id, error=why, log=str(path))
    finally:
        done.set()
        if poller is not None:
            poller.join()
    return Ran(ok=True, job_id=job_id, summary=dict(summary))


def _poll(done: threading.Event, on_poll: Callable[[], None]) -> None:
    """Call ``on_poll`` every ``POLL_S`` until ``done`` (the unit has ended)."""
    while not done.wait(POLL_S):
        try:
            on_poll()
        except Exception as exc:  # a progress bar that cannot read the sweep must not stop the unit
            log.debug("progress poll failed: %s", exc)
