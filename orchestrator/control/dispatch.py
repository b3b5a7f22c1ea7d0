"""Running units through submitit: the only module that imports submitit.

``slurm``: ``submit_units`` hands units to SLURM as job arrays (split at the cluster's array
size) and returns at once; each task runs a ``UnitTask``, which is checkpointable: on SLURM's
time-limit or preemption warning it stops between configs and is requeued, and the requeued
task skips what its partial already holds. ``submit_merge_job`` adds a job that merges the
results once the arrays have ended (``--dependency=afterany``).
``local`` runs each unit as a subprocess (submitit's LocalExecutor), at most one per
visible GPU at a time (one on a machine without GPUs), each pinned to its own GPU;
``debug`` runs units in this process (submitit's DebugExecutor), for tests and debugging.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from submitit.helpers import Checkpointable, DelayedSubmission

from orchestrator.errors import DispatchError
from orchestrator.spec.model import ExecutorSettings
from orchestrator.control.scheduler import array_of, missing_tools
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)

POLL_S = 0.5
# tilesweep's own executor settings; every other ExecutorSettings field is a submitit parameter
TILESWEEP_KEYS = frozenset({"kind", "local_workers", "max_requeues", "max_config_attempts", "max_array_size",
                            "merge_job", "merge_partition"})
SUBMITIT_SIGNAL_DELAY_S = 90  # submitit's default --signal=USR2@90
MERGE_TIMEOUT_MIN = 30
_TEMP_LITTER = re.compile(r"(\.submission_file_[0-9a-f]{32}\.sh|[0-9a-f]{32}\.pkl)")


def run_unit_job(sweep_dir: str, unit_id: str, prior_starts: dict[str, int] | None = None) -> dict[str, Any]:
    """What a local or debug submitit job runs (importable, picklable)."""
    from jobs.worker import run_unit

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return run_unit(sweep_dir, unit_id, prior_starts=prior_starts)


# ---------------------------------------------------------------------------- on the node


class UnitTask(Checkpointable):
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

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
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

    def checkpoint(self, sweep_dir: str, unit_id: str, prior_starts: dict[str, int] | None = None) -> DelayedSubmission:
        """The same unit again: its finished configs are in its partial and are skipped."""
        return DelayedSubmission(UnitTask(self.grace_s), sweep_dir, unit_id, prior_starts)

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


class MergeTask(Checkpointable):
    """The final merge as a SLURM job; requeued if its time limit comes first (merging is
    idempotent, so a restart only redoes work)."""

    def __call__(self, sweep_dir: str) -> dict[str, Any]:
        from orchestrator.store.merge import merge

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        summary = merge(SweepDir.open(sweep_dir))
        return {"output": str(summary.output), "records": summary.records, "missing": summary.missing,
                "errors": summary.errors}


# ---------------------------------------------------------------------------- submitting


def executor_parameters(settings: ExecutorSettings) -> dict[str, Any]:
    """The spec's executor section as submitit parameters (unset ones left to submitit)."""
    params = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if name in TILESWEEP_KEYS or value is None or value == [] or value == {}:
            continue
        params[name] = value
    return params


