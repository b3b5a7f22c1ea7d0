"""One worker per unit, ever, and one `tilesweep run` per sweep: leases held by real processes.

A lease is the soft lock of store/locks.py (its staleness rules are tested in
test_concurrency.py); these tests hold leases in real processes and check what a user sees:
a second worker refused in one line before it writes anything, a dead holder's lease taken
over, status naming the live worker that runs a unit, and two `run`s of one sweep that
never run a unit twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.control.dispatch.node import cpu_shares
from orchestrator.control.dispatch.unit_worker import HELD
from orchestrator.control.status import format_status, sweep_status
from orchestrator.control.why import read_failure, signal_reason
from orchestrator.errors import LeaseHeld
from orchestrator.store.leases import read_holder, unit_lease, unit_lease_path
from orchestrator.store.sweepdir import SweepDir
from tests.conftest import REPO, run_cli
from tests.helpers import assert_one_line_error, second_run_follows

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from orchestrator.store.leases import unit_lease
    with unit_lease(Path(sys.argv[1]), sys.argv[2], gpu="3", job=sys.argv[3] or None):
        print("held", flush=True)
        time.sleep(600)
""")


def _sweep(tmp_path: Path, write_spec: Callable[..., Path], units: int = 2, **over: object) -> SweepDir:
    spec = write_spec(**over)
    r = run_cli("plan", str(spec), "--units", str(units), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    return SweepDir.open(tmp_path / "sweep")


def _hold(sd: SweepDir, unit: str, job: str = "") -> subprocess.Popen[str]:
    """A live process holding the unit's lease (as a worker does while it runs the unit)."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(sd.root), unit, job], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_second_worker_on_a_unit_held_by_a_live_one_is_refused_and_writes_nothing(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    sd = _sweep(tmp_path, write_spec)
    unit = sd.unit_index()[0]["id"]
    holder = _hold(sd, unit, job="71_2")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "jobs.worker", str(sd.root), unit],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        line = assert_one_line_error(
            r, f"unit {unit}", "already held by", f"pid {holder.pid}", "SLURM task 71_2", "GPU 3"
        )
        assert str(unit_lease_path(sd.root, unit)) in line
        assert not sd.partial_path(unit).exists()  # refused before anything was written
        # a SLURM task's worker on it (a stray requeue, a resumed unit) is not started, and that is no failure
        argv = [sys.executable, "-m", "orchestrator.control.dispatch.unit_worker", str(sd.root), unit, "{}"]
        w = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert w.returncode == HELD and f"tilesweep: unit {unit} not started: unit {unit}" in w.stderr, w.stderr
        assert not sd.partial_path(unit).exists()
        # status: the unit is being run, by that worker, on its GPU
        st = sweep_status(sd, query_slurm=False)
        u = next(x for x in st.units if x.id == unit)
        assert u.state == "running" and u.gpu == "3" and u.detail is not None and f"pid {holder.pid}" in u.detail
        assert "gpu 3" in format_status(st)
    finally:
        holder.kill()
        holder.wait()
    # the holder died (SIGKILL: its lease file stays): its lease is stale and is taken over
    assert unit_lease_path(sd.root, unit).exists()
    holder_now = read_holder(unit_lease_path(sd.root, unit))
    assert holder_now is not None and not holder_now.live
    with unit_lease(sd.root, unit, gpu=None, job=None):
        taken = read_holder(unit_lease_path(sd.root, unit))
        assert taken is not None and taken.fields["pid"] == os.getpid()
    assert not unit_lease_path(sd.root, unit).exists()


def test_a_requeued_task_takes_over_the_lease_of_its_own_earlier_run_only(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    """On another node a dead holder cannot be told from a live one, except when it was an
    earlier run of the same SLURM task: SLURM ends a job before it requeues it."""
    sd = _sweep(tmp_path, write_spec)
    unit = sd.unit_index()[0]["id"]
    path = unit_lease_path(sd.root, unit)
    with unit_lease(sd.root, unit, gpu="1", job="80_1"):
        held = json.loads(path.read_text())
    held.update(host="node-elsewhere", boot_id="other-boot", pid=12345)  # as a worker on another node left it
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(held) + "\n")
    with pytest.raises(LeaseHeld, match="node-elsewhere.*SLURM task 80_1"):
        with unit_lease(sd.root, unit, gpu="0", job="80_2"):  # another task: that worker may be alive
            pass
    with unit_lease(sd.root, unit, gpu="0", job="80_1"):  # the same task, requeued
        assert json.loads(path.read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("content", ["", "garbage\n", "[]\n"])
def test_a_lease_file_that_names_no_holder_is_taken_once_it_has_lain_unchanged(
    tmp_path: Path, write_spec: Callable[..., Path], content: str
) -> None:
    """A lease file emptied or garbled (by hand, by a disk) names no holder: no live holder's is
    like that once it has lain unchanged a few seconds, so it is taken; while it is fresh it may
    be a holder's being written (where links are not), so it is not."""
    sd = _sweep(tmp_path, write_spec)
    unit = sd.unit_index()[0]["id"]
    path = unit_lease_path(sd.root, unit)
    path.parent.mkdir(exist_ok=True)
    path.write_text(content)
    with pytest.raises(LeaseHeld):
        with unit_lease(sd.root, unit, gpu="0", job=None):
            pass
    old = time.time() - 60
    os.utime(path, (old, old))
    with unit_lease(sd.root, unit, gpu="0", job=None):
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_two_local_runs_of_one_sweep_never_run_a_unit_twice(tmp_path: Path, write_spec: Callable[..., Path]) -> None:
    spec = write_spec(compile={"workers": 1}, executor={"kind": "local", "local_workers": 1})
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "orchestrator", "run", str(spec), "--sweep-dir", str(sweep), "--units", "1"]
    first = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    end = time.monotonic() + 120
    while not (sweep / "run.lease").exists():  # the first run holds the sweep
        assert first.poll() is None and time.monotonic() < end, first.communicate()
        time.sleep(0.05)
    second = second_run_follows(first, args)
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert second.returncode == 0, second.stderr
    assert "is being run by another `tilesweep run`" in second.stderr and "following its progress" in second.stderr
    assert "speedup" in second.stdout and "merged 6 records" in second.stderr
    sd = SweepDir.open(sweep)
    for u in sd.unit_index():  # one attempt per unit: nobody started a second worker on it
        lines = [json.loads(line) for line in sd.partial_path(u["id"]).read_text().splitlines()]
        assert sum("header" in o for o in lines) == 1
        ids = [o["id"] for o in lines if "record" in o]
        assert len(ids) == len(set(ids)) == u["n_items"]
    assert [e["executor"] for e in sd.job_history()] == ["local"]


