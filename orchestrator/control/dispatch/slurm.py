"""Handing units to SLURM through submitit: job arrays that return at once, and the final
merge job that waits for them (``afterany``).

A task given G GPUs holds several units per GPU (``tasks_of``: consecutive units share a
task, the longest first) and runs G at once, each GPU taking the task's next unit when its own
ends (``node``).
Each array's jobs are recorded in ``jobs.jsonl`` as soon as sbatch accepted it, so an error
in a later array loses no job id. A refused submission is one line (sbatch's own words and
the command) and leaves none of submitit's temp files behind; an sbatch that does not answer
is given up on (``sbatch``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import submitit

from orchestrator import counted
from orchestrator.control.dispatch.sbatch import held_signals, render_script, sbatch_call
from orchestrator.control.dispatch.tasks import MergeHook, MergeTask, UnitTask
from orchestrator.control.scheduler import array_of, one_line, require_submit_tools
from orchestrator.errors import DispatchError
from orchestrator.planning.costs import unit_cost
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.spec.model import SweepSpec
from orchestrator.store.round2 import unit_round
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)

# tilesweep's own executor settings; every other ExecutorSettings field is a submitit parameter
TILESWEEP_KEYS = frozenset(
    {
        "kind",
        "local_workers",
        "max_requeues",
        "max_config_attempts",
        "max_array_size",
        "merge_job",
        "merge_partition",
        "lower_partition",
        "sbatch_timeout_s",
    }
)
MERGE_TIMEOUT_MIN = 30


def executor_parameters(settings: ExecutorSettings) -> dict[str, Any]:
    """The spec's executor section as submitit parameters (unset ones left to submitit)."""
    params = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if name in TILESWEEP_KEYS or value is None or value == [] or value == {}:
            continue
        params[name] = value
    return params


