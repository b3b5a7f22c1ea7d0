"""Status, resume planning and the checkpointable task, without a cluster.

The scheduler's answers are built by hand here (their format is pinned against the real
cluster in test_slurm_dispatch.py); resume runs for real with the debug executor.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.control.resume import plan_resume
from orchestrator.control.scheduler import SchedulerView, TaskState, expand_indices, parse_sacct
from orchestrator.control.status import LOST_AFTER_S, format_status, slurm_state, sweep_status
from orchestrator.spec.sections import ExecutorSettings
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import header, record_for
from tests.helpers import assert_one_line_error

from .conftest import run_cli


def test_sacct_rows_expand_array_ranges_and_keep_the_first_word_of_the_state() -> None:
    text = "\n".join(
        [
            "36_0|CANCELLED by 0|0:0",
            "36_1|COMPLETED|0:0",
            "36_[2-5%2]|PENDING|0:0",
            "37|RUNNING|0:0",
            "38_[1,3,5-6]|PENDING|0:0",
            "39_4|FAILED|9:0",
            "40.batch|COMPLETED|0:0",
            "41_[]|PENDING|0:0",
        ]
    )
    rows = {jid: (state, code) for jid, state, code, _, _ in parse_sacct(text)}
    assert rows["36_0"] == ("CANCELLED", "0:0") and rows["36_1"][0] == "COMPLETED"
    assert [j for j in rows if j.startswith("36_")] == ["36_0", "36_1", "36_2", "36_3", "36_4", "36_5"]
    assert rows["37"][0] == "RUNNING" and rows["39_4"] == ("FAILED", "9:0")
    assert sorted(j for j in rows if j.startswith("38_")) == ["38_1", "38_3", "38_5", "38_6"]
    assert "40.batch" not in rows and "40" not in rows
    assert expand_indices("0-2%4") == [0, 1, 2] and expand_indices("7") == [7] and expand_indices("x") == []
    # -D -o ...,ElapsedRaw,AllocTRES: every run of a task, with its GPUs (a typed GPU is listed twice)
    runs = list(
        parse_sacct(
            "47_0|REQUEUED|0:0|90|billing=4,cpu=4,gres/gpu=4,gres/gpu:h100=4,node=1\n"
            "47_0|COMPLETED|0:0|30|billing=4,cpu=4,gres/gpu=4,gres/gpu:h100=4,node=1\n"
            "48|COMPLETED|0:0|600|billing=1,cpu=1,node=1"
        )
    )
    assert runs == [
        ("47_0", "REQUEUED", "0:0", 90, 4),
        ("47_0", "COMPLETED", "0:0", 30, 4),
        ("48", "COMPLETED", "0:0", 600, 0),
    ]


def test_gpu_hours_are_left_out_until_sacct_has_a_row_for_every_array_of_the_sweep() -> None:
    """A sum without an array sacct does not know yet (slurmdbd not yet told of a task that just
    ended) would be too low, and a document merged then would keep it: no figure is better."""
    view = SchedulerView(asked=True, sacct_ok=True, gpu_seconds={"47": 4 * 120.0, "52": 0.0})
    assert view.gpu_hours(["47_0", "47_1"]) == round(480 / 3600, 4)
    assert view.gpu_hours(["47_0", "52_3"]) == round(480 / 3600, 4)  # 52 pending: known, nothing used yet
    assert view.gpu_hours(["47_0", "53_0"]) is None
    assert SchedulerView(asked=True, sacct_ok=False, gpu_seconds={"47": 480.0}).gpu_hours(["47_0"]) is None


def _view(**states: TaskState) -> SchedulerView:
    return SchedulerView(
        {k.replace("j", "", 1): v for k, v in states.items()}, asked=True, squeue_ok=True, sacct_ok=True
    )


@pytest.mark.parametrize(
    "task, mtime_after, expected",
    [
        (TaskState("PENDING", "squeue", "JobArrayTaskLimit"), False, ("pending", "JobArrayTaskLimit")),
        (TaskState("PENDING", "squeue", "BeginTime"), True, ("requeued", "BeginTime")),
        (TaskState("REQUEUED", "sacct"), True, ("requeued", "REQUEUED")),
        (TaskState("RUNNING", "squeue", "None"), True, ("running", None)),
        (TaskState("COMPLETING", "squeue"), True, ("running", "COMPLETING")),
        (TaskState("CANCELLED", "sacct"), True, ("cancelled", None)),
        (TaskState("TIMEOUT", "sacct"), True, ("timed out", "TIMEOUT")),
        (TaskState("FAILED", "sacct", exit_code="9:0"), True, ("failed", "FAILED (exit 9:0)")),
        (
            TaskState("OUT_OF_MEMORY", "sacct", exit_code="0:125"),
            True,
            ("failed", "out of memory (SLURM ended the task at its memory limit: raise executor.mem_gb)"),
        ),
        (TaskState("PREEMPTED", "sacct"), True, ("cancelled", "PREEMPTED")),
    ],
)
def test_slurm_states_map_to_unit_states(task: TaskState, mtime_after: bool, expected: tuple[str, str | None]) -> None:
    now = time.time()
    job = {"job_id": "36_1", "submitted_ts": now - 100}
    view = _view(j36_1=task)
    assert slurm_state(job, view, now - 50 if mtime_after else None, {}, now, 3) == expected


def test_a_unit_of_a_running_whole_node_task_that_no_gpu_took_yet_is_pending() -> None:
    now = time.time()
    job = {"job_id": "36_1", "submitted_ts": now - 100, "units_in_task": 8}
    view = _view(j36_1=TaskState("RUNNING", "squeue", "None"))
    assert slurm_state(job, view, None, {}, now, 0) == (
        "pending",
        "its task is running; it waits for one of the task's GPUs",
    )
    assert slurm_state(job, view, now - 50, {}, now, 0) == ("running", None)  # its log written since: taken


def test_a_job_in_neither_squeue_nor_sacct_is_pending_while_young_then_gone() -> None:
    now = time.time()
    view = _view()
    young = {"job_id": "36_5", "submitted_ts": now - 5}
    old = {"job_id": "36_5", "submitted_ts": now - LOST_AFTER_S - 5}
    assert slurm_state(young, view, None, {}, now, 0)[0] == "pending"
    state, detail = slurm_state(old, view, None, {}, now, 0)
    assert state == "cancelled" and "neither squeue nor sacct" in (detail or "")
    # our own cancel record wins over whatever the scheduler says
    running = _view(j36_5=TaskState("RUNNING", "squeue"))
    assert slurm_state(old, running, None, {"36": now - 1}, now, 0)[0] == "cancelled"
    # SLURM not asked: a guess from the partial, said so
    assert slurm_state(old, None, None, {}, now, 2) == ("running", "SLURM not asked; state guessed from the partial")


def test_a_task_of_a_known_array_in_neither_squeue_nor_sacct_is_cancelled_at_once_unless_it_ran() -> None:
    """A pending task cancelled on its own leaves no record: once its array is known, it is
    cancelled now, not a minute later; a task that ran may only be missing from sacct's lag."""
    now = time.time()
    view = _view(j36_0=TaskState("RUNNING", "squeue"))
    view.arrays_seen = {"36"}
    young = {"job_id": "36_5", "submitted_ts": now - 2}
    state, detail = slurm_state(young, view, None, {}, now, 0)
    assert state == "cancelled" and "cancelled while pending" in (detail or "")
    ran = slurm_state(young, view, now - 1, {}, now, 1)  # its log was written after submission
    assert ran == ("running", "left squeue moments ago; not in sacct yet")
    view.squeue_ok = False  # nothing is known to have left a queue that could not be read
    assert slurm_state(young, view, now - 1, {}, now, 1)[1] == "squeue could not be asked; not in sacct yet"
    # sacct still lists it in its array's pending range for a few seconds: squeue, which lists
    # every pending task, does not: it is gone
    lagging = _view(j36_0=TaskState("RUNNING", "squeue"), j36_5=TaskState("PENDING", "sacct"))
    lagging.arrays_seen = {"36"}
    assert slurm_state(young, lagging, None, {}, now, 0)[0] == "cancelled"
    unknown = _view()  # the array itself not in squeue or sacct yet: too early to tell
    assert slurm_state(young, unknown, None, {}, now, 0) == ("pending", "not yet in squeue or sacct")


