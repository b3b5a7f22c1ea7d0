"""A SLURM task's workers (orchestrator.control.dispatch.node) without SLURM: a worker the
kernel's OOM killer ends is reported as out of memory, in its unit's log and by status.

Needs a memory cgroup this test may create (root, cgroup v1 or v2 mounted writable), as on
the dev machine and in CI; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.control.status import sweep_status
from orchestrator.store.sweepdir import SweepDir
from tests.conftest import REPO, run_cli

DRIVE = """
import json, sys
from orchestrator.control.dispatch.node import TaskWorkers
w = TaskWorkers(sys.argv[1], [sys.argv[2]], {}, None)
w.start(); w.wait(); print(json.dumps(w.finish()))
"""


def _memory_cgroup() -> Path | None:
    """A fresh child of this process's memory cgroup (v1 or v2), or None where there is none."""
    if os.geteuid() != 0:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        base = {"memory": Path("/sys/fs/cgroup/memory"), "": Path("/sys/fs/cgroup")}.get(controllers)
        if base is None or not (base / path.lstrip("/")).is_dir():
            continue
        child = base / path.lstrip("/") / f"tilesweep-test-{uuid.uuid4().hex[:8]}"
        limit = "memory.limit_in_bytes" if controllers == "memory" else "memory.max"
        try:
            child.mkdir()
            (child / limit).write_text(str(900 * 2**20))
        except OSError:
            continue
        return child
    return None


def test_a_worker_ended_by_the_oom_killer_is_reported_out_of_memory(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    cgroup = _memory_cgroup()
    if cgroup is None:
        pytest.skip("no memory cgroup can be made here (needs root and a writable cgroup mount)")
    try:
        # one config whose inputs (3 x 512 MB) cannot fit the cgroup's 900 MB
        spec = write_spec(
            seq_lens=[262144], heads=4, head_dims=[128], modes=["fwd"], auto_only=True, sharding={"units": 1}
        )
        sweep = tmp_path / "sweep"
        assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
        unit = SweepDir.open(sweep).unit_index()[0]["id"]
        cmd = f'echo $$ > {cgroup}/cgroup.procs && exec "{sys.executable}" -c "$0" "$1" "$2"'
        r = subprocess.run(
            ["bash", "-c", cmd, DRIVE, str(sweep), unit], cwd=REPO, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, r.stderr
        (outcome,) = json.loads(r.stdout)
        assert outcome["state"] == "failed" and outcome["reason"].startswith("out of memory"), outcome
        log = (sweep / "logs" / "units" / f"{unit}.log").read_text()
        assert f"tilesweep: unit {unit} failed: out of memory (the kernel's OOM killer" in log
    finally:
        for pid in (cgroup / "cgroup.procs").read_text().split():
            subprocess.run(["kill", "-9", pid], check=False)
        cgroup.rmdir()
    # what status says of it, once a job of the unit is on record
    sd = SweepDir.open(sweep)
    sd.record_jobs(
        [
            {
                "unit": unit,
                "executor": "slurm",
                "job_id": "90_0",
                "array_id": "90",
                "task": 0,
                "submitted_ts": 0,
                "log": str(sweep / "logs" / "units" / f"{unit}.log"),
            }
        ]
    )
    from orchestrator.control.scheduler import SchedulerView, TaskState

    view = SchedulerView(
        {"90_0": TaskState("FAILED", "sacct", exit_code="0:9")}, asked=True, squeue_ok=True, sacct_ok=True
    )
    (u,) = sweep_status(sd, view=view).units
    assert u.state == "failed" and (u.detail or "").startswith("out of memory (the kernel's OOM killer")
