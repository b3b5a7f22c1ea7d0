"""Running units here: as subprocesses, at most one per visible GPU at a time (one on a
machine without GPUs; a replay, which needs no GPU, one per CPU), each pinned to its own GPU;
or, for tests and debugging, in this process (submitit's DebugExecutor).

A run that waits for its units starts each unit's worker itself (``local_procs``); units left
running when the command returns (``local_background.start_units_locally``) run under
submitit's local controller (``local_controller``), which outlives the command. A unit whose worker fails
(crash, kill) is an outcome, not an exception: its finished records stay in its partial and
``resume`` redoes only the rest.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernels.spelling import as_json
from orchestrator import PROG
from orchestrator.control.dispatch.local_procs import (
    LocalWorker,
    children_block_sigint,
    start_worker,
    stop_workers,
    wait_any,
)
from orchestrator.control.dispatch.nodelog import note_start, quiet_debug_jobs
from orchestrator.control.unit_state import existing
from orchestrator.control.why import INTERRUPTED, last_word, read_failure, signal_reason
from orchestrator.errors import DispatchError, SweepDirError
from orchestrator.spec.model import SweepSpec
from orchestrator.store.diskspace import FullDisk, mount_point
from orchestrator.store.pidspace import host_identity, process_start
from orchestrator.store.runstop import RunStop, StopNote
from orchestrator.store.sweep_paths import log_folder
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass
class UnitOutcome:
    """How one unit run here ended: its worker's summary, or the last line of the error that
    stopped it and the log that says more (``interrupted``: a stop signal ended it, which is
    no failure of the unit)."""

    unit: str
    ok: bool
    job_id: str
    summary: dict[str, Any] | None = None
    error: str | None = None
    log: str | None = None
    interrupted: bool = False


def visible_gpus() -> list[int]:
    """GPU indices this machine shows (CUDA_VISIBLE_DEVICES if set, else nvidia-smi)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return list(range(len([x for x in env.split(",") if x.strip()])))
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(range(sum(1 for line in out.splitlines() if line.startswith("GPU "))))


def run_units_locally(
    sd: SweepDir,
    unit_ids: list[str],
    *,
    kind: str = "local",
    workers: int | None = None,
    on_poll: Callable[[], None] | None = None,
    prior_starts: dict[str, dict[str, Any]] | None = None,
) -> list[UnitOutcome]:
    """Run units to completion through submitit's local or debug executor; one outcome per
    unit. ``prior_starts``: unit -> item -> deaths on that item in other units' partials
    (see ``jobs.worker.run_unit``). ``on_poll`` is called whenever a unit may have moved on.
    """
    prior = prior_starts or {}
    log_folder(sd.logs)  # a file in its place is said before any unit starts
    if kind == "debug":
        return _run_in_process(sd, unit_ids, prior, on_poll)
    if kind != "local":
        raise DispatchError(f"executor.kind {as_json(kind)} does not run locally; use `{PROG} submit` for slurm")
    return _run_subprocesses(sd, unit_ids, workers, prior, on_poll)


def _run_in_process(
    sd: SweepDir, unit_ids: list[str], prior: dict[str, dict[str, Any]], on_poll: Callable[[], None] | None
) -> list[UnitOutcome]:
    """One unit after another in this process (the debug executor). Once a unit failed on a
    full disk, no further unit starts: the run ends in one line (``_Disk``), as a local one does."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(sd.logs), cluster="debug")
    outcomes = []
    here = {"pid": os.getpid(), "start": process_start(os.getpid()), **host_identity()}  # status: whether it runs
    disk = _Disk(sd.root)
    # submitit logs each unit to files in the logs folder too: a full disk there costs those lines,
    # not a traceback of logging's own on the console (which has every line)
    raising, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        with quiet_debug_jobs():
            for k, uid in enumerate(unit_ids):
                job = executor.submit(_debug_unit_job, str(sd.root), uid, prior.get(uid))
                entry = {"unit": uid, "executor": "debug", "job_id": str(job.job_id), "submitted": now_iso(), **here}
                sd.record_jobs([{**entry, "stderr": str(job.paths.stderr)}])  # its worker's word on how it ended
                note_start(job.paths.stderr, uid, f"in the debug run's process {here['pid']}")
                outcomes.append(out := _outcome(uid, job))
                if on_poll:
                    on_poll()
                if not out.ok and not out.interrupted and disk.probe():
                    raise SweepDirError(disk.stopped("the run", len(unit_ids) - k - 1))
    finally:
        logging.raiseExceptions = raising
    return outcomes


@dataclass
class _Raised:
    """What a debug unit's worker raised, handed back as the job's result: submitit's debug job
    prints an exception and opens pdb's post-mortem on it (a ``(Pdb)`` prompt at a terminal that
    the run then waits on), where a failed unit is an outcome, said as a local run says it."""

    exc: Exception


def _debug_unit_job(sweep_dir: str, unit_id: str, prior: dict[str, Any] | None) -> Any:
    """``run_unit_job`` in the debug executor's process: its summary, or what it raised."""
    from orchestrator.control.dispatch.local_worker import run_unit_job

    try:
        return run_unit_job(sweep_dir, unit_id, prior)
    except Exception as exc:  # a stop (KeyboardInterrupt) goes on up to the command
        return _Raised(exc)


