"""A local sweep from another shell, as a user meets it: ``tilesweep cancel`` of a sweep that a
``tilesweep run`` runs in the foreground (started as ``nohup`` or a script's ``&`` start it:
SIGINT ignored), and a Ctrl-C of such a run; of one whose unit runs detached (``resume
--no-wait``); a Ctrl-C of ``wait``, which leaves the units it follows running; ``wait`` on units
that ``resume`` replaced or that a worker started by hand runs.

Real processes throughout; each step waits for an event (a record written, a line printed, a
process gone), never for a guessed time.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.store.pidspace import process_state
from tests.helpers import (
    REPO,
    records_written,
    run_cli,
    second_while_first_stopped,
    start_run,
    status_while_stopped,
    stopped,
    until,
)

# one shape, fwd only, 18 forced configs besides auto, compiled one at a time (about a second
# each here) before they are timed: a worker that wrote its unit's header has many seconds of
# compiling left to be stopped in
SPEC = {
    "seq_lens": [256],
    "head_dims": [64],
    "modes": ["fwd"],
    "fwd_block_q": [16, 32, 64],
    "fwd_block_k": [16, 32, 64],
    "fwd_warps": [2, 4],
    "compile": {"workers": 1},
    "executor": {"kind": "local"},
}
# what a test runs to its end: the same shape, 6 forced configs besides auto (the window a
# test stops a worker in, right after it saw the event it waits for, is its unit's rest)
SHORT = {**SPEC, "fwd_block_q": [16, 32, 64], "fwd_block_k": [16, 32], "fwd_warps": [4]}
SETTLE_S = 120  # a guard, not a wait: each command returns as soon as it is done


def _in_unit(sweep: Path) -> bool:
    """Whether a worker has begun its unit: its header is in a partial (its stop signals are
    its own from then on)."""
    return any(p.read_bytes().startswith(b'{"header"') for p in (sweep / "partials").glob("*.jsonl"))


def _last_job_pid(sweep: Path) -> int:
    """The pid of the newest local job in the sweep's jobs.jsonl (a worker, or a controller)."""
    jobs = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    return int([e for e in jobs if "unit" in e][-1]["job_id"])


def _sweep_processes(sweep: Path) -> list[int]:
    """Processes whose command line names the sweep directory (what ``ps`` would show a user)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if state != "Z" and any(str(sweep).encode() in arg for arg in cmdline):
                found.append(int(proc.name))
    return found


def _states(sweep: Path) -> dict[str, str]:
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    return {u["id"]: u["state"] for u in st["units"]}


def _detached(write_spec: Callable[..., Path], tmp_path: Path, spec_data: dict = SPEC) -> Path:
    """A sweep (``spec_data``) planned into 2 units whose items ``resume --no-wait`` handed to
    one new unit, left running under its local controller; returned once its worker began the unit."""
    spec = write_spec(**spec_data)
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    resumed = run_cli("resume", str(sweep), "--no-wait")
    assert resumed.returncode == 0, resumed.stderr
    until(lambda: _in_unit(sweep), "the unit's header")
    return sweep


def test_cancel_stops_a_foreground_run_started_with_sigint_ignored(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(**SPEC)
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep, sigint_ignored=True)
    until(lambda: _in_unit(sweep), "a unit's header", run)
    cancel = run_cli("cancel", str(sweep), timeout=SETTLE_S)
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.splitlines() == [
        f"stopped the `tilesweep` command that runs {sweep} here (pid {run.pid}), as a Ctrl-C would",
        f"finished records are kept: `tilesweep resume {sweep}` redoes the rest",
    ]
    _, err = run.communicate(timeout=SETTLE_S)  # cancel returned once it had ended
    assert run.returncode == 143 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "tilesweep: stopped by SIGTERM; finished records are kept, rerun to continue"
    assert _sweep_processes(sweep) == []  # the run and its worker
    assert "interrupted" in _states(sweep).values() and "running" not in _states(sweep).values()


def test_a_ctrl_c_of_a_run_started_with_sigint_ignored_stops_the_run_not_only_its_worker(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The run ignores SIGINT (a script's ``&``), its worker takes it while its unit runs: a
    SIGINT to their process group (a Ctrl-C at the script's terminal) stops the run as a Ctrl-C
    stops one at a terminal, not its worker alone while it goes on to the next unit."""
    spec = write_spec(**SPEC, sharding={"units": 2})
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep, sigint_ignored=True)
    until(lambda: _in_unit(sweep), "a unit's header", run)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=SETTLE_S)
    assert run.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "tilesweep: interrupted; finished records are kept, rerun to continue"
    assert sum("interrupted" in line for line in err.splitlines()) == 1, err  # one line, as at a terminal
    assert _sweep_processes(sweep) == []
    assert sorted(_states(sweep).values()) == ["interrupted", "pending"]  # the second unit never started


