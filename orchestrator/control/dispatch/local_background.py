"""Units started here and left running when the command returns (``resume --no-wait``): each
under submitit's local controller (``local_controller``), which outlives the command, on its
slot's GPU, its job recorded before a Ctrl-C can stop the command; ``status`` and ``wait``
follow them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from orchestrator.control.dispatch.local import local_job, visible_gpus
from orchestrator.control.dispatch.local_procs import children_block_sigint
from orchestrator.store.sweep_paths import log_folder
from orchestrator.store.sweepdir import SweepDir

if TYPE_CHECKING:
    from orchestrator.control.dispatch.local_controller import UnitExecutor

log = logging.getLogger(__name__)


def start_units_locally(
    sd: SweepDir, unit_ids: list[str], *, prior_starts: dict[str, dict[str, Any]] | None = None
) -> list[str]:
    """Start each unit's worker here and leave it running (its controller outlives this
    process, as a job's would); the job ids. ``tilesweep status`` and ``wait`` follow them."""
    gpus = visible_gpus()
    executor = _executor(sd)
    prior = prior_starts or {}
    return [str(_start_subprocess(sd, executor, uid, gpus, k, prior.get(uid)).job_id) for k, uid in enumerate(unit_ids)]


def _executor(sd: SweepDir) -> UnitExecutor:
    from orchestrator.control.dispatch.local_controller import UnitExecutor

    executor = UnitExecutor(folder=str(log_folder(sd.logs)))
    executor.update_parameters(timeout_min=sd.spec.executor.timeout_min)
    return executor


def _start_subprocess(
    sd: SweepDir, executor: UnitExecutor, uid: str, gpus: list[int], slot: int, prior: dict[str, int] | None
) -> Any:
    """Start one unit's worker process on its slot's GPU (none without GPUs); record the job."""
    if gpus:
        executor.update_parameters(gpus_per_node=1, visible_gpus=[gpus[slot % len(gpus)]])
    else:
        executor.update_parameters(gpus_per_node=0)
    from orchestrator.control.dispatch.local_worker import run_unit_job

    executor.unit = uid
    # a Ctrl-C meanwhile is taken once the job is in jobs.jsonl: a controller started and not
    # recorded would run its unit unseen by status, wait and resume
    with children_block_sigint():
        job = executor.submit(run_unit_job, str(sd.root), uid, prior, True)
        sd.record_jobs([local_job(uid, str(job.job_id), job.paths.stderr)])
    log.info("unit %s started as local job %s", uid, job.job_id)
    return job
