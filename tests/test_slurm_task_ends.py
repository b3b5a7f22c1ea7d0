"""How a SLURM task's end reads in `status` when it ends its units unfinished, on the real local
cluster: a whole-node task whose own process is killed (the units its GPUs took and the ones
they never took), and a task that runs out of its time limit.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.control.dispatch.unit_worker import TASK_DIED
from orchestrator.control.unit_state import cancelled_by
from tests.helpers import assert_one_line_error
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import (
    FOUR_UNITS,
    SLOW_EXECUTOR,
    cli,
    lines,
    slow_replay_spec,
    status,
    unit_jobs,
    write_spec,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def _parent(pid: int) -> int:
    """The process that started ``pid`` (/proc's ppid field)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_units_a_killed_whole_node_task_never_handed_a_gpu_say_none_of_them_ran_and_what_redoes_them(
    tmp_path: Path,
) -> None:
    """8 units on a 4-GPU task: the task's own process is killed (SIGKILL) once its GPUs took
    their first units; the units they took say the task died under them, the ones they never
    took say so too, and that `resume` runs them, not a bare exit code."""
    timing = {"target_ms": 100, "max_inner": 1000, "warmup": 0}
    spec = write_spec(
        tmp_path, "kill.json", {"gpus_per_node": 4, "merge_job": False}, **{**FOUR_UNITS, "timing": timing}
    )
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "8").returncode == 0
    entries = unit_jobs(sweep)
    first = next(u for u, e in entries.items() if e["slot"] == 0)

    def worker_pid() -> int | None:
        """The pid of the worker that took the task's first unit, once its partial names it."""
        return next((o["header"]["pid"] for o in lines(sweep / "partials" / f"{first}.jsonl") if "header" in o), None)

    task = _parent(poll(worker_pid, 120, "the task's first unit to start", 0.05))
    os.kill(task, signal.SIGKILL)
    w = cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    assert w.returncode == 1, w.stderr
    units = {u["id"]: u for u in status(sweep)["units"]}
    never = [u for u in entries if not (sweep / "logs" / "units" / f"{u}.log").exists()]
    taken = [u for u in entries if u not in never and units[u]["state"] != "done"]
    assert never and taken, units  # 4 GPUs, 8 units: the last 4 wait for a GPU that never frees
    for u in never:
        assert units[u]["state"] == "failed", units[u]
        detail = units[u]["detail"]
        assert detail.startswith("its task died before one of its GPUs took this unit (SLURM: FAILED"), detail
        assert detail.endswith("so none of it ran; `tilesweep resume` runs it"), detail
    for u in taken:  # its worker said so, or SLURM ended it with the task before it could
        assert units[u]["state"] == "failed", units[u]
        assert units[u]["detail"] == TASK_DIED or units[u]["detail"].startswith(
            "its task died while one of its GPUs ran this unit (SLURM: FAILED"
        ), units[u]
    text = cli("status", str(sweep)).stdout
    assert "exit code 9" not in text and f"tilesweep resume {sweep}" in text, text
    # the log of a unit no GPU took: none, as its task ended (not "waits for one of the task's GPUs")
    line = assert_one_line_error(
        cli("logs", str(sweep), never[0]),
        f"unit {never[0]} of {sweep} has no log: its task died before one of its GPUs took this unit (SLURM: FAILED",
        f"`tilesweep logs {sweep} {never[0]} --task` prints the task's log",
    )
    assert "waits for" not in line, line


@pytest.mark.last
def test_a_unit_whose_task_ran_out_of_its_time_limit_names_the_limit_and_the_resume_that_raises_it(
    time_limit_sweeps: dict[str, tuple[Path, Path]],
) -> None:
    """A task without a time-limit warning (slurm_signal_delay_s 0) or requeues: SLURM ends it
    TIMEOUT at its 1-minute limit. Its unit reads what ran out, and the two ways `resume` gives
    the rest more time: a longer executor.timeout_min from the spec file, or more units; where 1
    minute is all its partition allows (the cluster's `short`), a partition that allows more. The
    sweeps were submitted with the first SLURM test (conftest's ``time_limit_sweeps``); a replay
    at the real pace waits instead of computing, so their minute costs no CPU."""
    fixes = {
        "cpu": ("", "raise executor.timeout_min"),
        "short": (
            ", all that partition short allows",
            "name a partition with a longer time limit in executor.slurm_partition (`sinfo -s` lists their limits)",
        ),
    }
    for partition, (limit, fix) in fixes.items():
        spec, sweep = time_limit_sweeps[partition]
        w = cli("wait", str(sweep), "--interval", "1", "--slurm-interval", "2")
        assert w.returncode == 1, w.stderr
        (unit,) = status(sweep)["units"]
        assert unit["state"] == "timed out", unit
        assert unit["detail"] == (
            f"its task ran out of its time limit (executor.timeout_min: 1 min{limit}); its finished records are kept: "
            f"{fix} in {spec}, then `tilesweep resume {sweep} --spec {spec}`, or spread what is "
            f"left over more units: `tilesweep resume {sweep} --units N`"
        )


