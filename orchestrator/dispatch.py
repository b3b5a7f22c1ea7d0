"""Running units through submitit: the only module that imports submitit.

``local`` runs each unit as a subprocess (submitit's LocalExecutor), at most one per
visible GPU at a time (one on a machine without GPUs), each pinned to its own GPU;
``debug`` runs units in this process (submitit's DebugExecutor), for tests and debugging.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from typing import Any, Callable

from .errors import DispatchError
from .sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)

POLL_S = 0.5


def run_unit_job(sweep_dir: str, unit_id: str) -> dict[str, Any]:
    """What a submitit job runs (importable, picklable)."""
    from jobs.worker import run_unit

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return run_unit(sweep_dir, unit_id)


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
) -> list[dict[str, Any]]:
    """Run units to completion through submitit's local or debug executor.

    Returns one outcome per unit: ``{"unit", "ok", "summary" | "error", "log"}``. A unit
    whose worker fails (crash, kill) is reported, not raised: its finished records stay
    in its partial and ``resume`` redoes only the rest.
    """
    submitit = _submitit()
    spec = sd.spec
    outcomes: list[dict[str, Any]] = []
    if kind == "debug":
        executor = submitit.AutoExecutor(folder=str(sd.logs), cluster="debug")
        for uid in unit_ids:
            job = executor.submit(run_unit_job, str(sd.root), uid)
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
            job = executor.submit(run_unit_job, str(sd.root), uid)
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
