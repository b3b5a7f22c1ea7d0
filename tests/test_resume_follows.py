"""``tilesweep resume`` here of a sweep whose unit another process runs, as ``run`` does: a
worker run by hand (``python -m jobs.worker``, as ``plan`` says), or the worker a killed ``run``
left running. The resume follows that worker to its end, then runs the rounds it made due (a
halving's round 2), as ``run`` does, then merges, instead of starting a second worker on the same
items beside it, or merging half a sweep and sending the user to a resume that would say the same
again.

Real processes; each step waits for an event (a worker holding its unit, a process stopped, a
line said, a process gone), never for a guessed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.store.leases import run_lease, run_lease_path
from orchestrator.store.pidspace import process_state
from tests.helpers import REPO, assert_one_line_error, records_written, run_cli, start_run, until
from tests.test_local_lifecycle import SETTLE_S, SPEC, _has_lease, _worker_pid

# ``python -m jobs.worker SWEEP UNIT`` that stops itself (SIGSTOP) once it holds its unit's lease
STOPS_ONCE_LEASED = """
import os, signal, sys
import jobs.worker as w
leased = w._run_leased
def stopped(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGSTOP)
    return leased(*args, **kwargs)
w._run_leased = stopped
sys.exit(w.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("started", ["by hand", "by a run killed since"])
def test_resume_here_follows_a_worker_another_process_runs(
    write_spec: Callable[..., Path], tmp_path: Path, started: str
) -> None:
    """The worker is stopped (SIGSTOP, as Ctrl-Z stops it) while it holds its unit, until resume
    says it follows it: however fast it would run its unit, it is running when resume looks."""
    spec, sweep = write_spec(**{**SPEC, "fwd_block_q": [32]}), tmp_path / "sweep"  # two items
    if started == "by hand":
        assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
        worker = subprocess.Popen(
            [sys.executable, "-c", STOPS_ONCE_LEASED, str(sweep), "0"], cwd=REPO, stdout=subprocess.DEVNULL, text=True
        )
        until(lambda: process_state(worker.pid) == "T", "the worker to take its unit", worker)
        pid = worker.pid
        ends: Callable[[], object] = worker.wait
    else:
        run = start_run(spec, sweep)
        until(lambda: _has_lease(sweep), "the run's worker to take its unit", run)
        pid = _worker_pid(sweep)  # the unit's worker, which runs on alone once the run is killed
        os.kill(run.pid, signal.SIGKILL)
        run.communicate(timeout=SETTLE_S)
        os.kill(pid, signal.SIGSTOP)
        orphan = Path("/proc") / str(pid)

        def ends() -> None:
            until(lambda: not orphan.exists(), "the worker's end")

    try:
        code, out, err = _resume_while_stopped(sweep, pid)
    finally:
        ends()
    assert code == 0, out + err
    assert "following it instead of starting a second worker on it" in out, out
    assert "new unit" not in out and "redoes" not in err, out + err
    units = json.loads((sweep / "units.json").read_text())
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(units) == 1 and len(doc["results"]) == doc["tilesweep"]["planned"] == records_written(sweep)


def _resume_while_stopped(sweep: Path, worker: int) -> tuple[int, str, str]:
    """``tilesweep resume SWEEP`` while the process ``worker`` is stopped, continued once resume
    says it follows it (or ended without saying so): its exit code, stdout and stderr."""
    resume = start_run(Path(), sweep, command="resume")
    assert resume.stdout is not None
    said = ""
    try:
        while "instead of starting a second worker" not in said and (line := resume.stdout.readline()):
            said += line
    finally:
        os.kill(worker, signal.SIGCONT)
    out, err = resume.communicate(timeout=SETTLE_S)
    return resume.returncode, said + out, err


@pytest.mark.parametrize("command", ["resume", "run"])
def test_a_halving_sweep_whose_round_1_a_worker_by_hand_runs_gets_its_round_2_after_it(
    tmp_path: Path, command: str
) -> None:
    """``resume`` (and ``run``) here follows the round-1 unit a worker run by hand holds (stopped
    until the command follows it, so that the command cannot see it end first), then plans and
    runs round 2, as ``run`` does after its own units: the sweep ends complete, with the
    survivors timed in full."""
    from tests.test_halving import spec_file

    spec, sweep = spec_file(tmp_path, {"kind": "local"}), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    # the worker stops itself once it holds its unit's lease, before its first record: still
    # running when the command looks, however fast it would have run its unit
    worker = subprocess.Popen(
        [sys.executable, "-c", STOPS_ONCE_LEASED, str(sweep), "0"], cwd=REPO, stdout=subprocess.DEVNULL, text=True
    )
    until(lambda: process_state(worker.pid) == "T", "the worker to take its unit", worker)
    proc = start_run(spec, sweep, command=command)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        said = proc.stdout if command == "resume" else proc.stderr
        line = ""
        while "instead of starting a second worker" not in line and (line := said.readline()):
            pass
        assert line, "the command never said it follows the worker"
        # it has passed what it runs itself, and sleeps between its looks at the worker's unit
        sleeping = Path("/proc") / str(proc.pid) / "wchan"
        until(lambda: "nanosleep" in sleeping.read_text(), "the command to follow the worker", proc)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        worker.wait(timeout=SETTLE_S)
    out, err = proc.communicate(timeout=SETTLE_S)
    assert proc.returncode == 0, out + err
    assert "round 2: " in err and "screened configs can still win" in err, err
    units = json.loads((sweep / "units.json").read_text())
    assert any(u.get("origin") == "round2" for u in units), units
    status = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert status["complete"] and status["merged"], status


def test_the_commands_that_find_a_sweep_a_resume_runs_name_the_resume(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """While ``resume`` runs a sweep here (it follows the unit a worker run by hand holds, stopped
    until the end: the resume holds the sweep all along), a second ``resume`` and a ``run`` into
    another output are refused, and a ``run`` follows it, each naming the ``tilesweep resume`` that
    holds the sweep (pid included), as its run lease says, not a ``tilesweep run``."""
    spec, sweep = write_spec(**{**SPEC, "fwd_block_q": [32]}), tmp_path / "sweep"  # two items
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    worker = subprocess.Popen(
        [sys.executable, "-c", STOPS_ONCE_LEASED, str(sweep), "0"], cwd=REPO, stdout=subprocess.DEVNULL, text=True
    )
    until(lambda: process_state(worker.pid) == "T", "the worker to take its unit", worker)
    resume = start_run(Path(), sweep, command="resume")
    held = f"{sweep} is being run by another `tilesweep resume` (pid {resume.pid} on "
    try:
        assert resume.stdout is not None
        line = ""
        while "instead of starting a second worker" not in line and (line := resume.stdout.readline()):
            pass
        assert line, "the resume never said it follows the worker"
        assert_one_line_error(run_cli("resume", str(sweep)), held, "resume it once that run has ended")
        moved = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", str(tmp_path / "other.json"))
        assert_one_line_error(moved, f"{sweep} is being run by another `tilesweep resume`, which merges into")
        follower = start_run(spec, sweep)
        assert follower.stderr is not None
        said = ""
        while "following its progress" not in said and (line := follower.stderr.readline()):
            said = line
        assert said.startswith(f"tilesweep: note: {held}"), said
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        worker.wait(timeout=SETTLE_S)
    out, err = resume.communicate(timeout=SETTLE_S)
    assert resume.returncode == 0, out + err
    out, err = follower.communicate(timeout=SETTLE_S)
    assert follower.returncode == 0, out + err
    assert not (tmp_path / "other.json").exists()


def test_a_run_lease_that_names_no_command_is_said_as_another_tilesweep_command(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The run lease of a tilesweep that wrote no command into it is still read: the sweep is
    being run by another tilesweep command, said in the same one line, exit code 2."""
    spec, sweep = write_spec(**SPEC), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    path = run_lease_path(sweep)
    with run_lease(sweep, "run"):  # this process holds the sweep, its lease rewritten as such a tilesweep's
        fields = json.loads(path.read_text())
        del fields["command"]
        path.write_text(json.dumps(fields) + "\n")
        r = run_cli("resume", str(sweep))
    assert_one_line_error(r, f"{sweep} is being run by another tilesweep command (pid {os.getpid()} on ")


def test_status_of_a_sweep_a_resume_holds_names_the_resume(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """A planned sweep whose run lease a ``tilesweep resume`` holds (this process, as that resume's
    lease says): ``status`` says the resume starts its units, not a ``tilesweep run``."""
    spec, sweep = write_spec(**SPEC), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    with run_lease(sweep, "resume"):
        shown = run_cli("status", str(sweep))
    assert "not submitted yet: the running `tilesweep resume` starts it" in shown.stdout, shown.stdout
    assert "`tilesweep run`" not in shown.stdout, shown.stdout