def test_cpu_shares_split_a_tasks_cpus_among_its_workers() -> None:
    assert cpu_shares(list(range(8)), 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert cpu_shares(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert cpu_shares([0, 1], 4) == [[0, 1]] * 4  # fewer CPUs than workers: all of them, shared by the OS
    assert cpu_shares([5], 1) == [[5]]


def test_the_reason_of_a_failure_is_read_from_the_end_of_a_log(tmp_path: Path) -> None:
    log = tmp_path / "unit.log"
    assert read_failure(log) is None  # no log: nothing made up
    log.write_text(
        "12:00 tilesweep: unit aa failed: an earlier attempt's reason\n"
        "12:01 jobs.worker: unit aa: 1/3 ok\n"
        "12:02 tilesweep: unit bb failed: another unit's reason\n"
    )
    assert read_failure(log, "aa") == "an earlier attempt's reason" and read_failure(log) == "another unit's reason"
    tb = tmp_path / "task.err"
    tb.write_text(
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        'orchestrator.errors.SweepDirError: unit "x" is no unit of /s (2 units)\n'
    )
    assert read_failure(tb, "aa") == 'SweepDirError: unit "x" is no unit of /s (2 units)'
    tb.write_text("submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many times.\n")
    said = read_failure(tb)  # submitit's last word after the last requeue (status says what to change)
    assert said == "UncompletedJobError: Job not requeued because: timed-out too many times."
    assert signal_reason(signal.SIGKILL) == "killed by signal 9 (SIGKILL)"
    assert signal_reason(signal.SIGKILL, oom_killed=True).startswith("out of memory")
    assert "executor.mem_gb" in signal_reason(signal.SIGKILL, oom_killed=True)  # a SLURM task's memory
    here = signal_reason(signal.SIGKILL, oom_killed=True, where="local")  # no SLURM limit to raise here
    assert "--workers" in here and "mem_gb" not in here
