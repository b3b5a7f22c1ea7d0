"""What ``tilesweep logs`` takes of the job ids squeue and sacct print for a sweep's jobs on the
real local SLURM cluster: an array's id (its one task's log, or the tasks of several named to pick
from), the final merge job's id (its log), an array task's own id (sacct's JobIDRaw: its log, or,
SLURM not asked, a refusal saying so); and the id of a job that is not the sweep's, refused naming
those it knows. The task's log counts its
units and workers as a line says them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, replay_specs
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import cli, jobs

pytestmark = pytest.mark.slurm

EXECUTOR = {"kind": "slurm", "slurm_partition": "cpu", "gpus_per_node": 0, "timeout_min": 5}


def _submitted(tmp_path: Path, name: str, units: int, **executor: object) -> tuple[Path, str]:
    """A replay of three configs submitted in ``units`` units, each a task of one array; the
    sweep directory and what ``submit -v`` said."""
    spec = replay_specs(tmp_path, lambda k: 0.0, "slurm")["instant"]
    data = json.loads(spec.read_text())
    data.update(output=str(tmp_path / f"{name}.results.json"), executor={**EXECUTOR, **executor})
    spec.write_text(json.dumps(data))
    sweep = tmp_path / name
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", str(units), "-v")
    assert r.returncode == 0, r.stderr
    return sweep, r.stderr


def _sacct_ids(*job_ids: str) -> list[str]:
    r = subprocess.run(
        ["sacct", "-X", "-n", "-o", "JobID%30", "-j", ",".join(job_ids)], capture_output=True, text=True, check=True
    )
    return r.stdout.split()


def _raw_ids(array: str) -> dict[str, str]:
    """Each task of ``array`` -> the job id SLURM gave it as it started (sacct's JobIDRaw)."""
    r = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,JobIDRaw", "-j", array], capture_output=True, text=True, check=True
    )
    return dict(line.split("|") for line in r.stdout.split())


def test_logs_takes_the_ids_squeue_and_sacct_print_of_the_sweeps_arrays_and_merge_job(tmp_path: Path) -> None:
    require_cluster()
    sweep, _ = _submitted(tmp_path, "three", 3, merge_partition="cpu")
    entries = jobs(sweep)
    (array,) = {e["array_id"] for e in entries if "unit" in e}
    (merge,) = [e for e in entries if e.get("event") == "merge_job"]
    merge_log = Path(merge["stderr"])
    poll(lambda: merge_log.is_file() and "merged 3 records" in merge_log.read_text(), 300, "the final merge job")
    tasks = [f"{array}_{k}" for k in range(3)]
    poll(lambda: set(tasks + [merge["job_id"]]) <= set(_sacct_ids(array, merge["job_id"])), 60, "sacct's record")

    shown = cli("logs", str(sweep), tasks[0])  # a unit of one item
    assert shown.returncode == 0 and " done: 1 record (0 errors) in " in shown.stdout, shown.stdout + shown.stderr
    shown = cli("logs", str(sweep), merge["job_id"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"==> {merge_log} <==" and "merged 3 records" in shown.stdout
    raw = {t: r for t, r in _raw_ids(array).items() if r != array}  # the task that started last keeps the array's id
    assert len(raw) == 2, raw
    t, r = next(iter(raw.items()))  # a task's own id (sacct -o JobIDRaw, squeue %A): that task's log
    by_raw, by_task = cli("logs", str(sweep), r), cli("logs", str(sweep), t)
    assert by_raw.returncode == 0 and by_raw.stdout == by_task.stdout, by_raw.stderr
    unasked = cli("logs", str(sweep), r, env={"TILESWEEP_SLURM_QUERIES": "0"})  # the same id, SLURM not asked
    assert_one_line_error(
        unasked,
        f"SLURM was not asked whether {r} is a task's own job id (sacct's JobIDRaw), as TILESWEEP_SLURM_QUERIES=0 "
        "says: run it again without TILESWEEP_SLURM_QUERIES=0 to ask",
    )

    assert_one_line_error(
        cli("logs", str(sweep), array),
        f"job {array} of {sweep} is an array of 3 tasks ({', '.join(tasks)})",
        f"`tilesweep logs {sweep} {tasks[0]}`",
    )
    known = f"array {array} (3 tasks: {tasks[0]} to {tasks[-1]}), merge job {merge['job_id']}"
    other = str(int(merge["job_id"]) + 100000)  # no job of this sweep, and past its unit index
    assert_one_line_error(cli("logs", str(sweep), other), f"{other} is no SLURM job of {sweep}, whose jobs are {known}")
    assert_one_line_error(cli("logs", str(sweep), f"{other}_0"), f"{other}_0 is no SLURM task of {sweep}", known)

    # an array of one task: its id prints that task's unit's log, and with --task the task's own
    one, said = _submitted(tmp_path, "one", 1, merge_job=False)
    assert "submitted 1 unit in 1 task as" in said, said
    (entry,) = [e for e in jobs(one) if "unit" in e]
    unit_log = Path(entry["log"])
    poll(lambda: unit_log.is_file() and "tilesweep: starting unit" in unit_log.read_text(), 300, "the unit's start")
    shown = cli("logs", str(one), entry["array_id"])
    assert shown.returncode == 0 and shown.stdout.splitlines()[0] == f"==> {unit_log} <==", shown.stdout + shown.stderr
    theirs, r = next(iter(raw.items()))  # a task of another sweep's array, by its own id
    assert_one_line_error(
        cli("logs", str(one), r),
        f"{r} is the job id SLURM gave task {theirs} (sacct's JobIDRaw), no task of {one}, whose jobs are array",
    )
    task_log = Path(entry["stderr"])
    poll(lambda: task_log.is_file() and "at a time" in task_log.read_text(), 300, "the task's first line")
    task = cli("logs", str(one), entry["array_id"], "--task")
    assert task.returncode == 0 and "1 unit, 1 worker at a time (no GPU)" in task.stdout, task.stdout
