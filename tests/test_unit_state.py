"""What SLURM's answers mean: sacct's rows parsed, and each task's state as a unit's state
(``control.scheduler``, ``control.unit_state``), on answers built by hand (their format is
pinned against the real cluster in test_slurm_dispatch.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.control.scheduler import SchedulerView, TaskState, expand_indices, parse_sacct
from orchestrator.control.status import LOST_AFTER_S, slurm_state
from tests.helpers import scheduler_view


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
    rows = {jid: (state, code) for jid, state, code, *_ in parse_sacct(text)}
    assert rows["36_0"] == ("CANCELLED", "0:0") and rows["36_1"][0] == "COMPLETED"
    by = {jid: who for jid, *_, who in parse_sacct(text)}
    assert by["36_0"] == "0" and by["36_1"] == "" and by["39_4"] == ""  # "CANCELLED by 0": who cancelled it
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
        ("47_0", "REQUEUED", "0:0", 90, 4, ""),
        ("47_0", "COMPLETED", "0:0", 30, 4, ""),
        ("48", "COMPLETED", "0:0", 600, 0, ""),
    ]


def test_gpu_hours_are_left_out_until_sacct_has_a_row_for_every_array_of_the_sweep() -> None:
    """A sum without an array sacct does not know yet (slurmdbd not yet told of a task that just
    ended) would be too low, and a document merged then would keep it: no figure is better."""
    view = SchedulerView(asked=True, sacct_ok=True, gpu_seconds={"47": 4 * 120.0, "52": 0.0})
    assert view.gpu_hours(["47_0", "47_1"]) == round(480 / 3600, 4)
    assert view.gpu_hours(["47_0", "52_3"]) == round(480 / 3600, 4)  # 52 pending: known, nothing used yet
    assert view.gpu_hours(["47_0", "53_0"]) is None
    assert SchedulerView(asked=True, sacct_ok=False, gpu_seconds={"47": 480.0}).gpu_hours(["47_0"]) is None


@pytest.mark.parametrize(
    "task, mtime_after, expected",
    [
        (TaskState("PENDING", "squeue", "JobArrayTaskLimit"), False, ("pending", "JobArrayTaskLimit")),
        (
            TaskState("PENDING", "squeue", "BeginTime"),
            True,
            (
                "requeued",
                "BeginTime: SLURM requeued it (its node went down, or it was preempted or requeued) and it waits "
                "to start again; it starts on its own",
            ),
        ),
        (
            TaskState("PENDING", "squeue", "BeginTime"),
            False,
            (
                "pending",
                "BeginTime: it waits for the time SLURM lets it start (after a requeue, or sbatch --begin); "
                "it starts on its own",
            ),
        ),
        (
            TaskState("PENDING", "squeue", "ReqNodeNotAvail, UnavailableNodes:vm[1-2]"),  # as squeue -o %r says it
            False,
            (
                "pending",
                "ReqNodeNotAvail: the nodes it needs (vm[1-2]) are down, drained or reserved; it starts once they "
                "return (`sinfo -R` says why they are out); to run it elsewhere, cancel it, then resume with "
                "executor.slurm_exclude naming them",
            ),
        ),
        (
            TaskState("PENDING", "squeue", "ReqNodeNotAvail"),
            False,
            (
                "pending",
                "ReqNodeNotAvail: nodes it needs are down, drained or reserved; it starts once they return "
                "(`sinfo -R` says why they are out); to run it elsewhere, cancel it, then resume with "
                "executor.slurm_exclude naming them",
            ),
        ),
        (TaskState("REQUEUED", "sacct"), True, ("requeued", "REQUEUED")),
        (TaskState("RUNNING", "squeue", "None"), True, ("running", None)),
        (TaskState("COMPLETING", "squeue"), True, ("running", "COMPLETING")),
        (
            TaskState("CANCELLED", "sacct"),
            True,
            ("cancelled", "cancelled outside `tilesweep cancel` (scancel, or SLURM itself)"),
        ),
        (
            TaskState("CANCELLED", "sacct", by="0"),
            True,
            ("cancelled", "cancelled by root (uid 0) with scancel, not `tilesweep cancel`"),
        ),
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
    view = scheduler_view(j36_1=task)
    assert slurm_state(job, view, now - 50 if mtime_after else None, {}, now, 3) == expected


def test_a_unit_of_a_running_whole_node_task_that_no_gpu_took_yet_is_pending() -> None:
    now = time.time()
    job = {"job_id": "36_1", "submitted_ts": now - 100, "units_in_task": 8}
    view = scheduler_view(j36_1=TaskState("RUNNING", "squeue", "None"))
    assert slurm_state(job, view, None, {}, now, 0) == (
        "pending",
        "its task is running; it waits for one of the task's GPUs",
    )
    assert slurm_state(job, view, now - 50, {}, now, 0) == ("running", None)  # its log written since: taken


def test_a_job_in_neither_squeue_nor_sacct_is_pending_while_young_then_gone() -> None:
    now = time.time()
    view = scheduler_view()
    young = {"job_id": "36_5", "submitted_ts": now - 5}
    old = {"job_id": "36_5", "submitted_ts": now - LOST_AFTER_S - 5}
    assert slurm_state(young, view, None, {}, now, 0)[0] == "pending"
    state, detail = slurm_state(old, view, None, {}, now, 0)
    assert state == "cancelled" and "neither squeue nor sacct" in (detail or "")
    # our own cancel record wins over whatever the scheduler says
    running = scheduler_view(j36_5=TaskState("RUNNING", "squeue"))
    assert slurm_state(old, running, None, {"36": now - 1}, now, 0)[0] == "cancelled"
    # SLURM not asked: a guess from the partial, said so
    assert slurm_state(old, None, None, {}, now, 2) == ("running", "SLURM not asked; state guessed from the partial")


def test_a_task_of_a_known_array_in_neither_squeue_nor_sacct_is_cancelled_at_once_unless_it_ran() -> None:
    """A pending task cancelled on its own leaves no record: once its array is known, it is
    cancelled now, not a minute later; a task that ran may only be missing from sacct's lag."""
    now = time.time()
    view = scheduler_view(j36_0=TaskState("RUNNING", "squeue"))
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
    lagging = scheduler_view(j36_0=TaskState("RUNNING", "squeue"), j36_5=TaskState("PENDING", "sacct"))
    lagging.arrays_seen = {"36"}
    assert slurm_state(young, lagging, None, {}, now, 0)[0] == "cancelled"
    unknown = scheduler_view()  # the array itself not in squeue or sacct yet: too early to tell
    assert slurm_state(young, unknown, None, {}, now, 0) == ("pending", "not yet in squeue or sacct")