@pytest.mark.last
def test_a_unit_out_of_requeues_names_those_its_task_was_submitted_with_after_a_resume_with_other_ones(
    time_limit_sweeps: dict[str, tuple[Path, Path]],
) -> None:
    """A task warned before its 2-minute limit with no requeue left (max_requeues 0) fails
    ("timed-out too many times"); `resume --spec` with more requeues and a longer limit makes
    those the sweep's. The failed unit still names the limit and the requeues its own task had,
    not the ones the resume brought."""
    spec, sweep = time_limit_sweeps["requeues"]
    more = slow_replay_spec(
        spec.parent, "more.json", {**SLOW_EXECUTOR, "merge_job": False, "timeout_min": 5}, "instant"
    )
    (old,) = unit_jobs(sweep)
    assert cli("wait", str(sweep), "--interval", "1", "--slurm-interval", "2").returncode == 1
    r = cli("resume", str(sweep), "--spec", str(more))
    assert r.returncode == 0, r.stderr
    assert json.loads((sweep / "sweep.json").read_text())["spec"]["executor"]["max_requeues"] == 3
    units = {u["id"]: u for u in status(sweep)["units"]}
    assert units[old]["state"] == "failed" and units[old]["resumed"], units[old]
    assert units[old]["detail"].startswith(
        "its task ran out of its time limit (executor.timeout_min: 2 min) with no requeue left "
        "(executor.max_requeues: 0); its finished records are kept: "
    ), units[old]["detail"]
    assert cli("wait", str(sweep), "--interval", "1", "--slurm-interval", "2").returncode == 0


def test_a_unit_whose_running_task_was_scancelled_says_who_cancelled_it_and_that_resume_redoes_it(
    tmp_path: Path,
) -> None:
    """`scancel` of one running task (not `tilesweep cancel`) while the sweep's other unit runs:
    its unit reads cancelled by whom sacct names, and the status ends with the resume that redoes
    its items while the other unit goes on. A replay at the real pace waits instead of computing."""
    executor = {"slurm_partition": "cpu", "gpus_per_node": 0, "merge_job": False}
    spec = slow_replay_spec(tmp_path, "two.json", executor)
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    try:
        entries = unit_jobs(sweep)
        victim, other = sorted(entries)

        def worker(unit: str) -> int:
            """The pid of the unit's worker, once its partial's header names it (0 until then)."""
            return next((o["header"]["pid"] for o in lines(sweep / "partials" / f"{unit}.jsonl") if "header" in o), 0)

        poll(lambda: worker(victim), 120, f"unit {victim} to start", 0.5)
        os.kill(poll(lambda: worker(other), 120, f"unit {other} to start", 0.5), signal.SIGSTOP)  # runs on, idle
        subprocess.run(["scancel", entries[victim]["job_id"]], check=True)

        def cancelled() -> dict[str, dict[str, Any]] | None:
            units = {u["id"]: u for u in status(sweep)["units"]}
            return units if units[victim]["state"] == "cancelled" else None

        units = poll(cancelled, 120, f"unit {victim} to read cancelled", 1.0)
        who = pwd.getpwuid(os.getuid()).pw_name
        assert units[victim]["detail"] == f"cancelled by {who} (uid {os.getuid()}) with scancel, not `tilesweep cancel`"
        assert units[other]["state"] == "running", units[other]
        r = cli("status", str(sweep))
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stdout.splitlines()[-1] == (
            f"to redo the items of the 1 unit that ended unfinished while the others run on: tilesweep resume {sweep}"
        ), r.stdout
    finally:
        cli("cancel", str(sweep))


