"""``tilesweep resume`` here of a sweep whose unit another process runs, as ``run`` does: a
worker run by hand (``python -m jobs.worker``, as ``plan`` says), or the worker a killed ``run``
left running. The resume follows that worker to its end, then merges, instead of starting a
second worker on the same items beside it, or merging half a sweep and sending the user to a
resume that would say the same again.

Real processes; each step waits for an event (a record written, a process gone), never for a
guessed time.
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

from tests.helpers import REPO, records_written, run_cli, start_run, until
from tests.test_another_shell import SETTLE_S, SPEC


@pytest.mark.parametrize("started", ["by hand", "by a run killed since"])
def test_resume_here_follows_a_worker_another_process_runs(
    write_spec: Callable[..., Path], tmp_path: Path, started: str
) -> None:
    spec, sweep = write_spec(**SPEC), tmp_path / "sweep"
    if started == "by hand":
        assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
        worker = subprocess.Popen(
            [sys.executable, "-m", "jobs.worker", str(sweep), "0"], cwd=REPO, stdout=subprocess.DEVNULL, text=True
        )
        until(lambda: records_written(sweep) > 0, "a record", worker)
        ends: Callable[[], object] = worker.wait
    else:
        run = start_run(spec, sweep)
        until(lambda: records_written(sweep) > 0, "a record", run)
        jobs = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
        orphan = Path("/proc") / str(jobs[-1]["job_id"])  # the unit's worker, which runs on alone
        os.kill(run.pid, signal.SIGKILL)
        run.communicate(timeout=SETTLE_S)

        def ends() -> None:
            until(lambda: not orphan.exists(), "the worker's end")

    try:
        resume = run_cli("resume", str(sweep), timeout=SETTLE_S)
    finally:
        ends()
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert "following it instead of starting a second worker on it" in resume.stdout, resume.stdout
    assert "new unit" not in resume.stdout and "redoes" not in resume.stderr, resume.stdout + resume.stderr
    units = json.loads((sweep / "units.json").read_text())
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(units) == 1 and len(doc["results"]) == doc["tilesweep"]["planned"] == records_written(sweep)
