"""Submitting a sweep's units to SLURM: how many per array, the final merge job, and a
refusal that changes nothing.

``submit_spec`` plans a spec (or reopens its sweep directory) and submits its unfinished
units; ``submit_unfinished`` does the same for a directory that exists (``run`` with the
slurm executor); ``submit_with_merge`` submits given units plus the dependent merge job and
is what ``resume`` uses too. ``next_round`` plans and submits round 2 of a halving sweep;
the merge job of a halving sweep calls it on the cluster (``after_merge``), so round 2 starts
even when nobody waits. Nothing here prints: the results say what was submitted, and
``on_planned`` hooks let the caller speak before sbatch is called.

A refused submission changes nothing: the tools are checked before anything is written, and
when sbatch refuses the first array the units added for it and a sweep directory created for
it are removed again (``dispatch`` removes submitit's temp files).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import PROG
from orchestrator.control import dispatch
from orchestrator.control.history import read_history
from orchestrator.control.reuseplan import ReuseRequest
from orchestrator.control.rounds import Round2, pending_round2, plan_round2, undo_round2
from orchestrator.control.scheduler import JOB_COUNT_MARGIN, cluster_limits, require_submit_tools
from orchestrator.control.sweeps import default_sweep_dir, prepare_sweep, slurm_jobs, sweep_lock, unfinished_units
from orchestrator.errors import DispatchError
from orchestrator.spec.sections import ExecutorSettings
from orchestrator.store.sweepdir import SweepDir, atomic_write_text, now_iso

log = logging.getLogger(__name__)


@dataclass
class SubmitOutcome:
    """What ``submit_with_merge`` did. ``submission.error``: a later array sbatch refused
    (the earlier ones stand); ``merge_error``: why the final merge job was not submitted."""

    requested: list[str]
    submission: dispatch.Submission
    per_array: int
    why: str  # where per_array comes from
    merge_job: dict | None = None
    merge_error: DispatchError | None = None
    per_task: int = 1  # units a task runs at once (one per GPU)

    @property
    def not_submitted(self) -> int:
        return len(self.requested) - len(self.submission.entries)


@dataclass
class SweepSubmission:
    """What ``submit_spec`` / ``submit_unfinished`` found and did: the sweep's units, those
    not done yet, and the outcome of submitting them (None when every unit was done)."""

    sd: SweepDir
    units: int
    todo: list[str] = field(default_factory=list)
    outcome: SubmitOutcome | None = None


OnPlanned = Callable[[SweepSubmission], None]


def per_array(settings: ExecutorSettings, override: int | None, n_units: int) -> tuple[int, str]:
    """Tasks per array, and where that number comes from: the override, the spec's
    ``max_array_size``, or the cluster's limits (read once). A sweep that can never fit in
    the controller's job table is refused."""
    limit = override or settings.max_array_size
    if limit is not None:
        return limit, "override" if override else "executor.max_array_size"
    limits = cluster_limits()
    n_tasks = -(-n_units // settings.units_per_task())
    if limits.max_job_count is not None and n_tasks > limits.max_job_count - JOB_COUNT_MARGIN:
        raise DispatchError(
            f"{n_tasks} array tasks, but the cluster holds at most MaxJobCount={limits.max_job_count} jobs at once "
            "(every array task counts); plan fewer units (--units)"
        )
    return limits.per_array, f"MaxArraySize={limits.max_array_size} ({limits.source})"


class UnitsRollback:
    """Undo ``add_units`` for the units no accepted array runs: their unit files and their
    lines in units.json go; every other unit, and the units sbatch accepted, stay."""

    def __init__(self, sd: SweepDir) -> None:
        self.sd = sd
        self.known = {u["id"] for u in sd.unit_index()}
        self.history_len = len(sd.job_history())

    def submitted_since(self, unit_ids: list[str]) -> set[str]:
        """Those of ``unit_ids`` that a job recorded since this rollback was made runs."""
        wanted = set(unit_ids)
        return {
            e["unit"] for e in self.sd.job_history()[self.history_len :] if "event" not in e and e.get("unit") in wanted
        }

    def undo(self, added: list[str]) -> None:
        drop = {uid for uid in added if uid not in self.known}
        if not drop:
            return
        for uid in drop:
            with contextlib.suppress(FileNotFoundError):
                self.sd.unit_path(uid).unlink()
        index = [u for u in self.sd.unit_index() if u["id"] not in drop]
        atomic_write_text(self.sd.root / "units.json", json.dumps(index) + "\n")


def submit_with_merge(
    sd: SweepDir,
    unit_ids: list[str],
    settings: ExecutorSettings,
    *,
    origin: str,
    max_array_size: int | None,
    prior: dict[str, dict[str, Any]] | None = None,
) -> SubmitOutcome:
    """Submit units as job arrays, then the final merge job (``afterany`` on them) when the
    spec asks for one; a halving sweep's merge job then plans and submits round 2
    (``after_merge``). A refusal of the first array is raised (the caller undoes what it
    wrote); a later one is returned in the outcome, as is a refused merge job."""
    size, why = per_array(settings, max_array_size, len(unit_ids))
    attempts = dict(read_history(sd).submissions)
    sub = dispatch.submit_units(
        sd, unit_ids, settings, per_array=size, origin=origin, prior_starts=prior, attempts=attempts
    )
    if sub.error is not None and not sub.entries:
        raise sub.error
    outcome = SubmitOutcome(list(unit_ids), sub, size, why, per_task=settings.units_per_task())
    if settings.merge_job and sub.entries:
        try:
            then = after_merge if pending_round2(sd) else None
            outcome.merge_job = dispatch.submit_merge_job(sd, settings, sub.arrays, then=then)
        except DispatchError as exc:
            outcome.merge_error = exc
    return outcome


def _submit_todo(
    sd: SweepDir, settings: ExecutorSettings, max_array_size: int | None, on_planned: OnPlanned | None
) -> SweepSubmission:
    """Under the sweep's lock: submit every unit that is not done."""
    result = SweepSubmission(sd, len(sd.unit_index()), unfinished_units(sd))
    if on_planned is not None:
        on_planned(result)
    if result.todo:
        result.outcome = submit_with_merge(sd, result.todo, settings, origin="submit", max_array_size=max_array_size)
    return result


def submit_spec(
    spec_path: str,
    *,
    sweep_dir: str | None,
    units: int | None,
    output: str | None,
    costs: str | None,
    max_array_size: int | None,
    on_planned: OnPlanned | None = None,
    reuse: ReuseRequest | None = None,
) -> SweepSubmission:
    """Plan (or reopen) the sweep of a spec and submit its unfinished units. A directory
    that was submitted already is refused (``resume`` submits what it misses); a directory
    made for a submission that failed is removed again."""
    from orchestrator.spec.files import load_spec

    spec = load_spec(spec_path)
    require_submit_tools()
    root = Path(sweep_dir) if sweep_dir else default_sweep_dir(spec_path, spec)
    created = not root.exists()
    sd, _, existed = prepare_sweep(spec_path, str(root), units, output, costs=costs, reuse=reuse, kind="slurm")
    try:
        with sweep_lock(sd):
            if slurm_jobs(sd):
                raise DispatchError(
                    f"{sd.root} was submitted already ({slurm_jobs(sd)} jobs in {sd.root / 'jobs.jsonl'}); "
                    f"see `{PROG} status {sd.root}`, and `{PROG} resume {sd.root}` submits its missing items"
                )
            return _submit_todo(sd, spec.executor, max_array_size, on_planned)
    except BaseException:
        if created and not existed and not slurm_jobs(sd):
            shutil.rmtree(root, ignore_errors=True)  # a sweep directory made for nothing
        raise


def submit_unfinished(
    sd: SweepDir, settings: ExecutorSettings, *, on_planned: OnPlanned | None = None
) -> SweepSubmission | None:
    """Submit the units of an existing sweep directory that are not done (``run`` with the
    slurm executor, on a directory never submitted to SLURM); None, submitting nothing, when
    another command submitted it meanwhile (checked under the sweep's lock)."""
    require_submit_tools()
    with sweep_lock(sd):
        if slurm_jobs(sd):
            return None
        return _submit_todo(sd, settings, None, on_planned)


@dataclass
class DryRun:
    """What ``submit`` would do, made without writing or submitting anything: the units,
    how they map to arrays and tasks (``arrays[a][t]`` = the units of task ``t`` of array
    ``a``, one per GPU), and the sbatch scripts submitit would write."""

    root: Path
    planned: int
    sizes: dict[str, int]  # unit -> items
    per_task: int
    per_array: int
    why: str
    arrays: list[list[list[str]]]
    scripts: list[str]
    merge_script: str | None
    reused: dict[str, Any] | None = None  # what planning would reuse (``Found.summary``), planned here


def dry_run(
    spec_path: str,
    *,
    sweep_dir: str | None,
    units: int | None,
    costs: str | None,
    max_array_size: int | None,
    output: str | None = None,
    reuse: ReuseRequest | None = None,
) -> DryRun:
    """``submit --dry-run``: plan in memory, with reuse as ``submit`` would (or read the units of
    an existing, never submitted sweep directory) and render the sbatch scripts; nothing is written."""
    from orchestrator.control.reuseplan import plan_with_reuse
    from orchestrator.spec.files import load_spec
    from orchestrator.store.document import load_costs

    spec = load_spec(spec_path)
    require_submit_tools()
    root = Path(sweep_dir) if sweep_dir else default_sweep_dir(spec_path, spec)
    if (root / "sweep.json").exists():
        sd = SweepDir.open(root)
        if slurm_jobs(sd):
            raise DispatchError(f"{sd.root} was submitted already; `{PROG} resume {sd.root}` submits its missing items")
        todo = set(unfinished_units(sd))
        sizes = {u["id"]: u["n_items"] for u in sd.unit_index() if u["id"] in todo}
        planned, reused = sd.planned, None
    else:
        sd = SweepDir(root)
        p = plan_with_reuse(
            spec, root, Path(output or spec.output), units, load_costs(costs) if costs else None, reuse, "slurm"
        )
        sizes, planned, reused = {u.id: len(u.items) for u in p.units}, len(p.items), p.found.summary()
    settings = spec.executor
    size, why = per_array(settings, max_array_size, len(sizes))
    groups = dispatch.tasks_of(list(sizes), settings.units_per_task())
    arrays = [groups[i : i + size] for i in range(0, len(groups), size)]
    scripts, merge_script = dispatch.render_scripts(sd, settings, [len(a) for a in arrays])
    return DryRun(root, planned, sizes, settings.units_per_task(), size, why, arrays, scripts, merge_script, reused)


@dataclass
class NextRound:
    """What ``next_round`` did: the round planned, and how its units were submitted (SLURM;
    None where they run here, or none survived)."""

    round2: Round2
    outcome: SubmitOutcome | None = None


def next_round(sd: SweepDir, settings: ExecutorSettings) -> NextRound | None:
    """Plan round 2 of a halving sweep whose round 1 is complete and, on SLURM, submit it with
    its own final merge job; None when there is nothing to plan (see ``rounds.plan_round2``).
    A refused submission plans nothing: the next ``wait``, ``resume`` or merge job retries."""
    if not pending_round2(sd):
        return None
    slurm = settings.kind == "slurm"
    if slurm:
        require_submit_tools()
    with sweep_lock(sd):
        rollback = UnitsRollback(sd)
        planned = plan_round2(sd)
        if planned is None:
            return None
        done = NextRound(planned)
        ids = [u.id for u in planned.units]
        if slurm and ids:
            try:
                done.outcome = submit_with_merge(sd, ids, settings, origin="round2", max_array_size=None)
            except BaseException:  # as resume: units an accepted array runs stay, and so does the round
                accepted = rollback.submitted_since(ids)
                rollback.undo([u for u in ids if u not in accepted])
                if not accepted:
                    undo_round2(sd)
                raise
    return done


def after_merge(sweep_dir: str) -> dict | None:
    """The final merge job's hook (on a compute node): submit round 2 when round 1 is complete.
    Where sbatch cannot be run from a compute node, say so in the job's log and in the sweep's
    history; ``tilesweep wait`` or ``tilesweep resume`` then submits round 2 from a login node."""
    sd = SweepDir.open(sweep_dir)
    try:
        done = next_round(sd, sd.spec.executor)
    except DispatchError as exc:
        log.warning(
            "round 2 of %s not submitted from the merge job: %s; `%s wait %s` or `%s resume %s` submits it",
            sd.root,
            exc.message,
            PROG,
            sd.root,
            PROG,
            sd.root,
        )
        sd.record_jobs(
            [{"event": "round2_deferred", "why": exc.message, "time": now_iso(), "ts": round(time.time(), 3)}]
        )
        return {"round2": "deferred", "why": exc.message}
    if done is None:
        return None
    return {"round2": len(done.round2.units), "survivors": done.round2.summary.get("survivors")}
