"""``run`` and ``submit`` of a sweep directory that ``plan --lower`` lowers (it holds the sweep's
lowering lease) wait for it, saying so in one line, and so does ``wait`` before it submits a
sweep's next round (the final merge job leaves that round to it), and ``run`` before it plans
one here, so that no unit compiles a config the lowering is about to refuse. The lowering is
stopped (as Ctrl-Z stops it) while the second command looks, so it cannot end first."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.store.synthetic import document
from tests.helpers import LAUNCH, REPO, TINY_SPEC, records_written, run_cli, start_run, until
from tests.slurm_cluster import require_cluster
from tests.slurm_sweeps import write_spec

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

H100 = {"interpret": True, "device_kind": "NVIDIA H100"}  # lowered for an H100, run in interpret mode here
WAITING = "waiting for the `plan --lower` of"


def _start(*args: str) -> subprocess.Popen[str]:
    """The CLI with ``args`` in its own process group, SIGINT at its default (a terminal's Ctrl-C)."""
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _lowering_held(spec: Path, sweep: Path) -> subprocess.Popen[str]:
    """``plan --lower`` of ``sweep``, stopped once it holds the sweep's lowering lease."""
    lower = _start("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1")
    until(lambda: (sweep / "lowering.lease").exists(), "the lowering holds the sweep's lowering lease", lower)
    os.killpg(lower.pid, signal.SIGSTOP)
    return lower


def _said_waiting(proc: subprocess.Popen[str]) -> str:
    """The line ``proc`` says it waits with (it must say it before it ends)."""
    assert proc.stderr is not None
    seen: list[str] = []
    while WAITING not in (line := proc.stderr.readline()):
        assert line, "".join(seen)  # it ended without saying it waits
        seen.append(line)
    return line.strip()


def test_run_waits_for_the_lowering_of_its_sweep_directory_then_runs(tmp_path: Path) -> None:
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    fwd = {**TINY_SPEC, "modes": ["fwd"]}  # what it waits for is the same for both modes
    spec.write_text(json.dumps({**fwd, "kernel": H100, "output": str(tmp_path / "out.json")}))
    lower = _lowering_held(spec, sweep)
    try:
        run = start_run(spec, sweep)
        said = _said_waiting(run)
        assert not list(sweep.glob("partials/*.jsonl")) and records_written(sweep) == 0  # no unit started
    finally:
        os.killpg(lower.pid, signal.SIGCONT)
    assert said.startswith(f"tilesweep: {WAITING} {sweep} (pid {lower.pid} on "), said
    assert said.endswith("to end, so that no unit run here compiles a config it refuses"), said
    out, err = lower.communicate(timeout=600)
    assert lower.returncode == 0 and "lowered 3 configs" in out, err
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    assert records_written(sweep) == 3 and (tmp_path / "out.json").exists()


def test_run_waits_for_a_lowering_begun_while_its_first_round_ran_before_it_plans_the_next(tmp_path: Path) -> None:
    """A halving sweep run here, whose round-1 worker is stopped (as Ctrl-Z stops it) while a
    lowering of the sweep takes its lease: once the worker ends, the run says it waits for the
    lowering, and plans round 2 only once the lowering has ended."""
    from orchestrator.store.leases import lowering_lease

    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    halving = {**TINY_SPEC["timing"], "strategy": "halving"}
    data = {**TINY_SPEC, "modes": ["fwd"], "timing": halving, "output": str(tmp_path / "out.json")}
    spec.write_text(json.dumps(data))
    run = start_run(spec, sweep, "--executor", "local")
    jobs = sweep / "jobs.jsonl"
    until(lambda: jobs.exists() and '"unit"' in jobs.read_text(), "round 1's worker", run)
    worker = int(json.loads(jobs.read_text().splitlines()[0])["job_id"])
    os.kill(worker, signal.SIGSTOP)
    try:
        with lowering_lease(sweep, lambda holder: None):  # a `plan --lower` begun after the run began
            os.kill(worker, signal.SIGCONT)
            said = _said_waiting(run)
            units = json.loads((sweep / "units.json").read_text())
            assert not (sweep / "round2.json").exists() and [u.get("round", 1) for u in units] == [1], units
    finally:
        with contextlib.suppress(ProcessLookupError):  # ended since
            os.kill(worker, signal.SIGCONT)
    assert said.startswith(f"tilesweep: {WAITING} {sweep} (pid {os.getpid()} on "), said
    assert said.endswith("to end, so that no unit of its next round run here compiles a config it refuses"), said
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    assert (sweep / "round2.json").exists() and "round 2:" in err and "0 of 3 planned missing" in err, err


@pytest.mark.slurm
def test_ctrl_c_of_submit_waiting_for_the_lowering_submits_nothing_and_says_what_to_rerun(tmp_path: Path) -> None:
    require_cluster()
    spec = write_spec(tmp_path, "spec.json", kernel=H100)
    sweep = tmp_path / "sweep"
    lower = _lowering_held(spec, sweep)
    try:
        submit = _start("submit", str(spec), "--sweep-dir", str(sweep))
        said = _said_waiting(submit)
        os.killpg(submit.pid, signal.SIGINT)
        _, err = submit.communicate(timeout=120)
    finally:
        os.killpg(lower.pid, signal.SIGCONT)
    assert f"pid {lower.pid} " in said and said.endswith("so that no unit submitted here compiles a config it refuses")
    assert submit.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"tilesweep: interrupted; no unit was submitted; the `plan --lower` of {sweep} goes on: rerun this command "
        "once it ends"
    ), err
    assert not (sweep / "jobs.jsonl").exists()
    out, err = lower.communicate(timeout=600)
    assert lower.returncode == 0 and "lowered 6 configs" in out, err


