"""One unit's worker run here: ``run_unit_job`` (what submitit's local and debug executors run)
and the process ``tilesweep run`` starts for each unit it runs here (``local_procs``)::

    python -m orchestrator.control.dispatch.local_worker SWEEP_DIR UNIT_ID [PRIOR_STARTS_JSON]

It imports neither submitit nor the rest of ``dispatch``: a local worker loads what measuring
needs and no more. It starts with SIGINT blocked (the run that started it blocks it around
the start) and ignores it, and ``jobs.in_flight.stop_signals`` takes SIGINT, SIGTERM and
SIGHUP over while the unit runs: a stop abandons the configs in flight and the worker exits
``128 + signal``, its log's last line saying it was interrupted. Exit codes: 0 the unit ran;
``128 + signal`` stopped by that signal; 1 a failure, whose reason is the log's last line
(``why.failure_line``).

A worker whose unit ran leaves through ``os._exit`` once its threads ended, the atexit
handlers ran and its output is flushed: the interpreter's teardown with jax loaded (every
object collected, the backend's destructors) cost a quarter of a CPU second and writes nothing.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from orchestrator.store.markers import UnitSummary

log = logging.getLogger(__name__)


def run_unit_job(
    sweep_dir: str, unit_id: str, prior_starts: dict[str, Any] | None = None, own_process: bool = False
) -> UnitSummary:
    """Run one unit (importable, picklable: submitit's local and debug executors run it). A
    failure leaves its reason as the log's last line (``why.failure_line``), as on SLURM. SIGINT,
    SIGTERM and SIGHUP are the worker's own (``jobs.in_flight.stop_signals``): they abandon the configs
    in flight and exit. ``own_process``: a local job's worker, which a stop ends quietly, saying
    so in its log (``why.interrupted_line``), exit status 128 + the signal, no traceback; in the
    debug executor's process the log says so too, and the stop goes on up to the command, which
    says it was interrupted."""
    from jobs.worker import run_unit
    from orchestrator.control.dispatch.nodelog import configure_node_logging
    from orchestrator.control.why import UNIT_LINE, crash_reason, failure_line
    from orchestrator.errors import SweepDirError, TilesweepError
    from orchestrator.store.files import WRITE_ERRNOS

    configure_node_logging()
    try:
        return run_unit(sweep_dir, unit_id, prior_starts=prior_starts)
    except TilesweepError as exc:
        log.error("%s", failure_line(unit_id, exc.message), extra=UNIT_LINE)
        raise
    except Exception as exc:
        log.error("%s", failure_line(unit_id, crash_reason(exc)), extra=UNIT_LINE)
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:  # the user's to fix: in that line wherever
            raise SweepDirError(crash_reason(exc)) from None  # it goes on (the debug run says its line)
        raise
    except (KeyboardInterrupt, SystemExit):
        code = _stopped(unit_id)  # the debug executor's unit, too, reads as interrupted
        if code is None or not own_process:
            raise
        raise SystemExit(code) from None


def _stopped(unit_id: str) -> int | None:
    """A worker a stop signal ended: its log's last line says so; the exit status to end with
    (None: not a stop signal's, the exception goes on as it is)."""
    from jobs.in_flight import stop_signal
    from orchestrator.control.why import UNIT_LINE, interrupted_line

    signum = stop_signal()
    if signum is None:
        return None
    name = signal.Signals(signum).name + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    log.warning("%s", interrupted_line(unit_id, f"stopped by {name}; its finished records are kept"), extra=UNIT_LINE)
    return 128 + signum


def main(argv: list[str]) -> int:
    """Run the unit of ``argv`` (see the module docstring); the exit code."""
    prior = json.loads(argv[2]) if len(argv) > 2 and argv[2] else None
    try:
        run_unit_job(argv[0], argv[1], prior or None, own_process=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def leave(code: int) -> NoReturn:
    """Exit with ``code`` as the interpreter would, without its teardown (module docstring)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    # started with SIGINT blocked (``local_procs.children_block_sigint``): ignored from here,
    # so one that came meanwhile is dropped, until the unit's own handlers take it over
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(sys.argv) not in (3, 4):
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'local_worker'} SWEEP_DIR UNIT_ID [PRIOR_JSON]")
    leave(main(sys.argv[1:]))