def test_cancel_stops_a_detached_unit_and_wait_then_merges_what_it_wrote(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    sweep = _detached(write_spec, tmp_path)
    until(lambda: records_written(sweep) >= 1, "the unit's first record")  # a sweep that measured something
    controller = _last_job_pid(sweep)
    cancel = run_cli("cancel", str(sweep), timeout=SETTLE_S)
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.splitlines()[0] == f"stopped 1 unit running here (local process {controller})"
    assert _sweep_processes(sweep) == []
    states = _states(sweep)
    assert sorted(states.values()) == ["interrupted", "replaced", "replaced"], states
    # the two units resume replaced were never submitted: wait does not send the user to resume them
    wait = run_cli("wait", str(sweep), "--interval", "0.2", timeout=SETTLE_S)
    assert wait.returncode == 1 and "never submitted" not in wait.stderr, wait.stderr
    assert wait.stderr.splitlines()[-1].endswith(f"`tilesweep resume {sweep}` redoes only those"), wait.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["results"]) == records_written(sweep) < doc["tilesweep"]["planned"]
    status = run_cli("status", str(sweep))
    assert status.stdout.count("never submitted; `tilesweep resume` gave its items to later units") == 2


def test_a_ctrl_c_of_wait_says_the_units_go_on_and_they_do(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """The unit is stopped (as Ctrl-Z stops it) while wait starts and is interrupted, so that it
    cannot end before wait and status have looked; continued, it goes on to its end."""
    sweep = _detached(write_spec, tmp_path, SHORT)
    group = os.getpgid(_last_job_pid(sweep))
    with stopped(group, group=True):
        wait = start_run(Path(), sweep, "--interval", "0.2", command="wait")
        assert wait.stderr is not None
        ready, _, _ = select.select([wait.stderr], [], [], SETTLE_S)  # its first progress line: it is waiting
        assert ready and wait.stderr.readline(), "wait printed nothing"
        os.killpg(wait.pid, signal.SIGINT)  # Ctrl-C at wait's terminal (the unit runs in another session)
        _, err = wait.communicate(timeout=SETTLE_S)
        states = _states(sweep)
    assert wait.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"tilesweep: interrupted; the sweep's units go on: `tilesweep wait {sweep}` follows them again, "
        f"`tilesweep cancel {sweep}` stops them"
    )
    assert "running" in states.values()
    until(lambda: "done" in _states(sweep).values(), "the unit done")  # it went on to its end
    assert records_written(sweep) == json.loads(run_cli("status", str(sweep), "--json").stdout)["planned"]


