"""Status, resume planning and the checkpointable task, without a cluster.

The scheduler's answers are built by hand here (their format is pinned against the real
cluster in test_slurm_dispatch.py); resume runs for real with the debug executor.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.control.resume import plan_resume
from orchestrator.control.scheduler import SchedulerView, TaskState
from orchestrator.control.status import format_status, sweep_status
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import header, record_for
from tests.helpers import assert_one_line_error, scheduler_view

from .conftest import run_cli


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
    view = scheduler_view(
        j50_0=TaskState("FAILED", "sacct", exit_code="1:0"),
        j50_1=TaskState("RUNNING", "squeue"),
        j50_2=TaskState("PENDING", "squeue", "Priority"),
        j51=TaskState("PENDING", "squeue", "Dependency"),
    )
    return sd, units, view


def test_a_unit_whose_requeues_ran_out_names_the_fixes_of_a_timeout_and_max_requeues(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """submitit's last word on a task whose time limit came with no requeue left ("timed-out too
    many times": the task FAILED): its unit names the fixes of a TIMEOUT (a longer
    executor.timeout_min from the spec file and `resume --spec`, or more units) and
    executor.max_requeues, in one sentence."""
    executor = {"kind": "slurm", "timeout_min": 20, "max_requeues": 2}
    sd = _sweep(tmp_path, write_spec, units=1, executor=executor)
    (unit,) = [u["id"] for u in sd.unit_index()]
    err = tmp_path / "50_0_0_log.err"
    err.write_text(
        'Traceback (most recent call last):\n  File "submitit/core/submission.py", line 1, in <module>\n'
        "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many times.\n"
    )
    job = {"unit": unit, "executor": "slurm", "job_id": "50_0", "array_id": "50", "task": 0, "timeout_min": 20}
    sd.record_jobs([{**job, "submitted_ts": time.time() - 3600, "stderr": str(err)}])
    st = sweep_status(sd, view=scheduler_view(j50_0=TaskState("FAILED", "sacct", exit_code="1:0")))
    (u,) = st.units
    spec = tmp_path / "spec.json"
    assert u.state == "failed" and u.detail == (
        "its task ran out of its time limit (executor.timeout_min: 20 min) with no requeue left "
        "(executor.max_requeues: 2); its finished records are kept: raise executor.timeout_min (or "
        f"executor.max_requeues) in {spec}, then `tilesweep resume {sd.root} --spec {spec}`, or spread what is "
        f"left over more units: `tilesweep resume {sd.root} --units N`"
    ), u.detail
    assert u.detail in format_status(st)


def test_a_unit_whose_requeues_ran_out_names_those_its_task_was_submitted_with(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """The time limit and requeues a unit out of requeues names are those its task was submitted
    with (its jobs.jsonl line), not the sweep's executor settings, which a later `resume --spec`
    may have changed (here to 60 min and 5 requeues)."""
    sd = _sweep(tmp_path, write_spec, units=1, executor={"kind": "slurm", "timeout_min": 60, "max_requeues": 5})
    (unit,) = [u["id"] for u in sd.unit_index()]
    err = tmp_path / "50_0_0_log.err"
    err.write_text("submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many times.\n")
    job = {"unit": unit, "executor": "slurm", "job_id": "50_0", "array_id": "50", "task": 0}
    sd.record_jobs([{**job, "timeout_min": 20, "max_requeues": 0, "submitted_ts": time.time(), "stderr": str(err)}])
    st = sweep_status(sd, view=scheduler_view(j50_0=TaskState("FAILED", "sacct", exit_code="1:0")))
    (u,) = st.units
    assert u.state == "failed" and (u.detail or "").startswith(
        "its task ran out of its time limit (executor.timeout_min: 20 min) with no requeue left "
        "(executor.max_requeues: 0); its finished records are kept: "
    ), u.detail


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
    merges = f"`tilesweep wait {sd.root}` or `tilesweep merge {sd.root}` merges"  # two units wait or run on
    said = f"final merge: job 52 cancelled, so no merge job follows the units; once they end, {merges}"
    (merge,) = [line for line in format_status(sweep_status(sd, view=view)).splitlines() if "final merge:" in line]
    assert merge == said, merge
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("cancelled by user\n")
    assert f"{said}  log: {log}" in format_status(sweep_status(sd, view=view)).splitlines()


def test_a_failed_unit_says_its_workers_own_reason_once_its_log_has_one(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd, units, view = _three_units_on_slurm(tmp_path, write_spec)
    failed = sweep_status(sd, view=view).units[0]
    # the task's log does not exist: no path shown, the reason is sacct's, and what a log never
    # written means (the task could not write into the sweep directory)
    assert failed.state == "failed" and failed.log is None and failed.errors == 1
    assert failed.detail is not None and failed.detail.startswith("FAILED (exit 1:0): exit code 1; it wrote no log (")
    assert "its node could not write into the sweep directory" in failed.detail
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
    assert f"items done ({st.errors} error record{'s' if st.errors != 1 else ''})" in text.splitlines()[0]


def test_status_without_slurm_queries_reads_the_sweep_directory_alone(
    tmp_path: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sd, _, _ = _three_units_on_slurm(tmp_path, write_spec)
    monkeypatch.setenv("TILESWEEP_SLURM_QUERIES", "0")
    st = sweep_status(sd)
    assert st.scheduler is not None and "not asked" in st.scheduler
    assert {u.state for u in st.units} == {"running", "pending"}
    # its final merge job is not said to be missing from squeue and sacct, which nobody asked
    assert format_status(st).splitlines()[-1] == "final merge: job 51 (SLURM not asked)"


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
    view = scheduler_view(
        j60_0=TaskState("PENDING", "squeue", "PartitionTimeLimit"), j60_1=TaskState("PENDING", "squeue", "Priority")
    )
    by = {u.id: u for u in sweep_status(sd, view=view).units}
    stuck, waiting, never = by[units[0]], by[units[1]], by[units[2]]
    assert stuck.state == "pending" and stuck.stuck and stuck.submitted and "cannot start" in (stuck.detail or "")
    assert waiting.state == "pending" and not waiting.stuck and waiting.submitted and waiting.detail == "Priority"
    assert never.state == "pending" and not never.stuck and not never.submitted
    # resume leaves the two submitted units alone (they may still start) and takes the third as planned
    plan = plan_resume(sd, sweep_status(sd, view=view))
    assert plan.active == sorted(units[:2])
    assert plan.missing == [] and plan.as_planned == {units[2]: len(sd.unit_items(units[2]))}


def test_a_sweep_planned_and_never_run_exits_1_and_names_resume_until_it_runs(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """Units never started, that nothing will start, are work left to a user's command, as much
    as units that ended unfinished: status exits 1 (text and --json alike), and 0 once it ran."""
    sd = _sweep(tmp_path, write_spec, units=2, modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    assert run_cli("status", str(sd.root), "--json").returncode == 1
    r = run_cli("status", str(sd.root))
    assert r.returncode == 1 and r.stdout.splitlines()[0].endswith(", incomplete"), r.stdout
    assert r.stdout.splitlines()[-1] == f"to redo the missing items: tilesweep resume {sd.root}", r.stdout
    assert run_cli("resume", str(sd.root)).returncode == 0
    r = run_cli("status", str(sd.root))
    assert r.returncode == 0 and r.stdout.splitlines()[0].endswith(", complete"), r.stdout


def test_a_unit_whose_worker_died_in_a_running_whole_node_task_is_failed_at_once(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """The task goes on with its other units and wrote why the worker died in the unit's log:
    status says failed, with that reason, while the task runs, not once it ends."""
    from orchestrator.control.why import failure_line

    sd = _sweep(tmp_path, write_spec, units=2)
    dead, alive = [u["id"] for u in sd.unit_index()]
    now = time.time()
    for uid in (dead, alive):
        _fake_partial(sd, uid, 1)
    log = sd.unit_log(dead)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("started\n" + failure_line(dead, "killed by signal 9 (SIGKILL)") + "\n")
    sd.record_jobs(
        [
            {"unit": u, "executor": "slurm", "job_id": "60_0", "array_id": "60", "task": 0, "slot": k}
            | {"units_in_task": 2, "submitted_ts": now - 600, "log": str(sd.unit_log(u))}
            for k, u in enumerate((dead, alive))
        ]
    )
    st = sweep_status(sd, view=scheduler_view(j60_0=TaskState("RUNNING", "squeue")))
    by = {u.id: u for u in st.units}
    assert by[dead].state == "failed" and by[dead].detail == "killed by signal 9 (SIGKILL)", format_status(st)
    assert by[dead].log == str(log) and by[alive].state == "running"
    cancelled = sweep_status(sd, view=scheduler_view(j60_0=TaskState("CANCELLED", "sacct")))  # the task, later
    assert {u.id: u.state for u in cancelled.units} == {dead: "failed", alive: "cancelled"}


def test_a_sweep_whose_final_merge_job_refused_is_complete_but_not_merged_until_a_merge(tmp_path: Path) -> None:
    """Two sweeps that write one output, submitted before either merged: the second's final merge
    job refuses the first's records. Its status, ``ls`` and exit code say the document was not
    written, until a merge of the sweep writes it."""
    from orchestrator.store.final_merge import record_final_merge
    from orchestrator.store.synthetic import build_sweep, small_spec

    sd, _ = build_sweep(tmp_path / "sweeps" / "second", small_spec(n_seqs=1), 2, output=tmp_path / "race.json")
    sd.record_jobs([{"event": "merge_job", "job_id": "998", "submitted_ts": time.time()}])
    refused = f"{tmp_path / 'race.json'} holds 1 record that is not this sweep's"
    record_final_merge(sd, {"job_id": "998", "ok": False, "error": refused})
    r = run_cli("status", str(sd.root))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "complete, not merged (its final merge job refused)" in r.stdout.splitlines()[0], r.stdout
    assert f"final merge: job 998 failed: {refused}" in r.stdout
    assert "not merged" in run_cli("ls", str(tmp_path / "sweeps")).stdout
    assert run_cli("merge", str(sd.root)).returncode == 0
    r = run_cli("status", str(sd.root))
    assert r.returncode == 0 and "complete," not in r.stdout.splitlines()[0], r.stdout


@pytest.mark.parametrize("ended", ["CANCELLED", "FAILED", "TIMEOUT"])
def test_a_sweep_whose_final_merge_job_ended_before_merging_is_not_merged_until_a_merge(
    tmp_path: Path, ended: str
) -> None:
    """A final merge job scancelled (or failed, or out of time) before it merged leaves a
    complete sweep without its document: status says so and how to write it, until a merge of
    the sweep does. It had said "complete" (exit 0) with no document anywhere."""
    from orchestrator.store.synthetic import build_sweep, small_spec

    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    sd.record_jobs([{"event": "merge_job", "job_id": "998", "submitted_ts": time.time()}])
    st = sweep_status(sd, view=scheduler_view(j998=TaskState(ended, "sacct")))
    text = format_status(st).splitlines()
    said = ended.lower()
    assert text[0].endswith(f"complete, not merged (its final merge job {said})"), text
    assert text[-1] == f"to write the results document: tilesweep merge {sd.root}", text
    assert st.unmerged == f"its final merge job {said}"  # status exits 1
    assert run_cli("merge", str(sd.root)).returncode == 0
    merged = sweep_status(sd, view=scheduler_view(j998=TaskState(ended, "sacct")))
    assert merged.unmerged is None and format_status(merged).splitlines()[0].endswith(", complete")


@pytest.mark.parametrize("state", ["PENDING", "RUNNING"])
def test_a_complete_sweep_whose_final_merge_job_is_to_run_names_it_not_a_merge_by_hand(
    tmp_path: Path, state: str
) -> None:
    from orchestrator.store.synthetic import build_sweep, small_spec

    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    sd.record_jobs([{"event": "merge_job", "job_id": "998", "submitted_ts": time.time()}])
    st = sweep_status(sd, view=scheduler_view(j998=TaskState(state, "squeue")))
    head = format_status(st).splitlines()[0]
    assert head.endswith(f"complete, not merged yet: its final merge job 998 ({state.lower()}) writes {sd.output}")
    assert "tilesweep merge" not in format_status(st) and not st.merge_left  # status exits 0
    assert st.to_json()["merged"] is False and st.to_json()["merging"] == f"its final merge job 998 ({state.lower()})"


def test_unit_lines_keep_their_columns_whatever_a_units_state_says() -> None:
    from orchestrator.control.status_model import SweepStatus, UnitStatus

    st = SweepStatus(sweep_dir="s", planned=30)
    st.units = [
        UnitStatus("a" * 12, total=10, done=10, complete=True, state="done", job_id="7_0"),
        UnitStatus("b" * 12, total=10, done=3, complete=False, state="interrupted", resumed=True, round=2),
        UnitStatus("c" * 12, total=10, done=0, complete=False, state="pending"),
    ]
    lines = [line for line in format_status(st).splitlines() if line.startswith("  ")]
    assert "interrupted (resumed, round 2)" in lines[1] and ") (" not in lines[1], lines[1]
    assert len({line.index("errors") for line in lines}) == 1, lines


def test_a_unit_that_ended_unfinished_shows_the_gpu_its_last_worker_ran_on(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """No marker (the unit failed): the GPU its last worker's partial header names."""
    sd, units, view = _three_units_on_slurm(tmp_path, write_spec)
    partial = sd.partial_path(units[0])
    lines = partial.read_text().splitlines()
    first = json.loads(lines[0])
    first["header"]["gpu"] = "3"
    partial.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    st = sweep_status(sd, view=view)
    failed = next(u for u in st.units if u.id == units[0])
    assert failed.state == "failed" and failed.gpu == "3", failed


