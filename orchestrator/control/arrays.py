"""Handing given units to SLURM as job arrays, with the final merge job that waits on them.

``submit_with_merge`` is what every submission goes through (``submit``, ``resume`` and a
strategy's next round, ``rounds``): how many tasks an array may hold (``per_array``), the
arrays themselves, then the merge job (``afterany`` on them) that merges on the cluster even
when nobody waits. What that merge job does after merging (``then``: the next round of a
strategy with rounds) is the caller's to say; ``rounds.merge_hook`` says it.

Nothing here prints. A refusal of the first array is raised, a later one is returned in the
outcome; ``UnitsRollback`` takes the units no accepted array runs out of ``units.json`` again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernels import impls
from kernels.spelling import as_json
from orchestrator import PROG, counted, word
from orchestrator.control import dispatch
from orchestrator.control.history import MERGE_REFUSED, read_history
from orchestrator.control.partitions import require_partitions
from orchestrator.control.scheduler import JOB_COUNT_MARGIN, cluster_limits
from orchestrator.errors import DispatchError, SpecError
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.sections import REPLAY
from orchestrator.store.sweepdir import SweepDir, atomic_write_text

if TYPE_CHECKING:  # submitit, which the tasks' module imports, loads with a submission, not with a local run
    from orchestrator.control.dispatch.tasks import MergeHook

log = logging.getLogger(__name__)


@dataclass
class SubmitOutcome:
    """What ``submit_with_merge`` did. ``submission.error``: a later array sbatch refused
    (the earlier ones stand); ``merge_error``: why the final merge job was not submitted."""

    requested: list[str]
    submission: dispatch.Submission
    per_array: int
    why: str  # where per_array comes from
    merge_job: dict[str, Any] | None = None
    merge_error: DispatchError | None = None
    per_task: int = 1  # units a task runs at once (one per GPU; it may hold more, taken in turn)

    @property
    def not_submitted(self) -> int:
        return len(self.requested) - len(self.submission.entries)


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


def require_cluster_takes(
    settings: ExecutorSettings, spec: SweepSpec, *, spec_file: str | None = None, sweep: SweepDir | None = None
) -> None:
    """Refuse, before any sbatch, the arrays of ``settings`` that would time ``spec``'s kernels
    without a GPU by mistake (``require_gpus``), and the arrays and final merge job the cluster's
    partitions would refuse (``partitions.require_partitions``), naming the spec file whose
    executor settings they are (``spec_file``: the spec submitted, or given to ``resume --spec``)."""
    from orchestrator.control.dispatch.slurm import MERGE_TIMEOUT_MIN

    require_gpus(spec, settings, spec_file=spec_file, sweep=sweep)
    try:
        require_partitions(settings, MERGE_TIMEOUT_MIN)
    except DispatchError as exc:  # its fields are the spec file's, which a submit names
        if spec_file is None:
            raise
        raise DispatchError(f"{spec_file}: {exc.message}") from None


def asks_no_gpu(spec: SweepSpec, settings: ExecutorSettings) -> bool:
    """Whether the SLURM tasks of ``settings`` ask for no GPU (``executor.gpus_per_node`` unset or
    0) while ``spec`` measures kernels (a replay measures none): they time them on their CPUs,
    in Pallas interpret mode."""
    return spec.kernel.impl != REPLAY and not settings.gpus_per_node


def require_gpus(
    spec: SweepSpec, settings: ExecutorSettings, *, spec_file: str | None = None, sweep: SweepDir | None = None
) -> None:
    """Refuse tasks that ask SLURM for no GPU for a sweep that measures kernels, unless the spec
    asks for interpret mode on purpose (``kernel.interpret: true``): they would time the kernels
    interpreted on CPUs, records that read as measurements of the GPU the sweep targets. A
    kernel with no interpret mode has only the one way on. ``spec_file``: the spec submitted, or
    given to ``resume --spec``; ``sweep``: a sweep submitted before (``resume``, a next round), which
    takes another ``executor`` through ``resume --spec``, but another ``kernel.interpret`` only as
    another sweep (it is part of the fingerprint)."""
    if not asks_no_gpu(spec, settings) or spec.kernel.interpret is True:
        return
    source = spec_file or (sweep.meta.get("spec_source") if sweep is not None else None)
    named = word(source) if source else "SPEC"
    then = f", then `{PROG} resume {word(sweep.root)} --spec {named}`" if sweep is not None else ""
    what = "unset" if settings.gpus_per_node is None else "0"
    said = (
        (f"{spec_file}: " if spec_file else "")
        + f"executor.gpus_per_node is {what}: the SLURM tasks would get no GPU and time the kernels in Pallas "
        f"interpret mode on their CPUs, not on the {spec.kernel.target.name} the sweep targets (kernel.device_kind); "
    )
    if not impls.get(spec.measured_impl).capabilities.interpret:
        raise SpecError(
            f"{said}kernel.impl {as_json(spec.named_impl)} has no interpret mode: set executor.gpus_per_node to the "
            f"GPUs of a task{then}"
        )
    new = f" (another sweep: kernel.interpret is part of its fingerprint; `{PROG} submit {named}`)" if sweep else ""
    raise SpecError(
        f"{said}set executor.gpus_per_node to the GPUs of a task{then}, or kernel.interpret: true to time "
        f"interpret mode on purpose{new}"
    )


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
    then: MergeHook | None,
    prior: dict[str, dict[str, Any]] | None = None,
) -> SubmitOutcome:
    """Submit units as job arrays, then the final merge job (``afterany`` on them) when the
    spec asks for one; that job calls ``then`` after merging. A refusal of the first array is
    raised (the caller undoes what it wrote); a later one is returned in the outcome, as is a
    refused merge job."""
    from orchestrator.control.dispatch.sbatch import held_signals

    size, why = per_array(settings, max_array_size, len(unit_ids))
    require_cluster_takes(settings, sd.spec, sweep=sd)
    attempts = dict(read_history(sd).submissions)
    done: list[SubmitOutcome] = []
    # a Ctrl-C once an array is accepted still submits the merge job that follows it, then says both
    with held_signals(lambda: accepted_words(sd, done[0] if done else None)):
        sub = dispatch.submit_units(
            sd, unit_ids, settings, per_array=size, origin=origin, prior_starts=prior, attempts=attempts
        )
        if sub.error is not None and not sub.entries:
            raise sub.error
        outcome = SubmitOutcome(
            requested=list(unit_ids), submission=sub, per_array=size, why=why, per_task=settings.gpus_per_task()
        )
        done.append(outcome)
        if settings.merge_job and sub.entries:
            try:
                outcome.merge_job = dispatch.submit_merge_job(sd, settings, sub.arrays, then=then)
            except DispatchError as exc:
                outcome.merge_error = exc
                record_merge_refused(sd, sub.arrays, exc)
    return outcome


def record_merge_refused(sd: SweepDir, arrays: list[str], exc: DispatchError) -> None:
    """Note in ``jobs.jsonl`` that no final merge job follows ``arrays`` (sbatch refused it), so
    that a status from any shell says so while they run, and what merges instead
    (``history.MERGE_REFUSED``). A disk that takes no line leaves it to the submission's warning."""
    entry = {"event": MERGE_REFUSED, "after": arrays, "why": exc.message, "ts": round(time.time(), 3)}
    try:
        sd.record_jobs([entry])
    except OSError as err:
        log.warning("the refused final merge job is not noted in %s: %s", err.filename, err.strerror)


def accepted_words(sd: SweepDir, outcome: SubmitOutcome | None) -> str:
    """What sbatch accepted, in words, for a stop that came while it ran: the arrays (which run
    on) and the final merge job, or why there is none and what merges instead."""
    if outcome is None or not outcome.submission.entries:
        return "sbatch accepted no job"
    arrays = list(dict.fromkeys(e["array_id"] for e in outcome.submission.entries))
    said = (
        f"sbatch accepted job {'array' if len(arrays) == 1 else 'arrays'} {', '.join(arrays)} "
        f"({counted(len(outcome.submission.entries), 'unit')}), which {'runs' if len(arrays) == 1 else 'run'} on"
    )
    merges = f"`{PROG} wait {word(sd.root)}` or `{PROG} merge {word(sd.root)}` merges once they end"
    if outcome.merge_job is not None:
        return f"{said}, and the final merge job {outcome.merge_job['job_id']}"
    if outcome.merge_error is not None:
        return f"{said}; the final merge job was not submitted ({outcome.merge_error.message}): {merges}"
    return f"{said}; {merges}"
