"""How a submission to SLURM is shown: the arrays sbatch accepted (``print_submission``, after
``submit``, ``resume`` or a next round) and what ``submit --dry-run`` would submit
(``print_dry_run``: the array layout and the sbatch scripts)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from orchestrator import word
from orchestrator.cli.common import PROG, counted, items_in_units, units_capped, warn
from orchestrator.cli.reusing import reuse_lines, reuse_request

if TYPE_CHECKING:  # the control flows import submitit: loaded when a command runs, not for --help
    from orchestrator.control.arrays import SubmitOutcome
    from orchestrator.control.submit import DryRun
    from orchestrator.spec.executor_section import ExecutorSettings
    from orchestrator.spec.model import SweepSpec
    from orchestrator.store.sweepdir import SweepDir


def say_no_gpu(spec: SweepSpec, settings: ExecutorSettings) -> None:
    """The line said before sbatch where the tasks ask SLURM for no GPU for a sweep that measures
    kernels: one that times interpret mode on purpose (``arrays.require_gpus`` refuses any other)."""
    from orchestrator.control.arrays import asks_no_gpu

    if asks_no_gpu(spec, settings):
        what = "unset" if settings.gpus_per_node is None else "0"
        warn(
            f"note: executor.gpus_per_node is {what}: the SLURM tasks get no GPU and time the kernels in Pallas "
            "interpret mode on their CPUs (kernel.interpret: true)"
        )


def print_submission(sd: SweepDir, out: SubmitOutcome) -> None:
    """The arrays submitted (first and last task of each; how many units a task runs), the
    logs, the final merge job, and what could not be submitted."""
    if out.merge_error is not None:
        warn(
            f"warning: the final merge job was not submitted ({out.merge_error.message}); "
            f"`{PROG} wait {word(sd.root)}` or `{PROG} merge {word(sd.root)}` merges"
        )
    _print_arrays(sd, out)
    if out.merge_job is not None:
        print(_merge_job_line(sd, out.merge_job))
    if out.submission.error is not None:
        warn(
            f"warning: {counted(out.not_submitted, 'unit')} {'was' if out.not_submitted == 1 else 'were'} not "
            f"submitted: {out.submission.error.message}; "
            f"fix the cause, then `{PROG} resume {word(sd.root)}`"
        )


def _print_arrays(sd: SweepDir, out: SubmitOutcome) -> None:
    """Each array's first and last task, the logs, and a note on each task that leaves GPUs idle."""
    entries = out.submission.entries
    by_array: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_array.setdefault(e["array_id"], []).append(e)
    split = f" (at most {out.per_array} tasks per array: {out.why})" if len(by_array) > 1 else ""
    per_task = out.per_task
    tasks_note = f", tasks of {per_task} GPUs taking their units in turn" if per_task > 1 else ""
    print(f"submitted {counted(len(entries), 'unit')} as {counted(len(by_array), 'job array')}{tasks_note}{split}:")
    for array, group in by_array.items():
        ids = list(dict.fromkeys(e["job_id"] for e in group))
        span = f"{ids[0]} .. {ids[-1]}" if len(ids) > 1 else ids[0]
        print(f"  {array}: {span}  ({counted(len(ids), 'task')})")
    print(
        f"  logs: {sd.logs}/units/<unit>.log (`{PROG} logs {word(sd.root)} UNIT`); per task {sd.logs}/<task>_0_log.err"
    )
    items = {u["id"]: u["n_items"] for u in sd.unit_index()}
    in_tasks = sum(items.get(e["unit"], 1) for e in entries)
    for e in entries:
        if e.get("slot") == 0 and (e.get("units_in_task") or 1) < per_task:
            warn(
                f"note: task {e['job_id']} runs {counted(e['units_in_task'], 'unit')} on its {per_task} GPUs: "
                f"{per_task - e['units_in_task']} idle; {idle_advice(per_task, in_tasks)}"
            )