def _run_subprocesses(
    sd: SweepDir,
    unit_ids: list[str],
    workers: int | None,
    prior: dict[str, dict[str, Any]],
    on_poll: Callable[[], None] | None,
) -> list[UnitOutcome]:
    """Units as subprocesses in ``workers`` slots (default: one per visible GPU), a slot
    taking the next unit as soon as its unit ends. Once a worker failed on a full disk, no
    further unit starts: the run ends in one line once the running ones have (``_Disk``), and
    notes why in the room it took for that at its start (``store.runstop``), for ``status``. A
    worker stopped by the Ctrl-C this run ignores stops the run (``_ctrl_c_of_the_group``)."""
    gpus = visible_gpus()
    n = local_slots(sd.spec, workers, gpus)
    pending = list(unit_ids)
    running: dict[int, LocalWorker] = {}  # slot -> its unit's worker
    free_slots = list(range(n))
    outcomes: list[UnitOutcome] = []
    disk = _Disk(sd.root)
    note = StopNote(sd.root)
    note.reserve()
    try:
        while (pending and disk.full is None) or running:
            while pending and free_slots and disk.full is None:
                slot = free_slots.pop(0)
                # a Ctrl-C meanwhile is taken once the worker is in ``running``: the stop below
                # then stops it too, and none is left running unseen by this run
                with children_block_sigint():
                    running[slot] = _start_worker(sd, pending.pop(0), gpus, slot, prior)
            for slot, worker in list(running.items()):
                if worker.poll() is None:
                    worker.enforce_limit()
                    continue
                outcomes.append(out := _ended(sd, worker, disk))
                del running[slot]
                free_slots.append(slot)
                if out.interrupted and _ctrl_c_of_the_group(worker):
                    raise KeyboardInterrupt  # as the run's own Ctrl-C: the other workers stop below
            if on_poll:
                on_poll()
            wait_any(list(running.values()), POLL_S)
    except BaseException:  # Ctrl-C (or a bug) here: the workers stop too, cleanly
        stop_workers(list(running.values()))
        note.discard()
        raise
    if disk.full is not None:
        stop = disk.stop(len(pending))
        note.stopped(stop)
        raise SweepDirError(disk.stopped("the run", len(pending)))
    note.discard()
    return outcomes


def _ctrl_c_of_the_group(worker: LocalWorker) -> bool:
    """Whether a worker that ended interrupted was stopped by a SIGINT (it exits 130 on one)
    that this run ignores: a run a script's ``&`` started ignores SIGINT, its workers take it
    while their unit runs, so a Ctrl-C (a SIGINT to the process group) reaches its workers
    alone. It is the user's stop all the same: the run stops as on a Ctrl-C, its other workers
    with it, instead of going on to the next unit and ending with the interrupted unit's items
    missing (as the debug executor's run stops, its unit running in the run's own process)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    return ignored and worker.proc.returncode == 128 + signal.SIGINT


@dataclass
class _Disk(FullDisk):
    """The sweep directory's disk (``diskspace.FullDisk``), probed once a worker failed: a
    full one fails every unit started on it, and may have left the failed worker no room for
    its own reason."""

    failed: dict[str, str] = field(default_factory=dict)  # unit -> its worker that failed on it

    def reason(self, worker: LocalWorker, error: str | None) -> str | None:
        """A failed worker's reason on the full disk: its own where its log holds one, else
        what the run knows (a bare exit code says nothing of the disk)."""
        try:
            said = os.path.getsize(worker.log) > worker.header
        except OSError:
            said = False
        if said or self.full is None:
            return error
        return self.no_room(worker.proc.returncode)

    def stop(self, not_started: int) -> RunStop:
        """The stop, as the run notes it for ``status``."""
        why = str(self.full.strerror) if self.full is not None else "full"
        return RunStop(self.root, why, str(mount_point(self.root)), dict(self.failed), not_started, time.time())


def _start_worker(sd: SweepDir, uid: str, gpus: list[int], slot: int, prior: dict[str, dict[str, Any]]) -> LocalWorker:
    """Start one unit's worker on its slot's GPU (none without GPUs); record the job."""
    worker = start_worker(sd, uid, gpus[slot % len(gpus)] if gpus else None, prior.get(uid))
    job = local_job(uid, worker.job_id, worker.log)
    try:
        sd.record_jobs([job])
    except BaseException:  # a full disk: a worker no history names would run on, out of cancel's reach
        stop_workers([worker])
        raise
    log.info("unit %s started as local process %s", uid, worker.job_id)
    return worker


def local_job(uid: str, pid: str, log_path: Any) -> dict[str, Any]:
    """The job entry of a unit started here as process ``pid`` (its worker, or the controller that
    runs it), naming that process as ``pidspace`` does (its start time, this host, boot and pid
    namespace): once it has ended its pid may be another process's, which status must not take
    for the unit still running."""
    start = process_start(int(pid))
    return {
        "unit": uid,
        "executor": "local",
        "job_id": pid,
        "submitted": now_iso(),
        "log": str(log_path),
        "start": start,
        **host_identity(),
    }


def _ended(sd: SweepDir, worker: LocalWorker, disk: _Disk) -> UnitOutcome:
    end = worker.ended()
    out = UnitOutcome(worker.unit, ok=end.ok, job_id=worker.job_id, summary=end.summary, error=end.error)
    if end.ok:
        return out
    if _all_recorded(sd, worker.unit):  # ended after its last record, before its marker: done, as status says
        log.warning("unit %s: every item has a record, but its worker then ended: %s", worker.unit, end.error)
        return UnitOutcome(worker.unit, ok=True, job_id=worker.job_id)
    out.log, out.interrupted = existing(str(worker.log)), end.interrupted
    if end.interrupted:
        # a unit stopped alone is named; one the user's Ctrl-C stopped is not: the run stops on
        # it with the other units, in one line (``status`` names each unit it interrupted)
        if not _ctrl_c_of_the_group(worker):
            log.warning("unit %s interrupted (process %s): %s", worker.unit, worker.job_id, end.error)
        return out
    if disk.probe():
        out.error = disk.reason(worker, end.error)
        disk.failed[worker.unit] = worker.job_id
    log.warning("unit %s failed (process %s): %s; log: %s", worker.unit, worker.job_id, out.error, worker.log)
    return out


def _all_recorded(sd: SweepDir, unit: str) -> bool:
    """Whether the unit's partial holds a record of each of its items (counted as status counts)."""
    from orchestrator.store.tally import count_partial

    n_items = next((u["n_items"] for u in sd.unit_index() if u["id"] == unit), None)
    if n_items is None:
        return False
    counts = count_partial(str(sd.partial_path(unit)), sd.root, unit)
    return counts.foreign is None and counts.records >= n_items