def _sweep(tmp_path: Path, write_spec: Callable[..., Path], units: int = 2, **over: Any) -> SweepDir:
    spec = write_spec(**over)
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--units", str(units), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    return SweepDir.open(sweep)


def _fake_partial(sd: SweepDir, uid: str, n_records: int, n_errors: int = 0) -> None:
    """A worker's partial of the unit's first ``n_records`` items (the first ``n_errors`` failed)."""
    rng = random.Random(0)
    lines = [json.dumps(header(sd, uid, 1))]
    for k, it in enumerate(sd.unit_items(uid)[:n_records]):
        rec = {**it.record_fields(), "error": "RuntimeError: boom"} if k < n_errors else record_for(it, rng)
        lines.append(json.dumps({"start": it.id, "attempt": 1}))
        lines.append(json.dumps({"id": it.id, "attempt": 1, "record": rec}))
    sd.partial_path(uid).write_text("\n".join(lines) + "\n")


def _three_units_on_slurm(tmp_path: Path, write_spec: Callable[..., Path]) -> tuple[SweepDir, list[str], SchedulerView]:
    """A sweep of three units submitted as array 50 (and merge job 51) ten minutes ago: the
    first has one record, an error, and failed; the second one record and runs; the third waits."""
    sd = _sweep(tmp_path, write_spec, units=3)
    units = [u["id"] for u in sd.unit_index()]
    _fake_partial(sd, units[0], 1, n_errors=1)
    _fake_partial(sd, units[1], 1)
    now = time.time()
    sd.record_jobs(
        [
            {
                "unit": u,
                "executor": "slurm",
                "job_id": f"50_{k}",
                "array_id": "50",
                "task": k,
                "submitted_ts": now - 600,
                "stderr": f"/logs/50_{k}_0_log.err",
            }
            for k, u in enumerate(units)
        ]
    )
    sd.record_jobs([{"event": "merge_job", "job_id": "51", "submitted_ts": now - 600}])
    view = _view(
        j50_0=TaskState("FAILED", "sacct", exit_code="1:0"),
        j50_1=TaskState("RUNNING", "squeue"),
        j50_2=TaskState("PENDING", "squeue", "Priority"),
        j51=TaskState("PENDING", "squeue", "Dependency"),
    )
    return sd, units, view