@pytest.mark.slurm
def test_wait_submits_a_next_round_only_once_the_lowering_of_its_sweep_ends(tmp_path: Path) -> None:
    """Round 1 of a halving sweep ends on the cluster while a ``plan --lower`` of its directory
    lowers: its final merge job leaves round 2 (status says why), and ``wait`` says it waits for
    the lowering (a Ctrl-C then says nothing was submitted), then submits round 2 once it ended
    and merges the sweep."""
    from orchestrator.control.submit import submit_spec

    require_cluster()
    source = tmp_path / "source.json"
    source.write_text(json.dumps(document({**TINY_SPEC, "output": "source.json"})))
    kernel = {"impl": "replay", "device_kind": "NVIDIA H100"}  # lowered as its source's kernel, replayed on the nodes
    halving = {**TINY_SPEC["timing"], "strategy": "halving"}
    spec = write_spec(tmp_path, "spec.json", kernel=kernel, replay={"source": str(source)}, timing=halving)
    sweep, jobs = tmp_path / "sweep", tmp_path / "sweep" / "jobs.jsonl"
    lower = _lowering_held(spec, sweep)
    try:  # round 1 submitted as by a `submit` begun before the lowering
        submit_spec(str(spec), sweep_dir=str(sweep), units=None, output=None, costs=None, max_array_size=None)
        until(lambda: '"round2' in jobs.read_text() or (sweep / "round2.json").exists(), "round 1's merge job's hook")
        assert not (sweep / "round2.json").exists() and '"round2_deferred"' in jobs.read_text()
        status = run_cli("status", str(sweep)).stdout
        stopped = _start("wait", str(sweep))
        _said_waiting(stopped)
        os.killpg(stopped.pid, signal.SIGINT)  # Ctrl-C while it waits: round 2 not submitted, and it says so
        _, stop = stopped.communicate(timeout=120)
        waiting = _start("wait", str(sweep))
        said = _said_waiting(waiting)
        assert not (sweep / "round2.json").exists()
    finally:
        os.killpg(lower.pid, signal.SIGCONT)
    assert f"a `plan --lower` of the sweep was lowering its configs: pid {lower.pid} on " in status, status
    assert stopped.returncode == 130 and stop.splitlines()[-1] == (
        f"tilesweep: interrupted; no unit was submitted; the `plan --lower` of {sweep} goes on: rerun this command "
        "once it ends"
    ), stop
    assert said.startswith(f"tilesweep: {WAITING} {sweep} (pid {lower.pid} on "), said
    assert said.endswith("to end, so that no unit submitted here compiles a config it refuses"), said
    out, err = lower.communicate(timeout=600)
    assert lower.returncode == 0, err
    # it picks what to lower once it holds the lease, before or after it was stopped: round 1's
    # records of configs timed in full by then are left out, and it says so
    lowered = re.search(r"^lowered (\d+) configs? for NVIDIA H100", out, re.MULTILINE)
    skipped = re.search(r"^(\d+) configs? skipped, not lowered: the sweep's workers recorded", out, re.MULTILINE)
    assert lowered and int(lowered[1]) + (int(skipped[1]) if skipped else 0) == 6, out
    out, err = waiting.communicate(timeout=600)
    assert waiting.returncode == 0, err
    round2 = json.loads((sweep / "round2.json").read_text())
    assert round2["units"], round2
    assert "tilesweep: round 2 times in full the 4 of 4 screened configs that can still win" in err, err
    merged = json.loads((tmp_path / "spec.results.json").read_text())["results"]
    assert {rec["unit"] for rec in merged} >= set(round2["units"]) and "0 of 6 planned missing" in err, err
