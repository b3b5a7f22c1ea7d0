"""What ``tilesweep logs`` prints and says: a unit's log, a task's log, the log behind a job id as
squeue prints it (an array's, the final merge job's), and a unit that has none (never submitted,
its log gone, waiting for a GPU of a running task, cancelled before it started, the unit of records
carried from earlier documents), or a key that names no one unit or job of the sweep."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from orchestrator.planning import Unit
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import TINY_SPEC, assert_one_line_error, replay_spec, run_cli, synthetic_source


def _replayed(tmp_path: Path, name: str = "spec.json", **over: Any) -> Path:
    """A spec file of two fwd items replayed from a made-up document of them: its workers run as
    a measuring sweep's do, and take moments."""
    grid = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [32]}
    source = synthetic_source(tmp_path / "source.json", grid)
    return replay_spec(tmp_path / name, grid, source, tmp_path / "results.json", **over)


def test_logs_of_a_unit_that_ran_whose_log_is_gone_says_so(tmp_path: Path) -> None:
    spec = _replayed(tmp_path, executor={"kind": "local"})
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    shutil.rmtree(sweep / "logs")
    r = run_cli("logs", str(sweep), "0")
    assert_one_line_error(r, "ran, but its log is gone", f"`tilesweep status {sweep}` shows the unit")
    assert "has not started" not in r.stderr and "never submitted" not in r.stderr


def test_logs_of_the_unit_of_carried_records_says_no_worker_ran_it(tmp_path: Path) -> None:
    spec = _replayed(tmp_path, executor={"kind": "debug"})
    assert run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "first")).returncode == 0
    sweep = tmp_path / "again"  # the same spec planned again: its output document holds every item
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    assert planned.returncode == 0 and "every item is carried" in planned.stdout, planned.stdout + planned.stderr
    for extra in ([], ["--task"]):
        r = run_cli("logs", str(sweep), "0", *extra)
        line = assert_one_line_error(r, "it holds the records planning carried from earlier documents (reuse.json")
        assert "which no worker ran" in line and "gone" not in line, line


def test_logs_task_of_a_unit_run_here_says_it_has_no_task_log(tmp_path: Path) -> None:
    sd, units = build_sweep(tmp_path / "sweep", small_spec(), 1)
    sd.record_jobs([{"unit": units[0].id, "executor": "local", "job_id": "123", "log": str(sd.unit_log(units[0].id))}])
    r = run_cli("logs", str(sd.root), "0", "--task")
    assert_one_line_error(r, "ran here (local executor), not as a SLURM task", f"tilesweep logs {sd.root} 0")


def test_logs_of_a_unit_waiting_in_a_running_whole_node_task_says_so_not_the_tasks_log(tmp_path: Path) -> None:
    """A 2-unit task runs its first unit; the second waits for a GPU: its ``logs`` says so (it
    printed the task's log, exit 0), and ``--task`` prints the task's log. Once `tilesweep cancel`
    cancelled the task, the unit's ``logs`` says the task ended before a GPU took it. The task is
    this test's (SLURM not asked: ``TILESWEEP_SLURM_QUERIES=0``, so status takes it as running)."""
    sd, units = build_sweep(tmp_path / "sweep", small_spec(), 2)
    task_log = sd.logs / "70_0_log.err"
    task_log.parent.mkdir(parents=True, exist_ok=True)
    task_log.write_text("a task's line about its first unit's worker\n")
    sd.record_jobs(
        [
            {"unit": u.id, "executor": "slurm", "job_id": "70_0", "array_id": "70", "task": 0, "slot": k}
            | {"units_in_task": 2, "stderr": str(task_log), "log": str(sd.unit_log(u.id))}
            for k, u in enumerate(units)
        ]
    )
    waiting = units[1].id  # nothing of it written yet
    for path in (sd.unit_log(waiting), sd.partial_path(waiting), sd.marker_path(waiting)):
        path.unlink(missing_ok=True)
    unasked = {"TILESWEEP_SLURM_QUERIES": "0"}
    r = run_cli("logs", str(sd.root), "1", env=unasked)
    assert_one_line_error(r, "has no log yet: its task (job 70_0) runs", f"tilesweep logs {sd.root} 1 --task")
    task = run_cli("logs", str(sd.root), "1", "--task", env=unasked)
    assert task.returncode == 0 and "a task's line about its first unit's worker" in task.stdout, task.stdout
    sd.record_jobs([{"event": "cancel", "arrays": ["70"], "jobs": ["70_0"], "time": "", "ts": time.time() + 1}])
    assert_one_line_error(
        run_cli("logs", str(sd.root), "1", env=unasked),
        f"unit {waiting} of {sd.root} has no log: its task (job 70_0) ended before one of its GPUs took this unit "
        f"(cancelled with `tilesweep cancel`), so none of it ran; `tilesweep resume {sd.root}` redoes its items; "
        f"`tilesweep logs {sd.root} 1 --task` prints the task's log",
    )