def local_slots(spec: SweepSpec, workers: int | None = None, gpus: list[int] | None = None) -> int:
    """How many units run here at a time: ``workers``, else ``executor.local_workers``, else one
    per visible GPU (one without GPUs; a replay, which needs no GPU, one per CPU)."""
    gpus = visible_gpus() if gpus is None else gpus
    n = workers or spec.executor.local_workers or max(1, len(gpus))
    if spec.kernel.impl == "replay" and not (workers or spec.executor.local_workers):
        n = max(n, os.cpu_count() or 1)
    return n


def cpu_workers(spec: SweepSpec, workers: int | None = None) -> int:
    """How many workers of a local run time kernels side by side on this machine's CPUs, where
    more than one does (else 0): interpret mode on the CPU, no visible GPU to pin each to (or a
    jax without one, in interpret mode), which they share, disturbing each other's timings."""
    gpus = visible_gpus()
    n = local_slots(spec, workers, gpus)
    if n < 2 or spec.kernel.impl == "replay" or (gpus and spec.kernel.interpret is not True):
        return 0  # a replay times nothing; ``auto`` with a GPU times on it (``false`` without one is refused)
    if gpus:
        import jax

        return n if jax.default_backend() != "gpu" else 0
    return n


def _outcome(uid: str, job: Any) -> UnitOutcome:
    """How a debug job's unit ended (``_debug_unit_job``): its summary, or why it failed."""
    summary = job.result()
    if not isinstance(summary, _Raised):
        return UnitOutcome(unit=uid, ok=True, job_id=str(job.job_id), summary=summary)
    log_path = str(getattr(getattr(job, "paths", None), "stderr", "") or "")
    said = last_word(log_path, uid)
    if said is not None and said[0] == INTERRUPTED:
        log.warning("unit %s interrupted (job %s): %s", uid, job.job_id, said[1])
        return UnitOutcome(
            uid, ok=False, job_id=str(job.job_id), error=said[1], log=existing(log_path), interrupted=True
        )
    why = _why(uid, job, summary.exc, log_path)
    log.warning("unit %s failed (job %s): %s; log: %s", uid, job.job_id, why, log_path)
    return UnitOutcome(unit=uid, ok=False, job_id=str(job.job_id), error=why, log=existing(log_path))


def _why(uid: str, job: Any, exc: BaseException, log_path: str) -> str:
    """The worker's own one-line reason from its log, or the one its controller wrote for a
    worker a signal ended (``local_controller``); else how the controller's own process died;
    else the last line of the error."""
    said = read_failure(log_path, uid)
    if said:
        return said
    code = getattr(getattr(job, "_process", None), "returncode", None)
    if isinstance(code, int) and code < 0:
        return signal_reason(-code)
    return _last_line(exc)


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__
