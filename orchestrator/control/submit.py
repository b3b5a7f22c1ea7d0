"""Submitting a sweep's units to SLURM: how many per array, the final merge job, and a
refusal that changes nothing.

``submit_spec`` plans a spec (or reopens its sweep directory) and submits its unfinished
units; ``submit_unfinished`` does the same for a directory that exists (``run`` with the
slurm executor); ``submit_with_merge`` submits given units plus the dependent merge job and
is what ``resume`` uses too. Nothing here prints: the results say what was submitted, and
``on_planned`` hooks let the caller speak before sbatch is called.

A refused submission changes nothing: the tools are checked before anything is written, and
when sbatch refuses the first array the units added for it and a sweep directory created for
it are removed again (``dispatch`` removes submitit's temp files).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import PROG
from orchestrator.control import dispatch
from orchestrator.control.scheduler import JOB_COUNT_MARGIN, cluster_limits, require_submit_tools
from orchestrator.control.status import read_history
from orchestrator.control.sweeps import default_sweep_dir, prepare_sweep, slurm_jobs, sweep_lock, unfinished_units
from orchestrator.errors import DispatchError
from orchestrator.spec.model import ExecutorSettings
from orchestrator.store.sweepdir import SweepDir, atomic_write_text


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
    if limits.max_job_count is not None and n_units > limits.max_job_count - JOB_COUNT_MARGIN:
        raise DispatchError(
            f"{n_units} units, but the cluster holds at most MaxJobCount={limits.max_job_count} jobs at once "
            "(every array task counts); plan fewer units (--units)"
        )
    return limits.per_array, f"MaxArraySize={limits.max_array_size} ({limits.source})"


class UnitsRollback:
    """Undo ``add_units`` when nothing could be submitted: units.json and unit files as before."""

    def __init__(self, sd: SweepDir) -> None:
        self.sd = sd
        self.index_text = (sd.root / "units.json").read_text(encoding="utf-8")
        self.known = {u["id"] for u in sd.unit_index()}

    def undo(self, added: list[str]) -> None:
        for uid in added:
            if uid not in self.known:
                with contextlib.suppress(FileNotFoundError):
                    self.sd.unit_path(uid).unlink()
        atomic_write_text(self.sd.root / "units.json", self.index_text)


def submit_with_merge(sd: SweepDir, unit_ids: list[str], settings: ExecutorSettings, *, origin: str,
                      max_array_size: int | None, prior: dict[str, dict[str, int]] | None = None) -> SubmitOutcome:
    """Submit units as job arrays, then the final merge job (``afterany`` on them) when the
    spec asks for one. A refusal of the first array is raised (the caller undoes what it
    wrote); a later one is returned in the outcome, as is a refused merge job."""
    size, why = per_array(settings, max_array_size, len(unit_ids))
    attempts = dict(read_history(sd).submissions)
    sub = dispatch.submit_units(sd, unit_ids, settings, per_array=size, origin=origin, prior_starts=prior,
                                attempts=attempts)
    if sub.error is not None and not sub.entries:
        raise sub.error
    outcome = SubmitOutcome(list(unit_ids), sub, size, why)
    if settings.merge_job and sub.entries:
        try:
            outcome.merge_job = dispatch.submit_merge_job(sd, settings, sub.arrays)
        except DispatchError as exc:
            outcome.merge_error = exc
    return outcome


def _submit_todo(sd: SweepDir, settings: ExecutorSettings, max_array_size: int | None,
                 on_planned: OnPlanned | None) -> SweepSubmission:
    """Under the sweep's lock: submit every unit that is not done."""
    result = SweepSubmission(sd, len(sd.unit_index()), unfinished_units(sd))
    if on_planned is not None:
        on_planned(result)
    if result.todo:
        result.outcome = submit_with_merge(sd, result.todo, settings, origin="submit", max_array_size=max_array_size)
    return result


def submit_spec(spec_path: str, *, sweep_dir: str | None, units: int | None, output: str | None,
                costs: str | None, max_array_size: int | None,
                on_planned: OnPlanned | None = None) -> SweepSubmission:
    """Plan (or reopen) the sweep of a spec and submit its unfinished units. A directory
    that was submitted already is refused (``resume`` submits what it misses); a directory
    made for a submission that failed is removed again."""
    from orchestrator.spec.files import load_spec

    spec = load_spec(spec_path)
    require_submit_tools()
    root = Path(sweep_dir) if sweep_dir else default_sweep_dir(spec_path, spec)
    created = not root.exists()
    sd, _, existed = prepare_sweep(spec_path, str(root), units, output, costs=costs)
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


def submit_unfinished(sd: SweepDir, settings: ExecutorSettings, *,
                      on_planned: OnPlanned | None = None) -> SweepSubmission:
    """Submit the units of an existing sweep directory that are not done (``run`` with the
    slurm executor, on a directory never submitted to SLURM)."""
    require_submit_tools()
    with sweep_lock(sd):
        return _submit_todo(sd, settings, None, on_planned)