def test_status_counts_partials_and_takes_states_from_the_scheduler_view(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd, units, view = _three_units_on_slurm(tmp_path, write_spec)
    st = sweep_status(sd, view=view)
    by = {u.id: u for u in st.units}
    assert by[units[1]].state == "running" and by[units[1]].log is None
    assert by[units[2]].state == "pending" and by[units[2]].detail == "Priority"
    assert st.done == 2 and st.errors == 1 and not st.complete and not st.settled
    assert st.merge_jobs[0]["state"] == "PENDING" and st.eta_s() is not None
    text = format_status(st)
    assert "2/" in text.splitlines()[0] and "final merge: job 51 pending" in text
    doc = st.to_json()
    assert doc["states"] == {"running": 1, "pending": 1, "failed": 1} and len(doc["units"]) == 3


def test_a_merge_job_cancelled_before_it_started_names_no_log_it_never_wrote(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd, _, view = _three_units_on_slurm(tmp_path, write_spec)
    log = sd.logs / "51_0_log.err"
    sd.record_jobs([{"event": "merge_job", "job_id": "52", "submitted_ts": time.time(), "stderr": str(log)}])
    view.states["52"] = TaskState("CANCELLED", "sacct")
    assert "final merge: job 52 cancelled" in format_status(sweep_status(sd, view=view)).splitlines()[-1]
    assert "log:" not in format_status(sweep_status(sd, view=view)).splitlines()[-1]
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("cancelled by user\n")
    assert f"final merge: job 52 cancelled  log: {log}" in format_status(sweep_status(sd, view=view))


def test_a_failed_unit_says_its_workers_own_reason_once_its_log_has_one(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd, units, view = _three_units_on_slurm(tmp_path, write_spec)
    failed = sweep_status(sd, view=view).units[0]
    # the task's log does not exist: no path shown, and the reason is sacct's
    assert failed.state == "failed" and failed.log is None and failed.errors == 1
    assert failed.detail == "FAILED (exit 1:0): exit code 1"
    # the unit's log ends with its worker's own reason: that is what status says
    unit_log = sd.unit_log(units[0])
    unit_log.parent.mkdir(parents=True)
    unit_log.write_text(
        "2026-01-01 12:00:00,000 jobs.worker: unit x: 1/3 ok\n"
        "2026-01-01 12:00:01,000 orchestrator.control.dispatch.unit_worker: "
        f"tilesweep: unit {units[0]} failed: this task was given GPU(s) "
        "CUDA_VISIBLE_DEVICES=0 but jax sees none\n"
    )
    job = {"unit": units[0], "executor": "slurm", "job_id": "50_0", "array_id": "50", "task": 0}
    sd.record_jobs([{**job, "submitted_ts": time.time() - 600, "log": str(unit_log)}])
    st = sweep_status(sd, view=view)
    failed = st.units[0]
    assert failed.state == "failed" and failed.log == str(unit_log)
    assert failed.detail == "this task was given GPU(s) CUDA_VISIBLE_DEVICES=0 but jax sees none"
    text = format_status(st)
    assert f"log: {unit_log}" in text and "jax sees none" in text


def test_status_without_slurm_queries_reads_the_sweep_directory_alone(
    tmp_path: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sd, _, _ = _three_units_on_slurm(tmp_path, write_spec)
    monkeypatch.setenv("TILESWEEP_SLURM_QUERIES", "0")
    st = sweep_status(sd)
    assert st.scheduler is not None and "not asked" in st.scheduler
    assert {u.state for u in st.units} == {"running", "pending"}


def test_units_never_submitted_and_units_that_cannot_start_are_told_apart(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd = _sweep(tmp_path, write_spec, units=3)
    units = [u["id"] for u in sd.unit_index()]
    # nothing was submitted: wait refuses at once instead of waiting for ever
    assert_one_line_error(
        run_cli("wait", str(sd.root), "--interval", "0.1"), "3 units", "never submitted", f"tilesweep resume {sd.root}"
    )
    now = time.time()
    sd.record_jobs(
        [
            {
                "unit": u,
                "executor": "slurm",
                "job_id": f"60_{k}",
                "array_id": "60",
                "task": k,
                "submitted_ts": now - 600,
            }
            for k, u in enumerate(units[:2])
        ]
    )
    view = _view(
        j60_0=TaskState("PENDING", "squeue", "PartitionTimeLimit"), j60_1=TaskState("PENDING", "squeue", "Priority")
    )
    by = {u.id: u for u in sweep_status(sd, view=view).units}
    stuck, waiting, never = by[units[0]], by[units[1]], by[units[2]]
    assert stuck.state == "pending" and stuck.stuck and stuck.submitted and "cannot start" in (stuck.detail or "")
    assert waiting.state == "pending" and not waiting.stuck and waiting.submitted and waiting.detail == "Priority"
    assert never.state == "pending" and not never.stuck and not never.submitted
    # resume leaves the two submitted units alone (they may still start) and takes the third
    plan = plan_resume(sd, sweep_status(sd, view=view))
    assert plan.active == sorted(units[:2])
    assert {it.id for it in plan.missing} == {it.id for it in sd.unit_items(units[2])}


def test_resume_submits_only_missing_items_and_counts_deaths_across_units(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    from jobs.worker import run_unit

    # debug executor: resume runs the new units in its own process; a config that killed
    # one worker is given up on (max_config_attempts 1) even though it moves to a new unit
    sd = _sweep(
        tmp_path, write_spec, units=2, executor={"kind": "debug", "max_config_attempts": 1}, compile={"workers": 1}
    )
    first, second = [u["id"] for u in sd.unit_index()]
    items = [it.id for it in sd.unit_items(second)]
    assert len(items) >= 3
    partial = sd.partial_path(second)
    summary = run_unit(str(sd.root), second, stop_check=lambda: partial.read_text().count('"record"') >= 1)
    assert summary["stopped"] and summary["done"] >= 1
    partial_lines = sd.partial_path(second).read_text().splitlines()
    recorded = {json.loads(line)["id"] for line in partial_lines if '"record"' in line}
    dead = next(i for i in items if i not in recorded)
    with open(sd.partial_path(second), "a") as f:  # a worker that died with `dead` alone in flight
        f.write(json.dumps({"start": dead, "attempt": 1, "alone": True}) + "\n")
    # a partial of another environment is refused, naming the file
    foreign = tmp_path / "foreign"
    shutil.copytree(sd.root, foreign)
    header = json.loads(sd.partial_path(second).read_text().splitlines()[0])
    header["header"]["env"] = {**header["header"]["env"], "jax": "0.0.1"}
    (foreign / "partials" / f"{first}.jsonl").write_text(json.dumps(header) + "\n")
    r = run_cli("resume", str(foreign))
    assert_one_line_error(r, "another environment", f"{first}.jsonl")
    # the real resume
    r = run_cli("resume", str(sd.root))
    assert r.returncode == 0, r.stderr
    events = [e for e in sd.job_history() if e.get("event") == "resume"]
    assert len(events) == 1 and second in events[0]["replaces"]
    resubmitted = [it.id for u in events[0]["units"] for it in sd.unit_items(u)]
    missing = {it.id for u in (first, second) for it in sd.unit_items(u)} - recorded
    assert sorted(resubmitted) == sorted(missing)  # every missing item once, nothing recorded again
    st = sweep_status(sd)
    assert st.complete and st.done == st.planned, format_status(st)
    assert run_cli("merge", str(sd.root)).returncode == 0
    doc = json.loads(sd.output.read_text())
    crashed = [r for r in doc["results"] if "WorkerCrashed" in r.get("error", "")]
    assert len(crashed) == 1 and len(doc["results"]) == st.planned
    r = run_cli("resume", str(sd.root))
    assert r.returncode == 0 and "nothing to resubmit" in r.stdout
    # --retry-errors crashed redoes it afresh (it was no killer): the new record supersedes the error
    errors_before = st.errors
    r = run_cli("resume", str(sd.root), "--retry-errors", "crashed")
    assert r.returncode == 0 and "1 crashed error record is redone; 1 new unit" in r.stdout, r.stdout + r.stderr
    st = sweep_status(sd)
    assert st.complete and st.done == st.planned and st.errors == errors_before - 1, format_status(st)
    assert run_cli("merge", str(sd.root)).returncode == 0
    doc = json.loads(sd.output.read_text())
    assert len(doc["results"]) == st.planned and not any("WorkerCrashed" in r.get("error", "") for r in doc["results"])
    r = run_cli("resume", str(sd.root), "--retry-errors", "crashed")
    assert r.returncode == 0 and "no crashed error record to retry; nothing to resubmit" in r.stdout
    r = run_cli("resume", str(sd.root), "--retry-errors", "all")
    assert r.returncode == 0 and "and no error record to retry; nothing to resubmit" in r.stdout, r.stdout


def test_resume_refuses_another_spec(tmp_path: Path, write_spec: Callable[..., Path]) -> None:
    sd = _sweep(tmp_path, write_spec)
    other = write_spec("other.json", repeats=7)
    r = run_cli("resume", str(sd.root), "--spec", str(other))
    assert_one_line_error(r, "not the spec")


def test_executor_settings_become_submitit_parameters() -> None:
    from orchestrator.control.dispatch import executor_parameters, grace_s

    s = ExecutorSettings(kind="slurm", slurm_partition="gpu", gpus_per_node=1, max_requeues=5, merge_partition="cpu")
    params = executor_parameters(s)
    assert params == {"slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min": 60}
    assert grace_s(s) == 30.0 and grace_s(ExecutorSettings(slurm_signal_delay_s=20)) == 10.0
    assert grace_s(ExecutorSettings(slurm_signal_delay_s=0)) == 5.0  # no warning asked for: the shortest grace


def test_unit_task_checkpoints_the_same_call_and_requeues_when_stuck() -> None:
    from submitit.helpers import DelayedSubmission

    from orchestrator.control.dispatch import UnitTask
    from orchestrator.control.dispatch.node import TaskWorkers
    from orchestrator.control.dispatch.tasks import task_units

    task = UnitTask(grace_s=0.2)
    again = task.checkpoint("/sweep", ["abc", "def"], {"abc": {"x": 1}})
    assert isinstance(again, DelayedSubmission) and isinstance(again.function, UnitTask)
    assert again.args == ("/sweep", ["abc", "def"], {"abc": {"x": 1}}) and again.function.grace_s == 0.2
    # a task pickled when a task held one unit still runs
    assert task_units("abc", {"x": 1}) == (["abc"], {"abc": {"x": 1}})

    requeued = []
    old = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGALRM, signal.SIGTERM)}
    signal.signal(signal.SIGUSR2, lambda signum, frame: requeued.append(signum))  # stands for submitit's handler
    try:
        task._workers = TaskWorkers("/sweep", [], {}, None)
        task._install_handlers()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert task._warned and not requeued  # the warning only asks the workers to stop
        end = time.monotonic() + 60  # the workers never reach a stop: requeued once the grace is over
        while not requeued and time.monotonic() < end:
            time.sleep(0.01)  # the grace's alarm runs its handler between two of these
        assert requeued == [signal.SIGUSR2]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in old.items():
            signal.signal(s, h)