def test_a_large_sweep_says_which_units_it_leaves_out(tmp_path: Path) -> None:
    from orchestrator.store.synthetic import build_sweep, small_spec

    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=12), 48, write_partials=list(range(47)))
    text = format_status(sweep_status(sd, query_slurm=False), max_lines=40)
    assert text.count(" pending ") == 1  # the one unfinished unit is listed
    assert "  ... 47 done units not shown (--json lists every unit)" in text.splitlines(), text
    partial = format_status(sweep_status(SweepDir.open(sd.root), query_slurm=False), max_lines=0)
    assert "  ... 1 more and 47 done units not shown (--json lists every unit)" in partial.splitlines(), partial


def test_a_task_that_started_since_squeue_said_pending_runs_and_one_that_ran_before_is_requeued(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """``wait`` asks squeue less often than it reads the partials: a task squeue last called
    pending whose partial was written since runs (``wait`` called it requeued until its next
    squeue); one whose partial was last written before squeue was asked was requeued."""
    import os

    sd, units, _ = _three_units_on_slurm(tmp_path, write_spec)
    view = scheduler_view(j50_1=TaskState("PENDING", "squeue", "Priority"))
    partial = sd.partial_path(units[1])
    view.taken = partial.stat().st_mtime - 5  # asked before the partial was written
    assert {u.id: u.state for u in sweep_status(sd, view=view).units}[units[1]] == "running"
    view.taken = time.time()
    os.utime(partial, (view.taken - 5, view.taken - 5))  # written (after the submission) before it was asked
    assert {u.id: u.state for u in sweep_status(sd, view=view).units}[units[1]] == "requeued"
