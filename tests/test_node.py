"""A SLURM task's workers (orchestrator.control.dispatch.node) without SLURM: a worker the
kernel's OOM killer ends is reported as out of memory, in its unit's log and by status.

Needs a memory cgroup this test may create (root, cgroup v1 or v2 mounted writable), as on
the dev machine and in CI; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.control.status import sweep_status
from orchestrator.store.sweepdir import SweepDir
from tests.conftest import REPO, run_cli
from tests.helpers import TINY_SPEC

TINY = {key: value for key, value in TINY_SPEC.items() if key != "kernel"}

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


DRIVE_ALL = """
import json, sys
from orchestrator.control.dispatch.node import TaskWorkers
from orchestrator.store.sweepdir import SweepDir
units = [u["id"] for u in SweepDir.open(sys.argv[1]).unit_index()]
w = TaskWorkers(sys.argv[1], units, {}, None)
w.start(); w.wait(); print(json.dumps(w.finish()))
"""


def test_a_gpu_takes_the_tasks_next_unit_and_a_killed_worker_costs_only_its_own(tmp_path: Path) -> None:
    """Three units on a task's one GPU, replayed at the real pace (no jax compile): they run one
    after another on that GPU; the first one's worker, killed mid-unit, fails alone (its reason
    in its log), and the GPU goes on with the next units."""
    from orchestrator.store import synthetic
    from tests.helpers import TINY_SPEC

    grid = {
        **TINY_SPEC,
        "modes": ["fwd"],
        "fwd_block_q": [16, 32, 64, 128],
        "fwd_block_k": [16, 32],
        "timing": {"target_ms": 50, "warmup": 0},
    }
    source = synthetic.document(grid)
    for rec in source["results"]:  # 9 configs, 3 a unit, each waits out 0.8 s
        rec.update(compile_s=0.5, median_ms=2.0, q1_ms=1.9, q3_ms=2.1)
    (tmp_path / "source.json").write_text(json.dumps(source))
    spec = tmp_path / "spec.json"
    replay = {"source": str(tmp_path / "source.json"), "pace": "real"}
    data = {**grid, "output": str(tmp_path / "out.json"), "kernel": {"impl": "replay"}, "replay": replay}
    spec.write_text(json.dumps({**data, "sharding": {"units": 3, "strategy": "balanced"}}))
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    first = SweepDir.open(sweep).unit_index()[0]["id"]
    drive = subprocess.Popen(
        [sys.executable, "-c", DRIVE_ALL, str(sweep)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "7"},
    )
    partial = sweep / "partials" / f"{first}.jsonl"
    pid = poll_for(lambda: partial.exists() and '"record"' in partial.read_text() and _header_pid(partial))
    os.kill(pid, signal.SIGKILL)
    out, _ = drive.communicate(timeout=300)
    assert drive.returncode == 0
    outcomes = {o["unit"]: o for o in json.loads(out)}
    assert outcomes.pop(first)["state"] == "failed" and {o["state"] for o in outcomes.values()} == {"done"}
    assert {o["gpu"] for o in outcomes.values()} == {"7"}
    log = (sweep / "logs" / "units" / f"{first}.log").read_text()
    assert f"tilesweep: unit {first} failed: killed by signal 9 (SIGKILL)" in log, log[-2000:]
    # one GPU: each unit started after the one before it had ended
    spans = sorted(_span(sweep, u) for u in [first, *outcomes])
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_a_worker_whose_task_process_dies_says_so_in_one_line(tmp_path: Path) -> None:
    """The task's process killed (as SLURM's OOM handling or an admin's kill -9 does): its
    worker is stopped by its death signal and says why in its unit's log, with no traceback."""
    from orchestrator.store import synthetic

    grid = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [16, 32, 64], "timing": {"target_ms": 50, "warmup": 0}}
    source = synthetic.document(grid)
    for rec in source["results"]:
        rec.update(compile_s=0.5, median_ms=2.0, q1_ms=1.9, q3_ms=2.1)
    (tmp_path / "source.json").write_text(json.dumps(source))
    replay = {"source": str(tmp_path / "source.json"), "pace": "real"}
    data = {**grid, "output": str(tmp_path / "out.json"), "kernel": {"impl": "replay"}, "replay": replay}
    (tmp_path / "spec.json").write_text(json.dumps({**data, "sharding": {"units": 1}}))
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(tmp_path / "spec.json"), "--sweep-dir", str(sweep)).returncode == 0
    (unit,) = [u["id"] for u in SweepDir.open(sweep).unit_index()]
    task = subprocess.Popen([sys.executable, "-c", DRIVE_ALL, str(sweep)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    partial = sweep / "partials" / f"{unit}.jsonl"
    poll_for(lambda: partial.exists() and '"record"' in partial.read_text())
    task.kill()
    task.communicate()
    log = sweep / "logs" / "units" / f"{unit}.log"
    poll_for(lambda: "task's own process died" in log.read_text())
    text = log.read_text()
    assert "Traceback" not in text and "BrokenPipeError" not in text, text[-2000:]
    assert text.rstrip().splitlines()[-1].endswith("its finished records are kept"), text[-2000:]


def poll_for(check: Callable[[], int | None | bool], timeout_s: float = 120) -> int:
    """Poll ``check`` until it returns a true value (an event, not a guessed wait)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return int(got)
        time.sleep(0.05)
    raise AssertionError("the event never came")


def _header_pid(partial: Path) -> int | None:
    for line in partial.read_text().splitlines():
        if '"header"' in line:
            return int(json.loads(line)["header"]["pid"])
    return None


def _span(sweep: Path, unit: str) -> tuple[str, str]:
    """When the unit's worker was started (its log's first line, by the task) and when it
    ended (its log's last line)."""
    lines = (sweep / "logs" / "units" / f"{unit}.log").read_text().splitlines()
    stamp = lines[0].split(" ", 1)[0]
    end = (sweep / "done" / f"{unit}.json").read_text() if (sweep / "done" / f"{unit}.json").exists() else None
    return stamp, json.loads(end)["finished"] if end else lines[-1].split(" ", 1)[0]


def test_a_task_imports_what_its_sweeps_workers_need_and_no_other_implementation() -> None:
    """Before it forks its workers, a task imports their modules once: a replay's no jax; a
    Pallas sweep its kernel (in interpret mode with what jax's interpreter loads), not jax's
    Mosaic GPU kernel nor tokamax's ops, which only their own sweeps import."""
    from kernels import impls
    from orchestrator.control.dispatch.forked import preload_modules
    from orchestrator.spec.model import SweepSpec

    replay = SweepSpec.model_validate(
        {**TINY, "kernel": {"impl": "replay"}, "replay": {"source": "source.json", "pace": "instant"}}
    )
    assert preload_modules(replay) == ("jobs.worker",)
    pallas = preload_modules(SweepSpec.model_validate({**TINY, "kernel": {"interpret": True}}))
    assert {"jax", "kernels.attention", "jobs.worker"} <= set(pallas)
    assert any(name.startswith("jax._src.pallas") for name in pallas)
    on_gpu = preload_modules(SweepSpec.model_validate({**TINY, "kernel": {"interpret": False}}))
    assert not any(name.startswith("jax._src.pallas") for name in on_gpu)
    assert not {"kernels.mosaic", "kernels.tokamax_ops"} & set(pallas + on_gpu)
    assert "kernels.mosaic" in impls.worker_modules("mosaic", interpret=False)


def test_a_task_tells_how_much_of_its_imports_was_pallas_interpreter() -> None:
    """The seconds a task spent importing Pallas's interpreter (interpret mode only, never a
    run on GPUs) are told apart, so its start on GPUs can be read from a run without one."""
    code = """
import json, sys
from orchestrator.control.dispatch.forked import preload
from orchestrator.spec.model import SweepSpec
spec = SweepSpec.model_validate(json.loads(sys.argv[1]))
print(preload(spec))
"""
    said = {
        interpret: float(
            subprocess.run(
                [sys.executable, "-c", code, json.dumps({**TINY, "kernel": {"interpret": interpret}})],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for interpret in (True, False)
    }
    assert said[True] > 0
    assert said[False] == 0


def test_a_tasks_line_for_a_worker_says_its_cpus_as_the_units_log_does(tmp_path: Path) -> None:
    """The task's log names each worker's CPUs as its unit's log opens with them (``CPUs 0,1``),
    not as a Python list."""
    from orchestrator.store import synthetic

    grid = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [16, 32], "fwd_block_k": [16]}
    (tmp_path / "source.json").write_text(json.dumps(synthetic.document(grid)))
    replay = {"source": str(tmp_path / "source.json")}
    data = {**grid, "output": str(tmp_path / "out.json"), "kernel": {"impl": "replay"}, "replay": replay}
    (tmp_path / "spec.json").write_text(json.dumps(data))
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(tmp_path / "spec.json"), "--sweep-dir", str(sweep)).returncode == 0
    logged = "from orchestrator.control.dispatch.nodelog import configure_node_logging\nconfigure_node_logging()\n"
    done = subprocess.run(
        [sys.executable, "-c", logged + DRIVE_ALL, str(sweep)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "7"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (unit,) = (u["id"] for u in SweepDir.open(sweep).unit_index())
    line = next(s for s in done.stderr.splitlines() if f"unit {unit}: worker pid " in s)
    first = (sweep / "logs" / "units" / f"{unit}.log").read_text().splitlines()[0]
    said = re.search(r", CPUs ([0-9,]+), SLURM task -$", first)
    assert said is not None and line.endswith(f" on GPU 7, CPUs {said[1]}"), (line, first)
