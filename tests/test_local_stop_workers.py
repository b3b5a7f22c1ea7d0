"""A local run stopped (Ctrl-C) stops its workers (``local_procs.stop_workers``); each unit then
reads as interrupted, not failed, even a worker the stop ended before it could say so itself
(every round of halving or search starts new workers: each start is such a window). Real
processes, really signalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.control.dispatch.local_procs import LocalWorker, stop_workers
from orchestrator.control.unit_state import local_state
from orchestrator.control.why import interrupted_line, last_word
from tests.helpers import TINY_SPEC, replay_specs, run_cli, start_run, until

# a worker still starting: no handler of its own yet, so TERM ends it without a word
STARTING = "import time; time.sleep(60)"
# a worker running its unit: it says it was stopped, as ``local_worker`` does, and exits
RUNNING = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    print({line!r}, flush=True)\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def worker(tmp_path: Path, unit: str, code: str) -> LocalWorker:
    log = tmp_path / f"{unit}.1_0_log.err"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=out)
    return LocalWorker(unit, proc, log, tmp_path / f"{unit}.done", 60, None, time.monotonic())


def test_a_worker_stopped_while_it_starts_reads_as_interrupted_and_one_that_said_so_keeps_its_word(
    tmp_path: Path,
) -> None:
    starting = worker(tmp_path, "aaaaaaaaaaaa", STARTING)
    said = interrupted_line("bbbbbbbbbbbb", "stopped by SIGTERM; its finished records are kept")
    running = worker(tmp_path, "bbbbbbbbbbbb", RUNNING.format(line=said))
    while "ready" not in running.log.read_text():  # its handler is in place
        time.sleep(0.05)
    stop_workers([starting, running])
    assert starting.poll() is not None and running.poll() == 143
    for w in (starting, running):
        job = {"executor": "local", "job_id": w.job_id, "log": str(w.log), "unit": w.unit}
        assert local_state(job, 0)[0] == "interrupted", w.log.read_text()
    assert last_word(starting.log, starting.unit) == (
        "interrupted",
        "stopped with the run that started it, before its unit began",
    )
    assert running.log.read_text().count("interrupted") == 1


def test_a_worker_whose_job_cannot_be_recorded_is_stopped_not_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history write after a worker started fails (a full disk): the worker is stopped,
    since no history would name it and neither ``run``'s stop nor ``cancel`` could reach it."""
    from orchestrator.control.dispatch import local
    from orchestrator.store.sweepdir import SweepDir

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**TINY_SPEC, "output": str(tmp_path / "out.json")}))
    assert run_cli("plan", str(spec), "--sweep-dir", str(tmp_path / "sweep")).returncode == 0
    sd = SweepDir.open(tmp_path / "sweep")
    started: list[LocalWorker] = []
    real_start = local.start_worker

    def start(*args: object, **kwargs: object) -> LocalWorker:
        started.append(real_start(*args, **kwargs))  # type: ignore[arg-type]
        return started[-1]

    def full(_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local, "start_worker", start)
    monkeypatch.setattr(sd, "record_jobs", full)
    with pytest.raises(OSError):
        local._start_worker(sd, sd.unit_index()[0]["id"], [], 0, {})
    (worker,) = started
    assert worker.poll() is not None  # stopped, not left measuring on its own


# a worker whose stop handler waits for a call that does not return (a long compile, a kernel
# in interpret mode): TERM is noted, and the call goes on
STUCK = (
    "import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: None)\nprint('ready', flush=True)\ntime.sleep(60)\n"
)


def test_a_worker_that_does_not_stop_within_the_grace_is_killed_and_reads_as_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker goes on measuring after the run said it stopped: one still there when the
    grace ends is killed, and its unit reads as interrupted (finished records kept), not failed."""
    from orchestrator.control.dispatch import local_procs

    monkeypatch.setattr(local_procs, "STOP_WAIT_S", 0.5)  # the grace, not a wait for an event
    stuck = worker(tmp_path, "cccccccccccc", STUCK)
    while "ready" not in stuck.log.read_text():  # its handler is in place
        time.sleep(0.05)
    stop_workers([stuck])
    assert stuck.poll() == -9
    job = {"executor": "local", "job_id": stuck.job_id, "log": str(stuck.log), "unit": stuck.unit}
    assert local_state(job, 0)[0] == "interrupted", stuck.log.read_text()
    state, why = last_word(stuck.log, stuck.unit) or ("", "")
    assert state == "interrupted" and "killed" in why and "finished records are kept" in why


def test_a_ctrl_c_of_a_run_of_two_units_at_once_is_one_line_and_status_names_each_unit(tmp_path: Path) -> None:
    """Two units run side by side (a replay that waits out a long compile, taking no CPU); a
    Ctrl-C stops both in one line, naming no unit (neither the first whose end it saw nor any
    other), and ``status`` says each unit was interrupted."""
    spec = replay_specs(tmp_path, lambda k: 600.0, "local")["real"]
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep, "--units", "2", "--workers", "2")

    def both_in_their_units() -> bool:
        partials = list((sweep / "partials").glob("*.jsonl")) if (sweep / "partials").is_dir() else []
        return len(partials) == 2 and all('"header"' in p.read_text() for p in partials)

    until(both_in_their_units, "both units' headers", run)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "tilesweep: interrupted; finished records are kept, rerun to continue", err
    assert sum("interrupted" in line for line in err.splitlines()) == 1, err
    status = run_cli("status", str(sweep))
    for unit in [u["id"] for u in json.loads((sweep / "units.json").read_text())]:
        (row,) = [line for line in status.stdout.splitlines() if unit in line]
        assert "interrupted" in row, status.stdout