def test_logs_of_a_unit_cancelled_before_it_started_says_so(tmp_path: Path) -> None:
    """A pending array `tilesweep cancel` cancelled: ``logs`` of its unit says the job was
    cancelled before it started (it said "has not started", as if it would still run)."""
    sd, units = build_sweep(tmp_path / "sweep", small_spec(), 1)
    uid = units[0].id
    for path in (sd.unit_log(uid), sd.partial_path(uid), sd.marker_path(uid)):
        path.unlink(missing_ok=True)
    now = time.time()
    sd.record_jobs([{"unit": uid, "executor": "slurm", "job_id": "71_0", "array_id": "71", "task": 0}])
    sd.record_jobs([{"event": "cancel", "arrays": ["71"], "time": "", "ts": now + 1}])
    r = run_cli("logs", str(sd.root), "0")
    assert_one_line_error(r, "its job 71_0 was cancelled before it started", f"tilesweep resume {sd.root}")


def test_logs_of_a_key_that_names_no_one_unit_says_what_names_one(tmp_path: Path) -> None:
    """A position past the index, or the start of several unit ids: one line that says which,
    in JSON's quotes and the unit count in the singular where it is one, and what names a unit."""
    sd, units = build_sweep(tmp_path / "many", small_spec(), 20, write_partials=False)
    ids = [u.id for u in units]
    shared = next(c for c in "abcdef" if sum(i.startswith(c) for i in ids) > 1)  # a letter: never a position
    line = assert_one_line_error(
        run_cli("logs", str(sd.root), shared), f'unit "{shared}" begins', "give more of the id"
    )
    assert "is not in" not in line and all(i in line for i in ids if i.startswith(shared)), line
    past = str(len(ids))
    line = assert_one_line_error(
        run_cli("logs", str(sd.root), past), f'unit "{past}" is no unit of {sd.root} ({past} units)'
    )
    assert f"0 to {len(ids) - 1}" in line and f"`tilesweep status {sd.root}` shows their ids" in line, line
    one, _ = build_sweep(tmp_path / "one", small_spec(), 1, write_partials=False)
    assert_one_line_error(run_cli("logs", str(one.root), "1"), f'unit "1" is no unit of {one.root} (1 unit)')


def test_logs_of_a_slurm_task_id_prints_the_log_of_the_unit_it_ran_or_the_tasks_own_log(tmp_path: Path) -> None:
    """The job column of ``status`` names SLURM tasks (6343_0): ``logs`` takes one. A task that
    ran one unit prints that unit's log; a whole-node task that ran several prints its own log;
    a task none of the sweep's units ran in is refused in one line saying where task ids are."""
    sd, units = _sweep_with_unit_logs(tmp_path, 3)
    task_log = sd.logs / "6344_0_log.err"
    task_log.write_text("the whole-node task's own line\n")
    sd.record_jobs(
        [{"unit": units[0].id, "executor": "slurm", "job_id": "6343_0", "array_id": "6343", "task": 0}]
        + [
            {"unit": u.id, "executor": "slurm", "job_id": "6344_0", "array_id": "6344", "task": 0, "slot": k}
            | {"units_in_task": 2, "stderr": str(task_log), "log": str(sd.unit_log(u.id))}
            for k, u in enumerate(units[1:])
        ]
    )
    one = run_cli("logs", str(sd.root), "6343_0")
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [f"==> {sd.unit_log(units[0].id)} <==", f"the log of unit {units[0].id}"]
    several = run_cli("logs", str(sd.root), "6344_0")
    assert several.returncode == 0, several.stderr
    assert several.stdout.splitlines() == [f"==> {task_log} <==", "the whole-node task's own line"]
    line = assert_one_line_error(
        run_cli("logs", str(sd.root), "6345_0"), f"6345_0 is no SLURM task of {sd.root}", "job column"
    )
    assert "units.json" not in line, line


def test_each_attempts_log_of_a_unit_run_here_opens_with_a_line_naming_the_unit(tmp_path: Path) -> None:
    """Whoever starts a local worker writes the line first: a run that waits for its workers,
    and the controller of a worker ``resume --no-wait`` leaves running."""
    spec = _replayed(tmp_path, executor={"kind": "local"})
    ran, left = tmp_path / "ran", tmp_path / "left"
    assert run_cli("run", str(spec), "--sweep-dir", str(ran)).returncode == 0
    other = _replayed(tmp_path, "other.json", executor={"kind": "local"}, output=str(tmp_path / "o.json"))
    assert run_cli("plan", str(other), "--sweep-dir", str(left)).returncode == 0  # its own output: nothing reused
    assert run_cli("resume", str(left), "--no-wait").returncode == 0
    assert run_cli("wait", str(left)).returncode == 0
    for sweep in (ran, left):
        (unit,) = [u for u in json.loads(run_cli("status", str(sweep), "--json").stdout)["units"] if u["job_id"]]
        shown = run_cli("logs", str(sweep), unit["id"])
        assert shown.returncode == 0, shown.stderr
        assert f" tilesweep: starting unit {unit['id']} on " in shown.stdout.splitlines()[1], shown.stdout