def test_resume_no_wait_captured_by_a_script_returns_before_its_unit_ends(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """``out=$(tilesweep resume SWEEP --no-wait)`` and ``... | tee`` end when the command does:
    the unit it leaves running holds none of its streams (it held them until the unit ended)."""
    spec = write_spec(**SPEC)
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    captured = subprocess.run(  # a shell capturing the output: returns at EOF of the pipe
        ["sh", "-c", f'out=$("{sys.executable}" -m orchestrator resume "{sweep}" --no-wait) && echo "$out"'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SETTLE_S,
    )
    assert captured.returncode == 0, captured.stderr
    assert "started 1 unit here, left running" in captured.stdout
    assert "running" in _states(sweep).values()  # the capture ended, the unit did not
    assert run_cli("cancel", str(sweep), timeout=SETTLE_S).returncode == 0


def test_wait_follows_a_unit_run_by_hand_and_ends_at_once_on_units_resume_replaced(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(**SHORT)
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    worker = subprocess.Popen(  # as `plan` says: "run one with: python -m jobs.worker SWEEP 0"
        [sys.executable, "-m", "jobs.worker", str(sweep), "0"],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    until(lambda: _in_unit(sweep), "the unit's header", worker)
    # the worker stopped until wait said it is waiting, so that it cannot end before wait looks
    args = [sys.executable, "-m", "orchestrator", "wait", str(sweep), "--interval", "0.2"]
    wait = second_while_first_stopped(worker, args, "units: 1 running")  # follows it to its end
    assert worker.wait(timeout=SETTLE_S) == 0
    assert wait.returncode == 0 and "units: 1 running" in wait.stderr, wait.stderr
    planned = json.loads(run_cli("status", str(sweep), "--json").stdout)["planned"]
    assert len(json.loads((tmp_path / "results.json").read_text())["results"]) == planned
    # planned anew into 2 units that a resume run here replaced: wait merges, nothing to submit
    small = write_spec("small.json", modes=["fwd"], output=str(tmp_path / "small_results.json"))
    again = tmp_path / "again"
    assert run_cli("plan", str(small), "--sweep-dir", str(again), "--units", "2").returncode == 0
    assert run_cli("resume", str(again), timeout=SETTLE_S).returncode == 0
    wait = run_cli("wait", str(again), "--interval", "0.2", timeout=SETTLE_S)
    assert wait.returncode == 0 and "never submitted" not in wait.stderr, wait.stderr


@pytest.mark.parametrize("begun", [True, False], ids=["in its unit", "at once"])
def test_run_of_a_sweep_whose_unit_runs_detached_follows_that_worker_and_starts_no_second(
    write_spec: Callable[..., Path], tmp_path: Path, begun: bool
) -> None:
    """``tilesweep run`` of the spec while ``resume --no-wait`` runs its unit (its worker in the
    unit, or the run typed at once, before the controller's worker took the unit's lease): the
    run follows that worker (stopped meanwhile, as Ctrl-Z stops it, so it cannot end before the
    run looks) instead of starting a second, which the unit's lease refused and whose job hid
    the first from ``cancel``."""
    if begun:
        sweep = _detached(write_spec, tmp_path, SHORT)
    else:
        spec, sweep = write_spec(**SHORT), tmp_path / "sweep"
        assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
        assert run_cli("resume", str(sweep), "--no-wait").returncode == 0
    group = os.getpgid(_last_job_pid(sweep))
    with stopped(group, group=True):
        args = [sys.executable, "-m", "orchestrator", "run", str(tmp_path / "spec.json"), "--sweep-dir", str(sweep)]
        run = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert run.stderr is not None
        seen = []
        while line := run.stderr.readline():
            seen.append(line)
            if "instead of starting a second worker" in line:
                break
    out, err = run.communicate(timeout=SETTLE_S)
    assert run.returncode == 0 and "instead of starting a second worker" in "".join(seen), seen + [err]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["results"]) == doc["tilesweep"]["planned"] and not [r for r in doc["results"] if "error" in r]
    logs = "".join(p.read_text(errors="replace") for p in (sweep / "logs").glob("*") if p.is_file())
    assert "already held" not in logs and "LeaseHeld" not in logs


def test_status_from_another_shell_says_a_run_stopped_by_ctrl_z_is_stopped(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A local run stopped as Ctrl-Z stops it (its process group, worker included): status from
    another shell says the unit's worker is stopped and how to continue it, and gives no ETA."""
    spec = write_spec(**SHORT)
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep)
    until(lambda: records_written(sweep) > 0, "a record", run)
    worker = _last_job_pid(sweep)
    status = status_while_stopped(
        sweep, run.pid, lambda: process_state(worker) == "T", "the worker stopped", group=True
    )
    head, units = status.stdout.splitlines()[0], status.stdout.splitlines()[2:]
    assert head.endswith("in progress, the worker of 1 unit stopped (Ctrl-Z / SIGSTOP)"), status.stdout
    assert "ETA" not in head, head
    assert units[0].endswith(
        f"local process {worker} is stopped (Ctrl-Z / SIGSTOP): `fg` in the shell that runs it resumes it, "
        f"or `kill -CONT {worker}`"
    ), status.stdout
    _, err = run.communicate(timeout=SETTLE_S)
    assert run.returncode == 0, err
    again = run_cli("status", str(sweep))
    assert "stopped" not in again.stdout and again.returncode == 0, again.stdout


def _lease_pid(sweep: Path) -> int:
    """The pid of the worker that holds a unit's lease (the worker itself, whoever started it)."""
    (lease,) = (sweep / "leases").glob("*.lease")
    return int(json.loads(lease.read_text())["pid"])


@pytest.mark.parametrize("started", ["by hand", "by resume --no-wait"])
def test_status_says_a_stopped_worker_is_stopped_however_it_was_started(
    write_spec: Callable[..., Path], tmp_path: Path, started: str
) -> None:
    """A unit's worker run by hand (``python -m jobs.worker SWEEP 0``, as ``plan`` says) or under
    the controller ``resume --no-wait`` left, stopped alone with SIGSTOP: status says the worker
    is stopped and how to continue it, and gives no ETA; once continued, it says so no more."""
    proc: subprocess.Popen[str] | None = None
    if started == "by hand":
        sweep = tmp_path / "sweep"
        assert run_cli("plan", str(write_spec(**SPEC)), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.worker", str(sweep), "0"], cwd=REPO, stderr=subprocess.DEVNULL, text=True
        )
        until(lambda: _in_unit(sweep), "the unit's header", proc)
    else:
        sweep = _detached(write_spec, tmp_path)
    worker = _lease_pid(sweep)
    status = status_while_stopped(sweep, worker, lambda: process_state(worker) == "T", "the worker stopped")
    head = status.stdout.splitlines()[0]
    assert head.endswith("in progress, the worker of 1 unit stopped (Ctrl-Z / SIGSTOP)"), status.stdout
    assert "ETA" not in head and status.returncode == 0, status.stdout
    (unit,) = [line for line in status.stdout.splitlines() if " running " in line]
    assert unit.endswith(
        f"its worker (pid {worker}) is stopped (Ctrl-Z / SIGSTOP): `fg` in the shell that runs it resumes it, "
        f"or `kill -CONT {worker}`"
    ), status.stdout
    assert "SIGSTOP" not in run_cli("status", str(sweep)).stdout  # continued (SIGCONT takes effect at once)
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=SETTLE_S)
    else:
        assert run_cli("cancel", str(sweep), timeout=SETTLE_S).returncode == 0


def test_cancel_stops_a_worker_run_by_hand(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """A unit's worker run by hand (``python -m jobs.worker SWEEP 0``, as ``plan`` says), which no
    job of the sweep names: ``cancel`` stops it as it stops the units ``run`` or ``resume`` started,
    rather than saying nothing runs while ``status`` says the unit runs."""
    spec, sweep = write_spec(**SPEC), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobs.worker", str(sweep), "0"], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    try:
        until(lambda: _in_unit(sweep), "the unit's header", worker)
        cancel = run_cli("cancel", str(sweep), timeout=SETTLE_S)
        ended = worker.poll() is not None  # cancel returns once what it stopped has ended
    finally:
        if worker.poll() is None:  # left running: ended here, not left behind
            worker.kill()
        _, err = worker.communicate(timeout=SETTLE_S)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert cancel.stdout.splitlines() == [
        f"stopped 1 unit running here (local process {worker.pid})",
        f"finished records are kept: `tilesweep resume {sweep}` redoes the rest",
    ]
    assert ended and worker.returncode == 143 and "Traceback" not in err, err
    assert _sweep_processes(sweep) == [] and "running" not in _states(sweep).values()


def test_status_says_a_run_stopped_between_its_units_is_stopped(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The ``run`` alone stopped (SIGSTOP, or Ctrl-Z once its worker has ended): its worker ends
    its unit, and the next unit waits for the run to start it. Status says the run is stopped
    and how to continue it, and gives no ETA, rather than that the running run starts it."""
    sweep = tmp_path / "sweep"
    run = start_run(write_spec(**SPEC, sharding={"units": 2}), sweep)
    until(lambda: records_written(sweep) > 0, "a record", run)
    status = status_while_stopped(sweep, run.pid, lambda: any((sweep / "done").glob("*.json")), "the first unit done")
    head, units = status.stdout.splitlines()[0], status.stdout.splitlines()[2:]
    assert head.endswith("in progress, the `tilesweep run` that runs it stopped (Ctrl-Z / SIGSTOP)"), status.stdout
    assert "ETA" not in head, head
    (waiting,) = [line for line in units if " pending " in line]
    assert waiting.endswith(
        f"not submitted yet: the `tilesweep run` that starts it (pid {run.pid}) is stopped (Ctrl-Z / SIGSTOP): "
        f"`fg` in the shell that runs it resumes it, or `kill -CONT {run.pid}`"
    ), status.stdout
    _, err = run.communicate(timeout=SETTLE_S)
    assert run.returncode == 0, err