def test_a_unit_a_gpu_ran_when_its_whole_node_task_died_says_so_where_its_worker_could_not(tmp_path: Path) -> None:
    """SLURM may end a dead task's workers before they write why: the unit a GPU ran then reads
    that its task died under it, with what SLURM says and what redoes the rest, not a bare exit
    code; a unit no GPU took reads that none of it ran."""
    from orchestrator.control.unit_state import failure

    now = time.time()
    log = tmp_path / "unit.log"
    log.write_text("tilesweep: starting unit u1 on vm, GPU 0\n")  # written by the task as it handed it over
    task_log = tmp_path / "36_1_0_log.err"
    task_log.write_text("")
    job = {"job_id": "36_1", "submitted_ts": now - 100, "units_in_task": 8, "log": str(log), "stderr": str(task_log)}
    view = scheduler_view(j36_1=TaskState("FAILED", "sacct", exit_code="9:0"))
    said = failure("u1", job, "FAILED", view)
    assert said == (
        "its task died while one of its GPUs ran this unit (SLURM: FAILED, exit 9:0), and the unit's worker with it; "
        "its finished records are kept: `tilesweep resume` runs the rest"
    )
    never = failure("u2", {**job, "log": str(tmp_path / "none.log")}, "FAILED", view)
    assert never is not None and never.startswith("its task died before one of its GPUs took this unit (SLURM: FAILED")
