"""How a local unit's end reads when its worker did not end as planned: the command that ran it
in its own process (the debug executor) stopped by Ctrl-C, and a worker killed after its last
record but before its marker. Real processes; each step waits for an event."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.helpers import REPO, ctrl_c_after_first_record, records_written, run_cli, start_run, until
from tests.test_local_lifecycle import ITEMS, SETTLE_S, SPEC, replay_source

BAR = re.compile(r"\| *\d+/\d+ \[")  # a line of the progress bar, at any rate (item/s or s/item)


def test_a_debug_run_stopped_by_ctrl_c_leaves_its_unit_interrupted_for_resume(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The debug executor runs the units in the command's own process: once a Ctrl-C has ended
    it, its unfinished unit reads as interrupted (its log says so), as a local worker's does,
    and resume finishes the sweep."""
    spec = write_spec(**{**SPEC, "executor": {"kind": "debug"}})
    sweep = tmp_path / "sweep"
    ctrl_c_after_first_record(spec, sweep)
    status = run_cli("status", str(sweep))
    assert status.returncode == 1 and "in progress" not in status.stdout, status.stdout
    assert "interrupted" in status.stdout and "stopped by SIGINT (Ctrl-C)" in status.stdout, status.stdout
    assert "failed" not in status.stdout and "log: " in status.stdout, status.stdout
    resumed = run_cli("resume", str(sweep), timeout=SETTLE_S)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(run_cli("status", str(sweep), "--json").stdout)["complete"]


