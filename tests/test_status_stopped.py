"""What ``status`` says of a unit ``resume --no-wait`` left running whose controller alone is
stopped (``kill -STOP`` of the pid its job column shows): the controller records nothing, its
worker runs on and records, so the unit is not said stopped, nor its ETA withheld. Real
processes, really signalled; each step waits for an event, never for a guessed time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from orchestrator.store.pidspace import process_state
from tests.helpers import records_written, run_cli, status_while_stopped, until
from tests.test_another_shell import SETTLE_S, SPEC


def test_a_stopped_controller_whose_worker_runs_on_is_no_stopped_unit(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec, sweep = write_spec(**SPEC), tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    assert run_cli("resume", str(sweep), "--no-wait").returncode == 0
    until(lambda: records_written(sweep) > 0, "a record")
    controller = int(json.loads((sweep / "jobs.jsonl").read_text().splitlines()[-1])["job_id"])
    (lease,) = (sweep / "leases").glob("*.lease")
    worker = int(json.loads(lease.read_text())["pid"])
    try:
        status = status_while_stopped(
            sweep, controller, lambda: process_state(controller) == "T", "the controller stopped"
        )
    finally:
        cancel = run_cli("cancel", str(sweep), timeout=SETTLE_S)  # the unit is not left running, whatever follows
    assert "SIGSTOP" not in status.stdout.splitlines()[0], status.stdout
    (unit,) = [line for line in status.stdout.splitlines() if " running " in line]
    assert unit.endswith(
        f"local process {controller}, the controller of its worker, is stopped; its worker (pid {worker}) runs on"
    ), status.stdout
    assert cancel.returncode == 0, cancel.stdout
