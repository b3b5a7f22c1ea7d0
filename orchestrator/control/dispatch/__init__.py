"""Running units through submitit: the only package that imports submitit.

- ``tasks``: what runs on the node (``UnitTask``, ``MergeTask``, ``run_unit_job``) and the
  node-side logging; submitit pickles these by reference, so they stay importable.
- ``slurm``: ``submit_units`` hands units to SLURM as job arrays (split at the cluster's
  array size), a unit per GPU of a task, and returns at once; ``submit_merge_job`` adds a
  job that merges the results once the arrays have ended (``--dependency=afterany``).
- ``node``: a task's workers, one process per unit (``unit_worker``), each on its own GPU
  and CPU share.
- ``sbatch``: sbatch bounded in time, accepted arrays always recorded, scripts rendered
  without submitting (``submit --dry-run``).
- ``local``: ``run_units_locally`` runs each unit as a subprocess (submitit's
  LocalExecutor), at most one per visible GPU at a time (one on a machine without GPUs),
  each pinned to its own GPU; kind ``debug`` runs them in this process (DebugExecutor).
"""

from orchestrator.control.dispatch.local import UnitOutcome, run_units_locally, visible_gpus
from orchestrator.control.dispatch.slurm import (
    Submission,
    executor_parameters,
    grace_s,
    render_scripts,
    submit_merge_job,
    submit_units,
    tasks_of,
)
from orchestrator.control.dispatch.tasks import MergeTask, UnitTask, run_unit_job

__all__ = [
    "MergeTask",
    "Submission",
    "UnitOutcome",
    "UnitTask",
    "executor_parameters",
    "grace_s",
    "render_scripts",
    "run_unit_job",
    "run_units_locally",
    "submit_merge_job",
    "submit_units",
    "tasks_of",
    "visible_gpus",
]
