"""Running units through submitit: the only package that imports submitit.

- ``tasks``: what runs on the node (``UnitTask``, ``MergeTask``, ``run_unit_job``) and the
  node-side logging; submitit pickles these by reference, so they stay importable.
- ``slurm``: ``submit_units`` hands units to SLURM as job arrays (split at the cluster's
  array size) and returns at once; ``submit_merge_job`` adds a job that merges the results
  once the arrays have ended (``--dependency=afterany``).
- ``local``: ``run_units_locally`` runs each unit as a subprocess (submitit's
  LocalExecutor), at most one per visible GPU at a time (one on a machine without GPUs),
  each pinned to its own GPU; kind ``debug`` runs them in this process (DebugExecutor).
"""

from orchestrator.control.dispatch.local import UnitOutcome, run_units_locally, visible_gpus
from orchestrator.control.dispatch.slurm import Submission, executor_parameters, grace_s, submit_merge_job, submit_units
from orchestrator.control.dispatch.tasks import MergeTask, UnitTask, run_unit_job

__all__ = ["MergeTask", "Submission", "UnitOutcome", "UnitTask", "executor_parameters", "grace_s", "run_unit_job",
           "run_units_locally", "submit_merge_job", "submit_units", "visible_gpus"]