def grace_s(settings: ExecutorSettings, config_s: float = 0.0) -> float:
    """How long a warned worker may take to reach a stop: half the warning (SLURM sends it
    ``slurm_signal_delay_s`` to 60 s more before the limit), 5 to 30 s; longer where timing one
    config takes longer (``config_s``: its samples, ``config_seconds``), so a config timed at
    the spec's own pace is not called hung, but never past 5 s before the hard limit."""
    delay = settings.signal_delay_s()
    base = max(5, min(30, delay // 2))
    return float(max(base, min(delay - 5, math.ceil(config_s) + 5)))


def config_seconds(spec: SweepSpec) -> float:
    """Seconds the samples of one config take at the spec's pace (``repeats`` of ``target_ms``),
    half again for a loaded node: what a warned worker may need to finish the one it times."""
    return 1.5 * spec.repeats * spec.timing.target_ms / 1e3


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


@dataclass
class Submission:
    """What ``submit_units`` achieved: the job entries recorded, and the error that stopped it."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    error: DispatchError | None = None

    @property
    def arrays(self) -> list[str]:
        return list(dict.fromkeys(e["array_id"] for e in self.entries))


def tasks_of(unit_ids: list[str], per_task: int, costs: Mapping[str, float] | None = None) -> list[list[str]]:
    """Units grouped into as few tasks of at most ``per_task`` units as hold them, as even as
    they go: consecutive units share a task. Within a task, given ``costs`` (seconds per unit),
    the longest unit comes first (plan order among equals): its GPUs take them in that order,
    so the units left for the task's end are its shortest and its GPUs end close together. A
    fixed group lets ``jobs.jsonl`` say, before anything runs, which task runs each unit; which
    GPU of it does, its worker's partial says."""
    n_tasks = -(-len(unit_ids) // max(1, per_task))
    size, extra = divmod(len(unit_ids), max(1, n_tasks))
    groups, start = [], 0
    for k in range(n_tasks):
        end = start + size + (1 if k < extra else 0)
        group = unit_ids[start:end]
        groups.append(sorted(group, key=lambda u: -costs.get(u, 0.0)) if costs else group)
        start = end
    return groups


def unit_costs(sd: SweepDir, unit_ids: list[str]) -> dict[str, float]:
    """The cost model's seconds for each unit (``planning.costs.unit_cost``), read from its unit file."""
    spec = sd.spec
    return {u: unit_cost(sd.unit_items(u), spec, unit_round(sd, u)) for u in unit_ids}


def _job_entries(
    sd: SweepDir,
    groups: list[list[str]],
    jobs: list[Any],
    *,
    origin: str,
    t0: float,
    attempts: dict[str, int],
    settings: ExecutorSettings,
) -> list[dict[str, Any]]:
    """The ``jobs.jsonl`` lines of one accepted array: one per unit, with its task, its place
    in the task (``slot``: the first ones start at once, one per GPU, the rest in turn), the
    time limit and the requeues it was submitted with (a later ``resume --spec`` may change the
    spec's: status names those its task had), and its logs."""
    when = now_iso()
    entries = []
    for group, job in zip(groups, jobs, strict=True):
        jid = str(job.job_id)
        for slot, uid in enumerate(group):
            entries.append(
                {
                    "unit": uid,
                    "executor": "slurm",
                    "job_id": jid,
                    "array_id": array_of(jid),
                    "task": int(jid.split("_")[1]) if "_" in jid else None,
                    "slot": slot,
                    "units_in_task": len(group),
                    "attempt": attempts.get(uid, 0) + 1,
                    "origin": origin,
                    "submitted": when,
                    "submitted_ts": round(t0, 3),
                    "timeout_min": settings.timeout_min,
                    "max_requeues": settings.max_requeues,
                    "stdout": str(job.paths.stdout),
                    "stderr": str(job.paths.stderr),
                    "log": str(sd.unit_log(uid).absolute()),
                }
            )
    return entries


def task_args(
    sd: SweepDir, groups: list[list[str]], prior: dict[str, dict[str, int]]
) -> tuple[list[str], list[list[str]], list[dict[str, dict[str, int]]]]:
    """``map_array``'s argument lists for ``UnitTask``: the sweep (absolute: the task runs in
    sbatch's working directory, wherever that is), the units, their prior deaths."""
    root = str(sd.root.resolve())
    return [root] * len(groups), groups, [{u: prior[u] for u in g if prior.get(u)} for g in groups]


def submit_units(
    sd: SweepDir,
    unit_ids: list[str],
    settings: ExecutorSettings,
    *,
    per_array: int,
    origin: str,
    prior_starts: dict[str, dict[str, Any]] | None = None,
    attempts: dict[str, int] | None = None,
) -> Submission:
    """Submit units as SLURM job arrays of at most ``per_array`` tasks, at most
    ``units_per_task`` units a task; return at once.

    Each array's jobs are recorded in ``jobs.jsonl`` as soon as sbatch accepted it, with
    SIGINT/SIGTERM/SIGHUP held until they are (``sbatch.held_signals``), so an interruption
    or an error in a later array (returned, not raised) loses no job id. Nothing waits for jobs."""
    if not unit_ids:
        return Submission()
    ex = _slurm_executor(sd, settings, named_parameters(sd, settings))
    task = UnitTask(grace_s(settings, config_seconds(sd.spec)))
    per_task = settings.units_per_task()
    groups = tasks_of(unit_ids, per_task, unit_costs(sd, unit_ids) if per_task > 1 else None)
    done = Submission()
    for start in range(0, len(groups), max(1, per_array)):
        chunk = groups[start : start + per_array]
        t0 = time.time()
        try:
            with held_signals():
                with sbatch_call(sd.logs, settings.sbatch_timeout_s, asked=settings):
                    jobs = ex.map_array(task, *task_args(sd, chunk, prior_starts or {}))
                entries = _job_entries(
                    sd, chunk, jobs, origin=origin, t0=t0, attempts=attempts or {}, settings=settings
                )
                sd.record_sbatch_jobs(entries)
        except DispatchError as exc:
            done.error = exc
            return done
        done.entries.extend(entries)
        units, tasks = counted(len(entries), "unit"), counted(len(chunk), "task")
        log.info("submitted %s in %s as %s", units, tasks, array_of(entries[0]["job_id"]))
    return done


def named_parameters(sd: SweepDir, settings: ExecutorSettings) -> dict[str, Any]:
    """The submitit parameters of the units' arrays: the spec's, and a job name that says
    which sweep the jobs belong to."""
    params = executor_parameters(settings)
    if settings.slurm_job_name is None:
        params["name"] = f"tilesweep-{sd.root.name}"[:64]
    return params


def merge_job_parameters(sd: SweepDir, settings: ExecutorSettings, after: list[str]) -> dict[str, Any]:
    """The submitit parameters of the final merge job (1 CPU, no GPU, ``afterany``): the units'
    account, QOS, setup lines and partition, and the sbatch options of theirs that do not shape
    their tasks (``ExecutorSettings.merge_job_options``)."""
    params = {
        k: v
        for k, v in executor_parameters(settings).items()
        if k in ("slurm_account", "slurm_qos", "slurm_setup", "slurm_partition")
    }
    if settings.merge_job_options():
        params["slurm_additional_parameters"] = settings.merge_job_options()
    if settings.merge_partition:
        params["slurm_partition"] = settings.merge_partition
        params["timeout_min"] = MERGE_TIMEOUT_MIN
    else:  # the units' partition: their time limit is known to fit it
        params["timeout_min"] = min(settings.timeout_min, MERGE_TIMEOUT_MIN)
    params.update(
        cpus_per_task=1, name=f"tilesweep-merge-{sd.root.name}"[:64], slurm_dependency="afterany:" + ":".join(after)
    )
    return params


def submit_merge_job(
    sd: SweepDir, settings: ExecutorSettings, after: list[str], then: MergeHook | None = None
) -> dict[str, Any]:
    """A job that merges the sweep's results once every given array has ended, whatever
    its tasks' fate (``afterany``), then calls ``then(sweep_dir)`` if given (``MergeTask``).
    Runs on ``merge_partition`` without a GPU."""
    ex = _slurm_executor(sd, settings, merge_job_parameters(sd, settings, after))
    t0 = time.time()
    with held_signals():
        with sbatch_call(sd.logs, settings.sbatch_timeout_s):
            job = ex.submit(MergeTask(then), str(sd.root.resolve()))
        entry = {
            "event": "merge_job",
            "job_id": str(job.job_id),
            "after": after,
            "submitted": now_iso(),
            "submitted_ts": round(t0, 3),
            "stdout": str(job.paths.stdout),
            "stderr": str(job.paths.stderr),
        }
        sd.record_sbatch_jobs([entry])
    return entry


def render_scripts(sd: SweepDir, settings: ExecutorSettings, task_counts: list[int]) -> tuple[list[str], str | None]:
    """The sbatch scripts submitit would write for arrays of ``task_counts`` tasks, and for
    the final merge job (None when the spec asks for none); nothing is written or submitted."""
    ex = _slurm_executor(sd, settings, named_parameters(sd, settings))
    scripts = [render_script(ex, n) for n in task_counts]
    if not settings.merge_job:
        return scripts, None
    merge_ex = _slurm_executor(sd, settings, merge_job_parameters(sd, settings, ["<array ids>"]))
    return scripts, render_script(merge_ex, 1)
