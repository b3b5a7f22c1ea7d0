"""Pre-flight lowering on the cluster's CPUs (``executor.lower_partition``): the configs split
into the tasks of one CPU job array (``dispatch.lowering``), followed until the array ends.

Following reads the tasks' verdict files as they grow (each line is handed on once, as it
comes) and asks SLURM about the array's tasks now and then; it ends when every task has
written its last line or has left the queue. A task that ended without its last line (killed,
out of time, failed) leaves its remaining configs without a verdict: they stay runnable and a
rerun of ``plan --lower`` lowers them. An interruption (Ctrl-C) cancels the array
(``cancel_lowering``: scancel) and follows it until SLURM runs none of its tasks, still handing on
what they wrote: its caller holds the sweep's lowering lease meanwhile, so no task writes a verdict
once a later ``run`` or ``plan --lower`` may start.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.control.scheduler import array_of, cancel, query
from orchestrator.planning import WorkItem
from orchestrator.store.filekinds import holds_file
from orchestrator.store.files import open_file
from orchestrator.store.lowering import Verdict, read_lines, task_file
from orchestrator.store.sweepdir import SweepDir

CONFIGS_PER_TASK = 64  # about a minute of fwd_bwd lowering on 2 CPUs
POLL_S = 0.5  # between looks at the tasks' files (a stat and the new bytes each); SLURM is asked every ASK_EVERY looks
ASK_EVERY = 20
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")


@dataclass
class LoweringArray:
    """The job array lowering a sweep's configs, and what its tasks have said so far."""

    job_ids: list[str] = field(default_factory=list)
    groups: list[list[str]] = field(default_factory=list)  # the config ids of each task
    ended: set[int] = field(default_factory=set)  # tasks that wrote their last line
    gone: set[int] = field(default_factory=set)  # tasks SLURM says ended without it
    offsets: dict[int, int] = field(default_factory=dict)

    @property
    def array(self) -> str:
        return array_of(self.job_ids[0]) if self.job_ids else ""


def split(items: Sequence[WorkItem], per_task: int = CONFIGS_PER_TASK) -> list[list[str]]:
    """The config ids of each task, in plan order."""
    ids = [it.id for it in items]
    return [ids[i : i + per_task] for i in range(0, len(ids), max(1, per_task))]


def lower_on_cluster(
    sd: SweepDir,
    items: Sequence[WorkItem],
    on_verdict: Callable[[Verdict], None],
    started: Callable[[LoweringArray], None] | None = None,
) -> LoweringArray:
    """Lower ``items`` as a CPU job array on ``executor.lower_partition`` and hand on each
    verdict as its task writes it; return once every task has ended. ``started`` is given the
    array once it is submitted (a Ctrl-C after that: ``cancel_lowering``)."""
    from orchestrator.control.dispatch.lowering import submit_lowering
    from orchestrator.control.dispatch.sbatch import held_signals

    groups = split(items)
    before = {i: _size(sd.root / task_file(i)) for i in range(len(groups))}  # a rerun's tasks append
    with held_signals():  # a Ctrl-C while sbatch runs comes once ``started`` knows the array, to cancel it
        run = LoweringArray(job_ids=submit_lowering(sd, sd.spec.executor, groups), groups=groups, offsets=before)
        if started is not None:
            started(run)
    _follow(sd, run, on_verdict, cancelled=False)
    return run


def cancel_lowering(sd: SweepDir, run: LoweringArray, on_verdict: Callable[[Verdict], None]) -> bool:
    """Cancel the lowering array ``run`` (scancel; ``DispatchError`` where it cannot) and follow it,
    handing on the verdicts its tasks still write, until SLURM runs none of them (a task ending
    is still in squeue); False where SLURM could not be asked whether they ended."""
    cancel([run.array])
    return _follow(sd, run, on_verdict, cancelled=True)


def _follow(sd: SweepDir, run: LoweringArray, on_verdict: Callable[[Verdict], None], *, cancelled: bool) -> bool:
    """Hand on the verdicts ``run``'s tasks write until every task has ended (its last line, or
    SLURM no longer runs it; a cancelled array's SLURM is asked at every look); False where a
    cancelled array's SLURM cannot be asked."""
    key = (sd.spec.fingerprint(), sd.spec.kernel.target.name)
    looks = 0
    while True:
        for index, ids in enumerate(run.groups):
            if index not in run.ended:
                _read_task(sd.root, index, run, key, set(ids), on_verdict)
        if len(run.ended | run.gone) == len(run.groups):
            return True
        looks += 1
        if cancelled and not _ask_after_cancel(run):
            return False
        if not cancelled and looks % ASK_EVERY == 0:
            _ask_slurm(run)  # a task it marks gone is read once more above
        time.sleep(POLL_S)


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _read_task(
    root: Path,
    index: int,
    run: LoweringArray,
    key: tuple[str, str],
    ids: set[str],
    on_verdict: Callable[[Verdict], None],
) -> None:
    """Hand on the verdicts of ``ids`` in the whole lines task ``index`` wrote since the last
    look (this array's task writes a header of this sweep first)."""
    path = root / task_file(index)
    if not holds_file(path):
        return
    with open_file(path) as fh:
        fh.seek(run.offsets.get(index, 0))
        data = fh.read()
    whole = data[: data.rfind(b"\n") + 1]
    if not whole:
        return
    run.offsets[index] = run.offsets.get(index, 0) + len(whole)
    lines = whole.decode("utf-8").splitlines()
    for verdict in read_lines(lines, *key, ours=True).values():
        if verdict.id in ids:
            on_verdict(verdict)
    if any(_is_end(line) for line in lines):
        run.ended.add(index)


def _is_end(line: str) -> bool:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "lowering_end" in obj


def _ask_slurm(run: LoweringArray) -> None:
    """Mark the tasks SLURM no longer runs (a task's last line may still be on its way: it is
    read once more before the task counts as gone)."""
    view = query(run.job_ids)
    if not (view.squeue_ok or view.sacct_ok):
        return
    for index, jid in enumerate(run.job_ids):
        state = view.get(jid)
        if index in run.ended:
            continue
        if (state is not None and state.state not in ACTIVE) or (state is None and view.knows_array(jid)):
            run.gone.add(index)


def _ask_after_cancel(run: LoweringArray) -> bool:
    """Mark the tasks of a cancelled array that squeue no longer lists (a task being killed is
    listed, COMPLETING, until its processes ended); False where squeue cannot be asked."""
    view = query(run.job_ids)
    if not view.squeue_ok:
        return False
    for index, jid in enumerate(run.job_ids):
        state = view.get(jid)
        if state is None or state.source != "squeue" or state.state not in ACTIVE:
            run.gone.add(index)
    return True