def test_a_debug_run_killed_outright_leaves_its_unit_failed_for_resume(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A debug run killed with SIGKILL says nothing: once its process is gone, its unfinished
    unit is not running any more, whatever records it wrote."""
    spec = write_spec(**{**SPEC, "executor": {"kind": "debug"}})
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep)
    until(lambda: records_written(sweep) >= 1, "a first record", run)
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=SETTLE_S)
    status = run_cli("status", str(sweep))
    assert status.returncode == 1 and "in progress" not in status.stdout, status.stdout
    assert f"the debug run that ran it (pid {run.pid}) ended before the unit finished" in status.stdout


def test_a_debug_run_says_only_what_tilesweep_says(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """Submitit's debug jobs log a notice of where each job logs as it starts, succeeding or not:
    a debug run of two units says none of it, on its console or in a unit's log, and says on
    stderr only its own lines: the sweep, the bar, the merge."""
    replay = {"kernel": {"impl": "replay"}, "replay": {"source": str(replay_source(tmp_path))}}
    spec = write_spec(**{**SPEC, **replay, "executor": {"kind": "debug"}, "sharding": {"units": 2}})
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), timeout=SETTLE_S)
    assert r.returncode == 0, r.stderr
    logs = [p.read_text() for p in (sweep / "logs").glob("*.err")]
    assert len(logs) == 2 and all("Logging is written" not in text for text in logs), logs
    said = [line for line in r.stderr.splitlines() if line.strip() and not BAR.search(line)]
    assert said[0].startswith(f"sweep {sweep}: {ITEMS} items in 2 units"), r.stderr
    merged = f"merged {ITEMS} records (0 errors, 0 of {ITEMS} planned missing) into {tmp_path / 'results.json'}"
    assert said[1:] == [merged], r.stderr


def test_a_failed_unit_under_the_debug_executor_ends_as_under_the_local_one_with_no_pdb_prompt(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A unit whose worker refuses its environment (a GPU jax does not see): submitit's debug
    jobs open pdb's post-mortem on an exception, a ``(Pdb)`` prompt a run at a terminal waits
    on. The debug run ends as the local one does: the same exit code, the unit's reason said, no
    prompt and no bare exception text on its output."""
    said = {}
    for kind in ("local", "debug"):
        out = str(tmp_path / f"{kind}.results.json")
        spec = write_spec(f"{kind}.json", output=out, modes=["fwd"], fwd_block_q=[32], kernel={"interpret": "auto"})
        sweep = tmp_path / kind
        said[kind] = subprocess.run(
            [sys.executable, "-m", "orchestrator", "run", str(spec), "--sweep-dir", str(sweep), "--executor", kind],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SETTLE_S,
            cwd=REPO,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0", "JAX_PLATFORMS": "cpu"},
        )
    debug, local = said["debug"], said["local"]
    assert local.returncode == 1 and debug.returncode == local.returncode, debug.stdout + debug.stderr
    assert "(Pdb)" not in debug.stdout + debug.stderr and "jax sees none" not in debug.stdout, debug.stdout
    for r in (local, debug):
        assert "Traceback" not in r.stderr and "failed: this task was given GPU(s)" in r.stderr, r.stderr
        assert "Logging is written" not in r.stderr, r.stderr
    status = json.loads(run_cli("status", str(tmp_path / "debug"), "--json").stdout)
    assert [u["state"] for u in status["units"]] == ["failed"], status


def test_an_interrupted_units_pid_taken_by_another_process_is_not_its_unit_running(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """Once a unit's worker has ended, the kernel hands its pid on to any new process: the unit
    still reads as interrupted, resume and a rerun take its items (a rerun does not follow the
    stranger's process as the sweep's worker)."""
    spec = write_spec(**SPEC)
    sweep = tmp_path / "sweep"
    ctrl_c_after_first_record(spec, sweep)
    # a live process of no sweep's, standing where the kernel put the worker's pid on: the job
    # entry is left as the run wrote it, but for its pid
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        history = sweep / "jobs.jsonl"
        jobs = [json.loads(line) for line in history.read_text().splitlines()]
        assert [j["executor"] for j in jobs if "unit" in j] == ["local"], jobs
        history.write_text("".join(json.dumps({**j, "job_id": str(stranger.pid)}) + "\n" for j in jobs))
        status = run_cli("status", str(sweep))
        assert status.returncode == 1, status.stdout
        assert "interrupted" in status.stdout and "stopped by SIGINT (Ctrl-C)" in status.stdout, status.stdout
        assert "running" not in status.stdout and "in progress" not in status.stdout, status.stdout
        rerun = run_cli("run", str(spec), "--sweep-dir", str(sweep), timeout=SETTLE_S)
        assert rerun.returncode == 0 and "following" not in rerun.stderr, rerun.stderr
        assert f"merged {ITEMS} records" in rerun.stderr, rerun.stderr
        assert stranger.poll() is None  # nobody stopped the stranger's process
    finally:
        stranger.communicate(b"")


def test_a_worker_killed_after_its_last_record_leaves_a_unit_done_for_run(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """Every item recorded, then the worker is killed (SIGKILL) just before its marker: nothing
    is missing, so ``run`` merges, warns and exits 0, as ``status`` says."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_KILL_BEFORE_MARKER)
    spec = write_spec(**SPEC, kernel={"impl": "replay"}, replay={"source": str(replay_source(tmp_path))})
    sweep = tmp_path / "sweep"
    env = {"PYTHONPATH": f"{hooks}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"merged {ITEMS} records" in r.stderr and "every item has a record, but its worker then ended" in r.stderr
    assert "killed by signal 9" in r.stderr and "unfinished" not in r.stderr and "redoes" not in r.stderr, r.stderr
    assert not list((sweep / "done").glob("*.json"))  # it did die before its marker
    assert run_cli("status", str(sweep)).returncode == 0


# a local worker's ``write_marker`` is a SIGKILL of itself: it dies after its last record
_KILL_BEFORE_MARKER = """
import importlib.machinery, os, signal, sys

class _Hook:
    def find_spec(self, name, path, target=None):
        if name != "orchestrator.store.markers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.write_marker = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)

        spec.loader.exec_module = exec_module
        return spec

if "orchestrator.control.dispatch.local_worker" in sys.orig_argv:
    sys.meta_path.insert(0, _Hook())
"""
