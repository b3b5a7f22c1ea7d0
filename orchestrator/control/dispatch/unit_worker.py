"""A GPU's worker process inside a SLURM task, started by ``node.TaskWorkers`` as a fork of
the task (``forked``), which runs the units the task hands it one after another (``serve``);
or one unit by hand:

    python -m orchestrator.control.dispatch.unit_worker SWEEP_DIR UNIT_ID [PRIOR_STARTS_JSON]

Its own process, so that it sees only its own GPU (``CUDA_VISIBLE_DEVICES`` is set before
jax is imported) and its own CPU share (its affinity, which sizes its compile pool). Its
output goes to the log of the unit it runs: it switches logs when it takes the next unit.

Signals. The parent blocks USR2, TERM and USR1 before it execs this, so a signal that arrives
while Python starts is held, not fatal; they are unblocked once these handlers are in place.
SLURM sends its signals to every process of the task, and the parent forwards them too, so
each handler acts once however often it is called:

- USR2 (the time-limit warning, or a preemption): finish the config being timed, abandon
  the ones compiled ahead (not their fault), exit ``STOPPED``; the parent then requeues.
- TERM (scancel, the end of the limit, a dying parent): abandon the configs in flight at
  once (SIGKILL follows), stop at the next config; the one being timed runs to its end, but
  its record, timed through the task's teardown, is not written (``jobs.in_flight.abandoned``).
- USR1 (the task's grace after USR2 ran out; SIGKILL follows): mark the configs in flight
  hung (``jobs.in_flight.mark_hung``), so a config the time limit keeps finding hung is
  recorded as a timeout, not a crash.

A unit's code (``node`` reads them, as the worker's message or exit code): 0 the unit is
done; ``STOPPED`` stopped on a signal first; ``HELD`` not started, another live worker holds
the unit; ``NOT_STARTED`` not started, the worker was told to stop before; 2 a broken
environment or input (``TilesweepError``); 1 anything else. A failure's reason is the log's
last line (``why.failure_line``). After a stop or an unexpected error the worker takes no
further unit and exits (the task starts a fresh worker for the GPU's next unit, if any).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

STOPPED = 3
HELD = 4
NOT_STARTED = 5
LAST = (1, STOPPED)  # the codes after which a worker takes no further unit
SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGUSR1)

log = logging.getLogger(__name__)
_state = {"stop": False, "abandoned": False}


def _on_warning(signum: int, frame: FrameType | None) -> None:
    if not _state["stop"]:
        log.warning(
            "caught %s (time limit near, or preemption): finishing the config being timed, then stopping",
            signal.Signals(signum).name,
        )
    _state["stop"] = True


def _on_term(signum: int, frame: FrameType | None) -> None:
    _state["stop"] = True
    if _state["abandoned"]:
        return
    _state["abandoned"] = True
    worker = sys.modules.get("jobs.worker")  # never import inside a handler: the main thread may be importing
    given_up = None
    if worker is not None and hasattr(worker, "abandon_in_flight"):
        try:
            given_up = worker.abandon_in_flight()
        except Exception as exc:  # a write interrupted mid-way: the kill follows anyway
            given_up = f"none ({type(exc).__name__}: {exc})"
    log.warning("caught %s: stopping; abandoned configs in flight: %s", signal.Signals(signum).name, given_up or "none")


def _on_hung(signum: int, frame: FrameType | None) -> None:
    flight = sys.modules.get("jobs.in_flight")  # never import inside a handler
    hung = None
    if flight is not None:
        try:
            hung = flight.mark_hung()
        except Exception as exc:  # a write interrupted mid-way: the configs still count as deaths
            hung = f"unknown ({type(exc).__name__}: {exc})"
    log.warning(
        "caught %s: the task's grace ran out; configs in flight marked hung: %s",
        signal.Signals(signum).name,
        hung or "none",
    )


def install_handlers() -> None:
    """Handlers first, then unblock what the parent blocked (see the module docstring)."""
    signal.signal(signal.SIGUSR2, _on_warning)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGUSR1, _on_hung)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def run(sweep_dir: str, unit_id: str, prior: dict[str, Any] | None) -> int:
    """Run the unit; return the exit code (see the module docstring)."""
    from jobs.worker import run_unit
    from orchestrator import counted
    from orchestrator.control.why import crash_reason, failure_line, not_started_line
    from orchestrator.errors import LeaseHeld, TilesweepError

    try:
        # SIGINT only: TERM is this module's (abandon, then stop at the next config: STOPPED)
        summary = run_unit(
            sweep_dir, unit_id, stop_check=lambda: _state["stop"], prior_starts=prior, stop_on=(signal.SIGINT,)
        )
    except LeaseHeld as exc:
        log.warning("%s", not_started_line(unit_id, exc.message))
        return HELD
    except TilesweepError as exc:
        log.error("%s", failure_line(unit_id, exc.message))
        return 2
    except MemoryError:
        log.error("%s", failure_line(unit_id, "out of memory (MemoryError in the worker)"))
        return 1
    except Exception as exc:
        log.exception("unit %s: the worker crashed", unit_id)
        log.error("%s", failure_line(unit_id, crash_reason(exc)))
        return 1
    if summary["stopped"]:
        log.warning(
            "unit %s stopped after %s; the rest is done when the task is requeued or resumed",
            unit_id,
            counted(summary["done"], "record"),
        )
        return STOPPED
    records, errors = counted(summary["done"], "record"), counted(summary["errors"], "error")
    log.info("unit %s done: %s (%s) in %.1f s", unit_id, records, errors, summary["wall_s"])
    return 0


TASK_DIED = (
    "the task's own process died (killed by a signal, or by the out-of-memory killer), and this worker stopped "
    "with it; its finished records are kept"
)


def serve(argv: list[str], recv_fd: int, send_fd: int) -> int:
    """A GPU's worker: run ``argv``'s unit (``SWEEP_DIR UNIT_ID PRIOR_JSON``), then each unit
    the task hands over on ``recv_fd`` (a JSON line: ``unit``, ``prior``, ``log``; ``quit``:
    none left), saying on ``send_fd`` how each ended (``unit``, ``code``, ``next``: whether it
    takes another). Returns the exit code: 0, or the last unit's code when it took no other."""
    install_handlers()
    from orchestrator.control.dispatch.nodelog import configure_node_logging

    configure_node_logging()
    sweep_dir, unit = argv[0], argv[1]
    prior = json.loads(argv[2]) if len(argv) > 2 and argv[2] else None
    inbox = os.fdopen(recv_fd, "rb")
    while True:
        code = NOT_STARTED if _state["stop"] else run(sweep_dir, unit, prior)
        last = code in LAST or _state["stop"]
        try:
            os.write(send_fd, json.dumps({"unit": unit, "code": code, "next": not last}).encode() + b"\n")
        except BrokenPipeError:  # the task's process is gone: its death signal stopped this worker
            from orchestrator.control.why import failure_line

            log.error("%s", failure_line(unit, TASK_DIED))
            return code if code not in (0, STOPPED) else 1
        if last:
            return code if code in LAST else 0
        line = inbox.readline()
        message: dict[str, Any] = json.loads(line) if line.strip() else {"quit": True}
        if message.get("quit"):
            return 0
        unit, prior = str(message["unit"]), message.get("prior") or None
        _log_to(str(message["log"]))


def _log_to(path: str) -> None:
    """The worker's output (and its compile processes') goes to ``path`` from here on."""
    from orchestrator.store.files import append_fd

    sys.stdout.flush()
    sys.stderr.flush()
    fd = append_fd(path)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    install_handlers()
    args = sys.argv[1:] if argv is None else argv
    from orchestrator.control.dispatch.nodelog import configure_node_logging

    configure_node_logging()
    prior = json.loads(args[2]) if len(args) > 2 and args[2] else None
    return run(args[0], args[1], prior)


if __name__ == "__main__":
    sys.exit(main())