def grace_s(settings: ExecutorSettings) -> float:
    """How long a warned worker may take to reach a stop: half the warning (SLURM sends it
    ``slurm_signal_delay_s`` to 60 s more before the limit), 5 to 30 s."""
    delay = settings.slurm_signal_delay_s or SUBMITIT_SIGNAL_DELAY_S
    return float(max(5, min(30, delay // 2)))


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).strip().splitlines() if line.strip())


def _slurm_executor(sd: SweepDir, settings: ExecutorSettings, params: dict[str, Any]) -> Any:
    missing = missing_tools("sbatch", "srun")
    if missing:
        raise DispatchError(
            f"`{missing[0]}` is not on PATH, so nothing can be submitted to SLURM; run on a login node of the "
            f"cluster (or load its module), or use executor kind local"
        )
    import submitit

    try:
        ex = submitit.AutoExecutor(folder=str(sd.logs), cluster="slurm", slurm_max_num_timeout=settings.max_requeues)
        ex.update_parameters(**params)
    except RuntimeError as exc:  # submitit: 'Could not detect "srun"'
        raise DispatchError(f"submitit cannot use SLURM here: {_one_line(exc)}") from None
    except (NameError, ValueError, TypeError) as exc:  # an unknown or invalid parameter
        raise DispatchError(f"submitit refused the executor settings {sorted(params)}: {_one_line(exc)}") from None
    return ex


def _litter(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir() if _TEMP_LITTER.fullmatch(p.name)}
    except FileNotFoundError:
        return set()


@contextlib.contextmanager
def _sbatch_call(folder: Path) -> Iterator[None]:
    """Turn a failed submission into a one-line DispatchError that shows sbatch's own message
    and command, swallow submitit's copy of sbatch's stderr, and remove the temp files a
    failed submission leaves in the folder (its sbatch script and pickles)."""
    before = _litter(folder)
    swallowed = io.StringIO()
    try:
        with contextlib.redirect_stderr(swallowed):
            yield
    except Exception as exc:
        for name in _litter(folder) - before:
            with contextlib.suppress(OSError):
                (folder / name).unlink()
        raise _submission_error(exc, swallowed.getvalue()) from None


def _submission_error(exc: Exception, stderr: str) -> DispatchError:
    cause = exc.__cause__
    if isinstance(cause, subprocess.CalledProcessError):  # submitit's FailedJobError from sbatch
        cmd = shlex.join(str(c) for c in cause.cmd) if isinstance(cause.cmd, (list, tuple)) else str(cause.cmd)
        said = _one_line(cause.stderr or str(exc) or stderr) or f"exit {cause.returncode}"
        return DispatchError(f"sbatch refused the job: {said} (command: {cmd})")
    if isinstance(exc, FileNotFoundError):
        return DispatchError(f"cannot run sbatch: {exc.strerror}: {exc.filename!r}; is SLURM installed here?")
    return DispatchError(f"submitting to SLURM failed: {type(exc).__name__}: {_one_line(exc) or _one_line(stderr)}")


@dataclass
class Submission:
    """What ``submit_units`` achieved: the job entries recorded, and the error that stopped it."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    error: DispatchError | None = None

    @property
    def arrays(self) -> list[str]:
        return list(dict.fromkeys(e["array_id"] for e in self.entries))


def submit_units(sd: SweepDir, unit_ids: list[str], settings: ExecutorSettings, *, per_array: int, origin: str,
                 prior_starts: dict[str, dict[str, int]] | None = None,
                 attempts: dict[str, int] | None = None) -> Submission:
    """Submit units as SLURM job arrays of at most ``per_array`` tasks; return at once.

    Each array's jobs are recorded in ``jobs.jsonl`` as soon as sbatch accepted it, so an
    error in a later array (returned, not raised) loses no job id. Nothing waits for jobs."""
    if not unit_ids:
        return Submission()
    params = executor_parameters(settings)
    if settings.slurm_job_name is None:
        params["name"] = f"tilesweep-{sd.root.name}"[:64]
    ex = _slurm_executor(sd, settings, params)
    task = UnitTask(grace_s(settings))
    root = str(sd.root.resolve())  # the task runs in sbatch's working directory, wherever that is
    prior = prior_starts or {}
    done = Submission()
    for start in range(0, len(unit_ids), max(1, per_array)):
        chunk = unit_ids[start:start + per_array]
        t0 = time.time()
        try:
            with _sbatch_call(sd.logs):
                jobs = ex.map_array(task, [root] * len(chunk), chunk, [prior.get(u) for u in chunk])
        except DispatchError as exc:
            done.error = exc
            return done
        when = now_iso()
        entries = []
        for uid, job in zip(chunk, jobs):
            jid = str(job.job_id)
            entries.append({
                "unit": uid, "executor": "slurm", "job_id": jid, "array_id": array_of(jid),
                "task": int(jid.split("_")[1]) if "_" in jid else None,
                "attempt": (attempts or {}).get(uid, 0) + 1, "origin": origin,
                "submitted": when, "submitted_ts": round(t0, 3),
                "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr),
            })
        sd.record_jobs(entries)
        done.entries.extend(entries)
        log.info("submitted %d units as %s", len(chunk), array_of(entries[0]["job_id"]))
    return done


def submit_merge_job(sd: SweepDir, settings: ExecutorSettings, after: list[str]) -> dict[str, Any]:
    """A job that merges the sweep's results once every given array has ended, whatever
    its tasks' fate (``afterany``). Runs on ``merge_partition`` without a GPU."""
    params = {k: v for k, v in executor_parameters(settings).items()
              if k in ("slurm_account", "slurm_qos", "slurm_setup", "slurm_partition")}
    if settings.merge_partition:
        params["slurm_partition"] = settings.merge_partition
        params["timeout_min"] = MERGE_TIMEOUT_MIN
    else:  # the units' partition: their time limit is known to fit it
        params["timeout_min"] = min(settings.timeout_min, MERGE_TIMEOUT_MIN)
    params.update(cpus_per_task=1, name=f"tilesweep-merge-{sd.root.name}"[:64],
                  slurm_dependency="afterany:" + ":".join(after))
    ex = _slurm_executor(sd, settings, params)
    t0 = time.time()
    with _sbatch_call(sd.logs):
        job = ex.submit(MergeTask(), str(sd.root.resolve()))
    entry = {"event": "merge_job", "job_id": str(job.job_id), "after": after, "submitted": now_iso(),
             "submitted_ts": round(t0, 3), "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr)}
    sd.record_jobs([entry])
    return entry


# ---------------------------------------------------------------------------- local


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


def _submitit() -> Any:
    import submitit

    return submitit


def run_units_locally(
    sd: SweepDir,
    unit_ids: list[str],
    *,
    kind: str = "local",
    workers: int | None = None,
    on_poll: Callable[[], None] | None = None,
    prior_starts: dict[str, dict[str, int]] | None = None,
) -> list[dict[str, Any]]:
    """Run units to completion through submitit's local or debug executor.

    Returns one outcome per unit: ``{"unit", "ok", "summary" | "error", "log"}``. A unit
    whose worker fails (crash, kill) is reported, not raised: its finished records stay
    in its partial and ``resume`` redoes only the rest. ``prior_starts``: unit -> item ->
    deaths on that item in other units' partials (see ``jobs.worker.run_unit``).
    """
    prior = prior_starts or {}
    submitit = _submitit()
    spec = sd.spec
    outcomes: list[dict[str, Any]] = []
    if kind == "debug":
        executor = submitit.AutoExecutor(folder=str(sd.logs), cluster="debug")
        for uid in unit_ids:
            job = executor.submit(run_unit_job, str(sd.root), uid, prior.get(uid))
            sd.record_jobs([{"unit": uid, "executor": "debug", "job_id": str(job.job_id), "submitted": now_iso()}])
            outcomes.append(_outcome(uid, job))
            if on_poll:
                on_poll()
        return outcomes
    if kind != "local":
        raise DispatchError(f"executor kind {kind!r} does not run locally; use `tilesweep submit` for slurm")
    gpus = visible_gpus()
    n = workers or spec.executor.local_workers or max(1, len(gpus))
    executor = submitit.AutoExecutor(folder=str(sd.logs), cluster="local")
    executor.update_parameters(timeout_min=spec.executor.timeout_min)
    pending = list(unit_ids)
    running: dict[int, tuple[str, Any]] = {}  # slot -> (unit, job)
    free_slots = list(range(n))
    while pending or running:
        while pending and free_slots:
            slot = free_slots.pop(0)
            uid = pending.pop(0)
            if gpus:
                executor.update_parameters(gpus_per_node=1, visible_gpus=[gpus[slot % len(gpus)]])
            else:
                executor.update_parameters(gpus_per_node=0)
            job = executor.submit(run_unit_job, str(sd.root), uid, prior.get(uid))
            sd.record_jobs([{"unit": uid, "executor": "local", "job_id": str(job.job_id), "submitted": now_iso(),
                             "log": str(job.paths.stderr)}])
            log.info("unit %s started as local job %s", uid, job.job_id)
            running[slot] = (uid, job)
        for slot, (uid, job) in list(running.items()):
            if job.done():
                outcomes.append(_outcome(uid, job))
                del running[slot]
                free_slots.append(slot)
        if on_poll:
            on_poll()
        if running:
            time.sleep(POLL_S)
    return outcomes


def _outcome(uid: str, job: Any) -> dict[str, Any]:
    try:
        summary = job.result()
    except Exception as exc:  # the worker process failed; its log says why
        log_path = str(getattr(getattr(job, "paths", None), "stderr", "") or "")
        first = str(exc).strip().splitlines()
        log.warning("unit %s failed (job %s): %s; log: %s", uid, job.job_id, first[-1] if first else exc, log_path)
        return {"unit": uid, "ok": False, "error": _last_line(exc), "log": log_path, "job_id": str(job.job_id)}
    return {"unit": uid, "ok": True, "summary": summary, "job_id": str(job.job_id)}


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__