def test_a_task_that_ended_before_a_tilesweep_cancel_keeps_what_ended_it(tmp_path: Path) -> None:
    """`scancel` of one task of an array, then `tilesweep cancel` of the sweep: the cancel names
    the tasks it cancelled, and the task that had ended before reads as it did, not as cancelled
    by `tilesweep cancel` (which would hide a failure's own reason the same way). The arrays are
    held: nothing runs."""
    held = {"slurm_additional_parameters": {"hold": True}, "merge_job": False}
    spec = write_spec(tmp_path, "held.json", held, **FOUR_UNITS)
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    victim, other = sorted(unit_jobs(sweep).items())
    try:
        subprocess.run(["scancel", victim[1]["job_id"]], check=True)

        def ended() -> dict[str, Any] | None:
            unit = next(u for u in status(sweep)["units"] if u["id"] == victim[0])
            return unit if unit["state"] == "cancelled" else None

        before = poll(ended, 90, f"unit {victim[0]} to read cancelled", 1.0)
        assert before["detail"] != "cancelled with `tilesweep cancel`", before
    finally:
        r = cli("cancel", str(sweep))
    assert r.returncode == 0 and f"cancelled job array {other[1]['array_id']} (1 unfinished unit)" in r.stdout, r.stdout
    units = {u["id"]: u for u in status(sweep)["units"]}
    assert units[other[0]]["detail"] == "cancelled with `tilesweep cancel`", units[other[0]]
    assert units[victim[0]]["state"] == "cancelled", units[victim[0]]
    # as it read before, or as sacct says once it records the task (a few seconds after squeue dropped it)
    assert units[victim[0]]["detail"] in (before["detail"], cancelled_by(str(os.getuid()))), units[victim[0]]


def test_the_log_of_a_unit_no_gpu_took_before_a_cancel_says_the_task_was_cancelled(tmp_path: Path) -> None:
    """4 units on a 2-GPU task, cancelled once its GPUs took their first units: ``logs`` of a unit
    they never took says its task ended, how, and what redoes its items, not that it waits for a
    GPU. A replay at the real pace waits instead of computing."""
    spec = slow_replay_spec(tmp_path, "node.json", {"gpus_per_node": 2, "merge_job": False})
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "4").returncode == 0
    entries = unit_jobs(sweep)
    waiting = next(u for u, e in entries.items() if e["slot"] > 1)  # the task's third unit: no GPU is free for it
    taken = [u for u, e in entries.items() if e["slot"] < 2]

    def recorded() -> bool:
        """Whether each unit the task's GPUs took first has written a record."""
        return all(any("record" in o for o in lines(sweep / "partials" / f"{u}.jsonl")) for u in taken)

    try:
        poll(recorded, 120, "the task's first units to record")
    finally:
        assert cli("cancel", str(sweep)).returncode == 0
    poll(lambda: next(u for u in status(sweep)["units"] if u["id"] == waiting)["state"] == "cancelled", 90, "cancel")
    assert not (sweep / "logs" / "units" / f"{waiting}.log").exists()
    assert_one_line_error(
        cli("logs", str(sweep), waiting),
        f"unit {waiting} of {sweep} has no log: its task (job {entries[waiting]['job_id']}) ended before one of its "
        f"GPUs took this unit (cancelled with `tilesweep cancel`), so none of it ran; `tilesweep resume {sweep}` "
        "redoes its items",
    )


def test_a_task_slurm_requeued_after_it_started_says_it_waits_to_start_again_not_a_bare_begintime(
    tmp_path: Path,
) -> None:
    """A requeued task (its node set down, a preemption; here ``scontrol requeue``) pends with the
    reason BeginTime until SLURM lets it start again: status says what that means."""
    spec = slow_replay_spec(tmp_path, "slow.json", {"slurm_partition": "cpu", "gpus_per_node": 0})
    sweep = tmp_path / "sweep"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1")
    try:
        assert r.returncode == 0, r.stderr
        ((unit, entry),) = unit_jobs(sweep).items()
        poll(lambda: (sweep / "logs" / "units" / f"{unit}.log").exists(), 300, "the unit's worker to start")
        subprocess.run(["scontrol", "requeue", entry["job_id"]], check=True)

        def requeued() -> dict[str, Any] | None:
            (u,) = status(sweep)["units"]
            assert u["state"] in ("running", "requeued"), u  # the requeue is seen before the task runs again
            return u if u["state"] == "requeued" and (u["detail"] or "").startswith("BeginTime") else None

        u = poll(requeued, 120, "status to show the task requeued")
        assert u["detail"] == (
            "BeginTime: SLURM requeued it (its node went down, or it was preempted or requeued) and it waits to "
            "start again; it starts on its own"
        ), u
    finally:
        cli("cancel", str(sweep))
