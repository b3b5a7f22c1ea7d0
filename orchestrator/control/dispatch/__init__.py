"""Running units: on SLURM and in the background through submitit (this is the only package
that imports it), a local run's workers as its own child processes.

- ``tasks``: what runs on the node (``UnitTask``, ``MergeTask``) and the node-side logging;
  submitit pickles these by reference, so they stay importable.
- ``slurm``: ``submit_units`` hands units to SLURM as job arrays (split at the cluster's
  array size), a unit per GPU of a task, and returns at once; ``submit_merge_job`` adds a
  job that merges the results once the arrays have ended (``--dependency=afterany``).
- ``node``: a task's workers: its GPUs take its units in turn, one process per GPU that runs
  them one after another (``unit_worker``, started as a fork of the task by ``forked``), each
  on its GPU's CPU share.
- ``sbatch``: sbatch bounded in time, accepted arrays always recorded, scripts rendered
  without submitting (``submit --dry-run``).
- ``local``: ``run_units_locally`` runs each unit as a subprocess it starts itself
  (``local_procs``), at most one per visible GPU at a time (one on a machine without GPUs),
  each pinned to its own GPU; kind ``debug`` runs them in this process (DebugExecutor).
- ``local_worker``: one unit's worker run here (``run_unit_job``, and the process
  ``local_procs`` starts), free of submitit.
- ``local_controller``: the process that runs one unit left running by a command that returns
  (submitit's controller, saying why a worker a signal ended died).

The names below load their module when first used, so a process that needs one module of the
package (a local worker, a unit's controller, a SLURM task's worker) does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.control.dispatch.local import (
        UnitOutcome,
        cpu_workers,
        local_slots,
        run_units_locally,
        visible_gpus,
    )
    from orchestrator.control.dispatch.local_background import start_units_locally
    from orchestrator.control.dispatch.local_worker import run_unit_job
    from orchestrator.control.dispatch.slurm import (
        Submission,
        executor_parameters,
        grace_s,
        render_scripts,
        submit_merge_job,
        submit_units,
        tasks_of,
        unit_costs,
    )
    from orchestrator.control.dispatch.tasks import MergeTask, UnitTask

_HOMES = {
    "UnitOutcome": "local",
    "run_units_locally": "local",
    "start_units_locally": "local_background",
    "local_slots": "local",
    "cpu_workers": "local",
    "visible_gpus": "local",
    "Submission": "slurm",
    "executor_parameters": "slurm",
    "grace_s": "slurm",
    "render_scripts": "slurm",
    "submit_merge_job": "slurm",
    "submit_units": "slurm",
    "tasks_of": "slurm",
    "unit_costs": "slurm",
    "MergeTask": "tasks",
    "UnitTask": "tasks",
    "run_unit_job": "local_worker",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "MergeTask",
    "Submission",
    "UnitOutcome",
    "UnitTask",
    "cpu_workers",
    "executor_parameters",
    "grace_s",
    "render_scripts",
    "run_unit_job",
    "local_slots",
    "run_units_locally",
    "start_units_locally",
    "submit_merge_job",
    "submit_units",
    "tasks_of",
    "unit_costs",
    "visible_gpus",
]