def idle_advice(per_task: int, items: int) -> str:
    """What makes the tasks of ``per_task`` GPUs leave none idle, for ``items`` items to run: a
    multiple of ``per_task`` units no larger than the items (a unit holds at least one), or,
    with fewer items than a task's GPUs, tasks of fewer GPUs."""
    if items < per_task:
        return (
            f"there {'is' if items == 1 else 'are'} only {counted(items, 'item')} to run, one a GPU at most: set "
            f"executor.gpus_per_node to {items} in the spec, with {counted(items, 'unit')} (--units {items})"
        )
    multiples = [str(k * per_task) for k in range(1, items // per_task + 1)]
    if len(multiples) > 3:
        multiples = [f"{multiples[0]} ... {multiples[-1]}"]
    which = " or ".join([", ".join(multiples[:-1]), multiples[-1]]) if len(multiples) > 1 else multiples[0]
    return (
        f"plan a multiple of {per_task} units, no more than its {counted(items, 'item')} (--units {which}), "
        "to use them all"
    )


def _merge_job_line(sd: SweepDir, job: dict[str, Any]) -> str:
    """What the final merge job writes, and the round it then plans and submits, if any."""
    from orchestrator.control.rounds import pending_round

    page = ""
    if sd.spec.report.html:
        from orchestrator.store.page_file import page_path

        page = f" and {page_path(sd.output)}"
    number = pending_round(sd)
    then = f", then plans and submits round {number} ({sd.spec.timing.strategy})" if number is not None else ""
    return f"final merge: job {job['job_id']} (afterany:{':'.join(job['after'])}) writes {sd.output}{page}{then}"


def print_dry_run(args: argparse.Namespace, max_tasks: int = 20) -> int:
    """``submit --dry-run``: the array layout (which units each task runs, on which GPU
    slot) and the sbatch scripts, as submitit would write them; nothing submitted."""
    from orchestrator.control.submit import dry_run

    d = dry_run(
        args.spec,
        sweep_dir=args.sweep_dir,
        units=args.units,
        costs=args.costs,
        max_array_size=args.max_array_size,
        output=args.output,
        reuse=reuse_request(args),
    )
    n_tasks = sum(len(a) for a in d.arrays)
    if not n_tasks:  # as submit would find it: nothing to run, no job, no merge job
        print(f"dry run: nothing written, nothing submitted. {d.root}: {d.planned} items, every unit done or reused")
        for line in reuse_lines(d.reused):
            print(line)
        if d.root.is_dir():
            print(f"nothing to submit (`{PROG} merge {word(d.root)}` writes the document)")
        else:  # a dry run made no sweep directory to merge: submit writes it, then merge the document
            reuse = "".join(f" --reuse {word(doc)}" for doc in args.reuse)
            again = f"{PROG} submit {word(args.spec)} --sweep-dir {word(d.root)}{reuse}"
            print(f"nothing to submit (`{again}` plans the sweep directory, then `{PROG} merge` writes the document)")
        return 0
    most = max((len(units) for tasks in d.arrays for units in tasks), default=0)
    turns = ("one GPU" if d.gpus else "no GPU asked for") if d.per_task == 1 else "one per GPU"
    if most > d.per_task > 1:
        turns = f"taken in turn by its {d.per_task} GPUs"
    print(
        f"dry run: nothing written, nothing submitted. {d.root}: {items_in_units(d.planned, len(d.sizes))}, "
        f"{counted(n_tasks, 'task')} of up to {counted(most, 'unit')} "
        f"({turns}), {counted(len(d.arrays), 'job array')}"
        + (f" (at most {d.per_array} tasks per array: {d.why})" if len(d.arrays) > 1 else "")
    )
    units_capped(d.asked, len(d.sizes))
    for line in reuse_lines(d.reused):
        print(line)
    _print_layout(d, max_tasks)
    for k, script in enumerate(d.scripts, 1):
        print(f"--- sbatch script of array {k} (submitit writes it as {d.root}/logs/<array id>_submission.sh) ---")
        print(script.rstrip())
    if d.merge_script is not None:
        print("--- sbatch script of the final merge job (afterany on the arrays' ids) ---")
        print(d.merge_script.rstrip())
    return 0


def _turn(place: int, gpus: int) -> str:
    """When a unit at ``place`` in its task starts: on GPU slot ``place`` at once, or next in
    the task's queue."""
    return f"GPU slot {place}" if place < gpus else f"queue #{place - gpus + 1}"


def _print_layout(d: DryRun, max_tasks: int) -> None:
    """Which units each task of each array would run, in the order its GPUs take them (the first
    ``per_task`` at once, one per GPU), and the idle GPUs."""
    for k, tasks in enumerate(d.arrays, 1):
        print(f"array {k}: {counted(len(tasks), 'task')}")
        for t, units in enumerate(tasks[:max_tasks]):
            print(
                f"  task {t}: "
                + ", ".join(f"{u} ({counted(d.sizes[u], 'item')}, {_turn(g, d.per_task)})" for g, u in enumerate(units))
            )
        if len(tasks) > max_tasks:
            print(f"  ... {len(tasks) - max_tasks} more tasks")
    idle = sum(max(0, d.per_task - len(units)) for tasks in d.arrays for units in tasks)
    if idle:
        items = sum(d.sizes[u] for tasks in d.arrays for units in tasks for u in units)
        print(f"note: {counted(idle, 'GPU')} of these tasks would sit idle; {idle_advice(d.per_task, items)}")
