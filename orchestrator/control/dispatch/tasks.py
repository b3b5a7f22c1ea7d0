"""What submitit runs on the node: a task's units (``UnitTask`` on SLURM: its GPUs take its
units in turn, a worker process per unit, see ``node``) or the final merge (``MergeTask``); one
unit run here is ``local_worker``'s.

submitit pickles these by reference, so they must stay importable under these names. Each
entry point configures the node's logging once (``configure_node_logging``): the task's
stderr is its log, which ``tilesweep status`` points to when a unit fails.

A task whose units all ended leaves as soon as submitit has written its result
(``leave_without_teardown``): the atexit handlers run and its output is flushed, but the
interpreter's teardown with jax and the orchestrator loaded (every module's objects freed, a
tenth of a second or more) is skipped, while the task still holds its GPUs.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import submitit

from orchestrator.control.dispatch.nodelog import configure_node_logging
from orchestrator.errors import UnitsFailed
from orchestrator.store.sweepdir import SweepDir

if TYPE_CHECKING:
    from orchestrator.control.dispatch.node import TaskWorkers

log = logging.getLogger(__name__)

# What the final merge job calls with the sweep directory once it has merged (pickled by reference).
MergeHook = Callable[[str], dict[str, Any] | None]


Units = list[str]
Prior = dict[str, dict[str, Any]]

SUBMITIT_MAIN = "submitit.core._submit"  # the module a SLURM task's process runs (submitit's sbatch script)


def task_units(units: str | Units, prior: Any) -> tuple[Units, Prior]:
    """A task's units and their prior deaths (``unit -> item -> [starts, deaths, hangs]``, or a
    plain count of starts ``n``). A task of one unit may be pickled as that unit's id and its
    ``item -> ...`` alone: both forms are read."""
    if isinstance(units, str):
        return [units], {units: prior} if prior else {}
    return list(units), dict(prior or {})


class UnitTask(submitit.helpers.Checkpointable):
    """A SLURM task: its units, one worker process each, taken in turn by the task's GPUs
    (``node``). submitit pickles it by reference, so it must stay importable under this name.

    Signals (submitit installs its own handlers first; this keeps its USR2 handler, which
    checkpoints and requeues, for the moment every worker has stopped). SLURM signals every
    process of the task; the task forwards each signal to its workers as well:

    - USR2, SLURM's warning before the time limit (``--signal=USR2@<slurm_signal_delay_s>``)
      or a preemption: no further unit starts; each worker finishes the config being timed,
      abandons the ones compiled ahead (not their fault) and exits; then submitit's handler
      requeues the task, for its units stopped and those no GPU had taken yet,
      through ``checkpoint`` (at most ``executor.max_requeues`` times). A worker that has
      not stopped within ``grace_s`` is stuck in a config (a hang, an endless compile): it is
      first asked (USR1) to mark the configs in flight hung (``jobs.in_flight.mark_hung``),
      then killed without abandoning them, so its ``start`` lines count as an attempt that
      died on them (only against a config that was alone in flight; after
      ``executor.max_config_attempts`` such attempts the worker records it as an error, a
      timeout (``WorkerTimeout``) where each was found hung), and the task is requeued at once.
    - TERM (scancel, preemption, the time limit itself): no further unit starts; every worker
      abandons the configs in flight at once (SIGKILL follows within KillWait) and stops at
      the next config. Only
      USR2 leads to a requeue: a cancelled job stays cancelled.

    A worker that failed (its reason is the last line of its unit's log) makes the task fail
    once the others have ended; units done, stopped or held by another live worker do not.
    """

    _workers: TaskWorkers  # set when the task runs, before any handler is installed

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self._warned = False
        self._terminated = False
        self._finished = False
        self._requeue: Callable[[int, FrameType | None], object] | None = None

    def __call__(self, sweep_dir: str, units: str | Units, prior: Any = None) -> dict[str, Any]:
        from jobs.node_env import slurm_task
        from orchestrator.control.dispatch.node import TaskWorkers

        configure_node_logging()
        unit_ids, priors = task_units(units, prior)
        self._workers = TaskWorkers(sweep_dir, unit_ids, priors, slurm_task())
        self._install_handlers()
        try:
            if not self._terminated:
                self._workers.start()
            self._workers.wait()
        finally:
            self._finished = True
            if self._requeue is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
        outcomes = self._workers.finish()
        stopped = [o["unit"] for o in outcomes if o["state"] in ("stopped", "waiting")]
        if stopped and self._warned and self._requeue is not None:
            log.warning(
                "units %s stopped (or not started) on the warning signal; checkpointing and requeueing",
                ", ".join(stopped),
            )
            self._requeue(signal.SIGUSR2, None)  # submitit: checkpoint, scontrol requeue, exit
        failed: dict[str, list[str]] = {}  # reason -> its units (a full disk's, many)
        for o in outcomes:
            if o["state"] == "failed":
                failed.setdefault(str(o["reason"]), []).append(o["unit"])
        if failed:
            said = [f"unit{'s' if len(us) > 1 else ''} {', '.join(us)} failed: {why}" for why, us in failed.items()]
            raise UnitsFailed("; ".join(said))
        if getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) == SUBMITIT_MAIN:
            atexit.register(leave_without_teardown)  # once submitit has written the result below
        return {"units": outcomes}

    def checkpoint(self, sweep_dir: str, units: str | Units, prior: Any = None) -> submitit.helpers.DelayedSubmission:
        """The same units again: their finished configs are in their partials and are skipped."""
        return submitit.helpers.DelayedSubmission(UnitTask(self.grace_s), sweep_dir, units, prior)

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

    def _on_warning(self, signum: int, frame: FrameType | None) -> None:
        if self._finished or self._warned:
            return
        self._warned = True
        log.warning(
            "caught %s (time limit near, or preemption): the workers finish the configs being timed, then "
            "the task is requeued; at most %.0f s",
            signal.Signals(signum).name,
            self.grace_s,
        )
        self._workers.stop(signal.SIGUSR2)
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def _on_grace_expired(self, signum: int, frame: FrameType | None) -> None:
        if self._finished:
            return
        log.warning(
            "a worker did not stop within %.0f s (stuck in a config?): marking its configs in flight hung, "
            "killing the workers and requeueing now; those configs count as attempts that hung",
            self.grace_s,
        )
        self._workers.mark_hung()
        self._workers.kill()
        if self._requeue is not None:
            self._requeue(signal.SIGUSR2, frame)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self._terminated = True
        log.warning("caught %s: the workers abandon their configs in flight and stop", signal.Signals(signum).name)
        self._workers.stop(signal.SIGTERM)


def leave_without_teardown() -> None:
    """An atexit handler, registered last so it runs first: run the other atexit handlers,
    flush the output and exit 0 without the interpreter's teardown (the module docstring). An
    error on the way out (submitit could not write the result: the interpreter printed it) is
    left to the interpreter, which exits with its status."""
    atexit.unregister(leave_without_teardown)
    if getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None:
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class MergeTask(submitit.helpers.Checkpointable):
    """The final merge as a SLURM job; requeued if its time limit comes first (merging is
    idempotent, so a restart only redoes work).

    ``then`` (optional, a module-level function, pickled by reference) is called with the sweep
    directory after the merge: the hook of a strategy with rounds that advances the sweep to its
    next round from here, so nobody has to be waiting (``control.rounds.after_merge``). Where the
    hook ended the rounds with nothing more to measure (a search's end), no merge job follows, so
    this one merges again: the document then says the rounds ended."""

    def __init__(self, then: MergeHook | None = None) -> None:
        self.then = then

    def __call__(self, sweep_dir: str) -> dict[str, Any]:
        configure_node_logging()
        sd = SweepDir.open(sweep_dir)
        result = self._merge(sd)
        if self.then is not None:
            result["then"] = then = self.then(sweep_dir)
            if isinstance(then, dict) and then.get("merge_again"):  # the rounds ended, no job follows: merge the end
                result.update(self._merge(sd))
        return result

    def _merge(self, sd: SweepDir) -> dict[str, Any]:
        """Merge, write the page when the spec asks, and record what was done (``final-merge.json``)."""
        from orchestrator.control.sweeps import merge_sweep
        from orchestrator.errors import TilesweepError

        job = os.environ.get("SLURM_JOB_ID")
        try:
            summary = merge_sweep(sd, skip_empty=True)  # a sweep whose units all ended with no record: none
        except TilesweepError as exc:  # refused (records of another sweep, an unwritable output): say why
            log.error("final merge refused: %s", exc.message)
            _record_logged(sd, {"job_id": job, "ok": False, "error": exc.message})
            raise
        result = {
            "output": str(summary.output),
            "records": summary.records,
            "missing": summary.missing,
            "errors": summary.errors,
            "written": summary.written,
            "prev": None if summary.prev is None else str(summary.prev),
        }
        if sd.spec.report.html and summary.records:
            result.update(write_page_logged(summary.output))
        _record_logged(sd, {"job_id": job, "ok": True, **result})
        return result


def _record_logged(sd: SweepDir, result: dict[str, Any]) -> None:
    """``final-merge.json``, where its disk takes it: on a full disk (or a read-only mount) the
    job's log says which file, its filesystem and what to do, and the job ends as its merge did."""
    from orchestrator.store.files import WRITE_ERRNOS, cannot_write
    from orchestrator.store.final_merge import record_final_merge

    try:
        record_final_merge(sd, result)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        log.error("what the final merge did was not recorded: %s", cannot_write(exc))


def write_page_logged(output: Path) -> dict[str, str]:
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
