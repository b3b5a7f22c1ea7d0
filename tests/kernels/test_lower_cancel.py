"""Ctrl-C of ``plan --lower`` lowering on the cluster's CPUs (``executor.lower_partition``): it
cancels the job array it submitted (scancel), saying so, and returns only once SLURM runs none
of its tasks, its lowering lease held until then, so no task writes a verdict beside a later
``plan --lower`` or ``run``. The array's tasks wait at a gate in their set-up lines, a file the
test makes only after the command returned, so none can end on its own first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.planning import RUN, expand
from orchestrator.spec.files import load_spec
from orchestrator.store import lowering
from tests.helpers import LAUNCH, REPO, run_cli, until
from tests.kernels.test_lower_reruns import SPEC
from tests.slurm_cluster import require_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")]


def _squeue(array: str) -> list[str]:
    """The states squeue lists of the array's tasks (none once every task left the queue)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%T", "-j", array], capture_output=True, text=True, check=False)
    return out.stdout.split()


def test_ctrl_c_cancels_the_lowering_array_and_returns_once_no_task_of_it_runs(tmp_path: Path) -> None:
    require_cluster()
    gate = tmp_path / "gate"
    executor = {
        "kind": "slurm",
        "slurm_partition": "gpu",
        "lower_partition": "cpu",
        "cpus_per_task": 1,
        "timeout_min": 5,
        "slurm_setup": [f"while [ ! -e {gate} ]; do sleep 0.2; done"],
    }
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    spec.write_text(json.dumps({**SPEC, "executor": executor, "output": str(tmp_path / "out.json")}))
    lower = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "plan", str(spec), "--lower", "--sweep-dir", str(sweep)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert lower.stderr is not None
    seen: list[str] = []
    while " as job array " not in (line := lower.stderr.readline()):
        assert line, "".join(seen)  # it ended without submitting the array
        seen.append(line)
    array = line.split(" as job array ")[1].split()[0]
    until(lambda: "RUNNING" in _squeue(array), "a lowering task running (at its gate)", lower)
    os.killpg(lower.pid, signal.SIGINT)
    _, err = lower.communicate(timeout=300)
    left = _squeue(array)  # what SLURM still runs of it as the command returned
    gate.touch()
    assert lower.returncode == 130 and "Traceback" not in err, err
    assert left == [], (left, err)
    assert f"tilesweep: cancelling the lowering array {array} (scancel {array}); waiting for its tasks to end" in err
    assert err.splitlines()[-1] == (
        f"tilesweep: interrupted; no verdict was written to {sweep / lowering.FILE}; `tilesweep plan {spec} --lower "
        f"--sweep-dir {sweep}` lowers only the 3 configs left without one"
    ), err
    assert not (sweep / "lowering.lease").exists() and not list(sweep.glob(lowering.TASK_FILES))
    again = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), timeout=300)
    assert again.returncode == 0 and "lowered 3 configs" in again.stdout, again.stderr
    (task,) = sweep.glob(lowering.TASK_FILES)  # the rerun's task alone wrote it: a header, 3 verdicts, its end
    lines = [json.loads(text) for text in task.read_text().splitlines()]
    assert len(lines) == 5 and lines[-1] == {"lowering_end": 3}, lines
    planned = sorted(it.id for it in expand(load_spec(spec)) if it.kind == RUN)
    assert sorted(obj["id"] for obj in lines[1:-1]) == planned