def test_logs_of_a_job_id_as_squeue_prints_it_is_a_position_first_then_the_sweeps_array_or_merge_job(
    tmp_path: Path,
) -> None:
    """squeue and sacct print an array's id and the final merge job's without a task: a number
    within the unit index is a position, past it one of the sweep's jobs (the merge job: its log;
    an array of one task, numbered with or without its task: that task's unit's log; of several:
    refused naming them); another number is refused naming the jobs the sweep has."""
    sd, units = _sweep_with_unit_logs(tmp_path, 4)
    merge_log = sd.logs / "6350_0_log.err"
    merge_log.write_text("the merge job's line\n")
    tasks = ("6343_0", "6343_1", "6360", "1_0")  # a one-task array's id as submitit returns it, or with its task
    sd.record_jobs(
        [
            {"unit": u.id, "executor": "slurm", "job_id": job, "array_id": job.split("_")[0]}
            for u, job in zip(units, tasks, strict=True)
        ]
        + [{"event": "merge_job", "job_id": "6350", "after": ["6343", "6360", "1"], "stderr": str(merge_log)}]
    )
    for key, unit in (("1", units[1]), ("6360", units[2]), ("1_0", units[3])):  # "1": a position, not array 1
        shown = run_cli("logs", str(sd.root), key)
        assert shown.returncode == 0 and shown.stdout.splitlines()[1] == f"the log of unit {unit.id}", shown.stderr
    merge = run_cli("logs", str(sd.root), "6350")
    assert merge.returncode == 0 and merge.stdout.splitlines() == [f"==> {merge_log} <==", "the merge job's line"]
    assert_one_line_error(
        run_cli("logs", str(sd.root), "6343"),
        f"job 6343 of {sd.root} is an array of 2 tasks (6343_0, 6343_1)",
        f"`tilesweep logs {sd.root} 6343_0`",
    )
    known = "array 6343 (2 tasks: 6343_0 to 6343_1), array 6360 (1 task: 6360), array 1 (1 task: 1_0), merge job 6350"
    line = assert_one_line_error(run_cli("logs", str(sd.root), "6344"), f"6344 is no SLURM job of {sd.root}")
    assert f"whose jobs are {known}; " in line, line
    assert_one_line_error(run_cli("logs", str(sd.root), "6344_0"), f"6344_0 is no SLURM task of {sd.root}", known)
    merge_log.unlink()
    assert_one_line_error(run_cli("logs", str(sd.root), "6350"), f"merge job 6350 of {sd.root} has no log")


def test_logs_of_pending_tasks_as_squeue_shows_them_names_a_task_id_to_give(tmp_path: Path) -> None:
    """squeue shows an array's tasks that wait to start in one row (``6343_[0-2%1]``): none has a
    log yet, and ``logs`` says so in one line naming the tasks and a task id it takes; the pending
    tasks of an array that is not the sweep's are refused naming the jobs the sweep has."""
    sd, units = build_sweep(tmp_path / "sweep", small_spec(), 3)
    sd.record_jobs(
        [
            {"unit": u.id, "executor": "slurm", "job_id": f"6343_{k}", "array_id": "6343", "task": k}
            for k, u in enumerate(units)
        ]
    )
    cases = (("6343_[0-2%1]", "6343_0, 6343_1, 6343_2", "6343_0"), ("6343_[1,2]", "6343_1, 6343_2", "6343_1"))
    for key, named, give in cases:
        line = assert_one_line_error(
            run_cli("logs", str(sd.root), key),
            f"{key} is how squeue shows the tasks of array 6343 that wait to start ({named}), and a task has a log",
            f"give one task's id, as `tilesweep logs {sd.root} {give}`",
        )
        assert "is no unit" not in line, line
    assert_one_line_error(
        run_cli("logs", str(sd.root), "6399_[0-2]"),
        f"6399_[0-2]: array 6399 is no SLURM job of {sd.root}, whose jobs are array 6343 (3 tasks: 6343_0 to 6343_2)",
    )
    here, _ = _sweep_with_unit_logs(tmp_path / "here", 2)  # run here: no SLURM job at all
    assert_one_line_error(
        run_cli("logs", str(here.root), "6343_[0-2]"),
        f"6343_[0-2]: array 6343 is no SLURM job of {here.root}, which never went to SLURM",
    )


def _sweep_with_unit_logs(tmp_path: Path, n: int) -> tuple[SweepDir, list[Unit]]:
    """A sweep of ``n`` units, each with a log saying whose it is."""
    sd, units = build_sweep(tmp_path / "sweep", small_spec(), n)
    for u in units:
        sd.unit_log(u.id).parent.mkdir(parents=True, exist_ok=True)
        sd.unit_log(u.id).write_text(f"the log of unit {u.id}\n")
    return sd, units
