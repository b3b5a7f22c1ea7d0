"""Handing units to SLURM through submitit: job arrays that return at once, and the final
merge job that waits for them (``afterany``).

Each array's jobs are recorded in ``jobs.jsonl`` as soon as sbatch accepted it, so an error
in a later array loses no job id. A refused submission is one line (sbatch's own words and
the command) and leaves none of submitit's temp files behind.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit

from orchestrator.control.dispatch.tasks import MergeTask, UnitTask
from orchestrator.control.scheduler import array_of, one_line, require_submit_tools
from orchestrator.errors import DispatchError
from orchestrator.spec.model import ExecutorSettings
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)

# tilesweep's own executor settings; every other ExecutorSettings field is a submitit parameter
TILESWEEP_KEYS = frozenset({"kind", "local_workers", "max_requeues", "max_config_attempts", "max_array_size",
                            "merge_job", "merge_partition"})
SUBMITIT_SIGNAL_DELAY_S = 90  # submitit's default --signal=USR2@90
MERGE_TIMEOUT_MIN = 30
_TEMP_LITTER = re.compile(r"(\.submission_file_[0-9a-f]{32}\.sh|[0-9a-f]{32}\.pkl)")


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


def _slurm_executor(sd: SweepDir, settings: ExecutorSettings, params: dict[str, Any]) -> Any:
    require_submit_tools()
    try:
        ex = submitit.AutoExecutor(folder=str(sd.logs), cluster="slurm", slurm_max_num_timeout=settings.max_requeues)
        ex.update_parameters(**params)
    except RuntimeError as exc:  # submitit: 'Could not detect "srun"'
        raise DispatchError(f"submitit cannot use SLURM here: {one_line(exc)}") from None
    except (NameError, ValueError, TypeError) as exc:  # an unknown or invalid parameter
        raise DispatchError(f"submitit refused the executor settings {sorted(params)}: {one_line(exc)}") from None
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
        said = one_line(cause.stderr or str(exc) or stderr) or f"exit {cause.returncode}"
        return DispatchError(f"sbatch refused the job: {said} (command: {cmd})")
    if isinstance(exc, FileNotFoundError):
        return DispatchError(f"cannot run sbatch: {exc.strerror}: {exc.filename!r}; is SLURM installed here?")
    return DispatchError(f"submitting to SLURM failed: {type(exc).__name__}: {one_line(exc) or one_line(stderr)}")


@dataclass
class Submission:
    """What ``submit_units`` achieved: the job entries recorded, and the error that stopped it."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    error: DispatchError | None = None

    @property
    def arrays(self) -> list[str]:
        return list(dict.fromkeys(e["array_id"] for e in self.entries))


def _job_entries(chunk: list[str], jobs: list[Any], *, origin: str, t0: float,
                 attempts: dict[str, int]) -> list[dict[str, Any]]:
    """The ``jobs.jsonl`` lines of one accepted array: one per unit, with its task and logs."""
    when = now_iso()
    entries = []
    for uid, job in zip(chunk, jobs, strict=True):
        jid = str(job.job_id)
        entries.append({
            "unit": uid, "executor": "slurm", "job_id": jid, "array_id": array_of(jid),
            "task": int(jid.split("_")[1]) if "_" in jid else None,
            "attempt": attempts.get(uid, 0) + 1, "origin": origin,
            "submitted": when, "submitted_ts": round(t0, 3),
            "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr),
        })
    return entries


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
        entries = _job_entries(chunk, jobs, origin=origin, t0=t0, attempts=attempts or {})
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
