"""Pre-flight lowering as a CPU job array (``executor.lower_partition``): what each task runs
(``LowerTask``) and how the array is submitted (``submit_lowering``).

A task lowers its share of the sweep's configs on its own CPUs (``jobs.lowering``, a process
per CPU SLURM gave it) and appends their verdicts to a file of its own
(``store.lowering.task_file``), ending it with a line that says it ended. No GPU is asked for:
lowering is for a target GPU, on CPUs. submitit pickles the task by reference, so it must stay
importable under this name.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator import counted
from orchestrator.control.dispatch.nodelog import configure_node_logging
from orchestrator.control.dispatch.sbatch import held_signals, sbatch_call
from orchestrator.control.dispatch.slurm import _slurm_executor, executor_parameters
from orchestrator.cpus import usable_cpus
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)

# The submitit parameters a lowering task keeps of the units' (no GPUs, no constraint on GPU model).
KEPT = ("slurm_account", "slurm_qos", "slurm_setup", "slurm_exclude", "cpus_per_task", "mem_gb", "timeout_min")


class LowerTask:
    """One task of a lowering array: the configs ``ids`` of the sweep, their verdicts in
    ``task_file(index)``."""

    def __call__(self, sweep_dir: str, ids: list[str], index: int) -> int:
        from jobs.lowering import lower_items
        from jobs.node_env import device_block
        from orchestrator.spec.compat import env_fingerprint
        from orchestrator.store.lowering import VerdictWriter, lowering_header, task_file

        configure_node_logging()
        sd = SweepDir.open(sweep_dir)
        spec = sd.spec
        wanted = set(ids)
        items = [it for it in sd.items() if it.id in wanted]
        header = lowering_header(spec.fingerprint(), spec.kernel.target.name, env_fingerprint(device_block()))
        workers = len(usable_cpus())
        with VerdictWriter(sd.root, header, name=task_file(index)) as writer:
            t0 = time.perf_counter()
            done = lower_items(spec, items, on_verdict=writer.write, workers=workers)
            writer.end(done)
        configs, cpus = counted(len(ids), "config"), counted(workers, "CPU")
        log.info("lowered %d of %s on %s in %.1f s", done, configs, cpus, time.perf_counter() - t0)
        return done


def lowering_parameters(sd: SweepDir, settings: ExecutorSettings) -> dict[str, Any]:
    """The submitit parameters of the lowering array: the units' account, QoS, set-up, CPUs,
    memory and time limit on ``lower_partition``, without GPUs."""
    params = {k: v for k, v in executor_parameters(settings).items() if k in KEPT}
    params.update(slurm_partition=settings.lower_partition, name=f"tilesweep-lower-{sd.root.name}"[:64])
    return params


def submit_lowering(sd: SweepDir, settings: ExecutorSettings, groups: list[list[str]]) -> list[str]:
    """Submit one array task per group of config ids; return the tasks' job ids at once."""
    ex = _slurm_executor(sd, settings, lowering_parameters(sd, settings))
    root = str(sd.root.resolve())
    with held_signals():
        with sbatch_call(sd.logs, settings.sbatch_timeout_s):
            jobs = ex.map_array(LowerTask(), [root] * len(groups), groups, list(range(len(groups))))
    ids = [str(job.job_id) for job in jobs]
    configs = counted(sum(map(len, groups)), "config")
    log.info("submitted pre-flight lowering of %s as array %s", configs, ids[0].split("_")[0])
    return ids
