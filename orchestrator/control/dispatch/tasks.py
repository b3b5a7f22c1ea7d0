"""What submitit runs on the node: one unit (``UnitTask`` on SLURM, ``run_unit_job`` for the
local and debug executors) or the final merge (``MergeTask``).

submitit pickles these by reference, so they must stay importable under these names. Each
entry point configures the node's logging once (``configure_node_logging``): the task's
stderr is its log, which ``tilesweep status`` points to when a unit fails.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import submitit

from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)

NODE_LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def configure_node_logging() -> None:
    """INFO and up to the task's stderr, timestamped (a no-op where logging is set up already,
    as in the debug executor's process)."""
    logging.basicConfig(level=logging.INFO, format=NODE_LOG_FORMAT)


def run_unit_job(sweep_dir: str, unit_id: str, prior_starts: dict[str, int] | None = None) -> dict[str, Any]:
    """What a local or debug submitit job runs (importable, picklable)."""
    from jobs.worker import run_unit

    configure_node_logging()
    return run_unit(sweep_dir, unit_id, prior_starts=prior_starts)


class UnitTask(submitit.helpers.Checkpointable):
    """One unit as a SLURM task. submitit pickles it by reference, so it must stay importable.

    Signals (submitit installs its own handlers first; this keeps its USR2 handler, which
    checkpoints and requeues, for the moment the worker has stopped):

    - USR2, SLURM's warning before the time limit (``--signal=USR2@<slurm_signal_delay_s>``)
      or a preemption: the worker finishes the config being timed, abandons the ones compiled
      ahead (``abandon_in_flight``: not their fault), returns, and submitit's handler
      requeues the task through ``checkpoint`` (at most ``executor.max_requeues`` times).
      If the worker does not reach a stop within ``grace_s`` it is stuck in a config (a hang,
      an endless compile): the task is requeued at once *without* abandoning that config, so
      its ``start`` line counts as an attempt that died on it, and after
      ``executor.max_config_attempts`` such attempts the worker records it as an error.
    - TERM (scancel, preemption, the time limit itself): the configs in flight are abandoned
      at once (SIGKILL follows within KillWait) and the worker stops at the next config.
      Only USR2 leads to a requeue: a cancelled job stays cancelled.
    """

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self._warned = False
        self._stop = False
        self._finished = False
        self._requeue: Any = None

    def __call__(self, sweep_dir: str, unit_id: str, prior_starts: dict[str, int] | None = None) -> dict[str, Any]:
        from jobs import worker

        configure_node_logging()
        self._install_handlers()
        try:
            summary = worker.run_unit(sweep_dir, unit_id, stop_check=self._should_stop, prior_starts=prior_starts)
        finally:
            self._finished = True
            if self._requeue is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if summary["stopped"] and self._warned and self._requeue is not None:
            log.warning("unit %s stopped after %d records on the warning signal; checkpointing and requeueing",
                        unit_id, summary["done"])
            self._requeue(signal.SIGUSR2, None)  # submitit: checkpoint, scontrol requeue, exit
        return summary

    def checkpoint(self, sweep_dir: str, unit_id: str,
                   prior_starts: dict[str, int] | None = None) -> submitit.helpers.DelayedSubmission:
        """The same unit again: its finished configs are in its partial and are skipped."""
        return submitit.helpers.DelayedSubmission(UnitTask(self.grace_s), sweep_dir, unit_id, prior_starts)

    # -- signals
    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGUSR2)
        if not callable(current):  # not under submitit's SLURM environment
            return
        self._requeue = current
        signal.signal(signal.SIGUSR2, self._on_warning)
        signal.signal(signal.SIGALRM, self._on_grace_expired)
        signal.signal(signal.SIGTERM, self._on_term)

    def _should_stop(self) -> bool:
        return self._stop

    def _on_warning(self, signum: int, frame: Any) -> None:
        if self._finished or self._warned:
            return
        self._warned = self._stop = True
        log.warning("caught %s (time limit near, or preemption): finishing the config being timed, then "
                    "requeueing; at most %.0f s", signal.Signals(signum).name, self.grace_s)
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def _on_grace_expired(self, signum: int, frame: Any) -> None:
        if self._finished:
            return
        log.warning("the worker did not stop within %.0f s (stuck in a config?): requeueing now; the configs "
                    "in flight count as attempts that died on them", self.grace_s)
        self._requeue(signal.SIGUSR2, frame)

    def _on_term(self, signum: int, frame: Any) -> None:
        from jobs.worker import abandon_in_flight

        self._stop = True
        try:
            given_up = abandon_in_flight()
        except Exception as exc:  # a write interrupted mid-way: the kill follows anyway
            given_up = f"none ({type(exc).__name__}: {exc})"
        log.warning("caught %s: stopping; abandoned configs in flight: %s", signal.Signals(signum).name, given_up)


class MergeTask(submitit.helpers.Checkpointable):
    """The final merge as a SLURM job; requeued if its time limit comes first (merging is
    idempotent, so a restart only redoes work)."""

    def __call__(self, sweep_dir: str) -> dict[str, Any]:
        from orchestrator.store.merge import merge

        configure_node_logging()
        sd = SweepDir.open(sweep_dir)
        summary = merge(sd)
        out = {"output": str(summary.output), "records": summary.records, "missing": summary.missing,
               "errors": summary.errors}
        if sd.spec.report.html and summary.records:
            out.update(write_page_logged(summary.output))
        return out


def write_page_logged(output: Any) -> dict[str, str]:
    """The report page of ``report.html: true``, on the node: a page that cannot be written is
    logged, not raised, because the merge it follows has succeeded and the job must say so."""
    from orchestrator.analysis.html import write_report
    from orchestrator.errors import TilesweepError

    try:
        page = write_report(output)
    except TilesweepError as exc:
        log.warning("the report page was not written: %s", exc.message)
        return {"html_error": exc.message}
    log.info("wrote the report page %s", page)
    return {"html": str(page)}
