"""A sweep whose array tasks SLURM holds (``sbatch --hold`` through ``executor.slurm_additional_parameters``,
``scontrol hold``, a site's hold), on the real local cluster: ``status`` says each task is held and
the command that releases it, ``wait`` warns of it once and waits, and ends merged once released;
``wait --timeout`` that gives up says they are held. A held sweep runs nothing, so it is also where
a sweep cancelled before any unit recorded anything, and a Ctrl-C of its ``resume`` once sbatch
accepted the arrays, are seen.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import start_run
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import cli, held_replay_spec, submitted, unit_jobs

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def test_a_held_task_is_said_held_with_the_command_that_releases_it_and_wait_ends_once_it_is(tmp_path: Path) -> None:
    spec = held_replay_spec(tmp_path)
    sweep = tmp_path / "sweep"
    with submitted(spec, sweep, units=1):
        (job,) = [e["job_id"] for e in unit_jobs(sweep).values()]
        said = f"JobHeldUser: it is held, and starts once released: `scontrol release {job}`"
        shown = cli("status", str(sweep))
        assert shown.returncode == 0 and shown.stdout.splitlines()[-2].endswith(said), shown.stdout
        wait = start_run(spec, sweep, command="wait")
        assert wait.stderr is not None
        warning = ""
        while not warning.startswith("tilesweep: warning:") and (line := wait.stderr.readline()):
            warning = line.strip()
        assert warning.endswith(f"(job {job}) waits for {said}"), warning
        subprocess.run(["scontrol", "release", job], check=True)
        _, err = wait.communicate(timeout=300)
        assert wait.returncode == 0 and "merged 3 records (0 errors, 0 of 3 planned missing)" in err, err
        assert "warning:" not in err, err  # warned once, above


def test_wait_that_gives_up_on_held_tasks_says_they_are_held_and_the_release_that_starts_them(
    tmp_path: Path,
) -> None:
    spec = held_replay_spec(tmp_path)
    sweep = tmp_path / "sweep"
    with submitted(spec, sweep, units=2):
        held = ",".join(sorted(e["job_id"] for e in unit_jobs(sweep).values()))
        waited = cli("wait", str(sweep), "--timeout", "3")
        assert waited.returncode == 1, waited.stderr
        assert waited.stderr.splitlines()[-1] == (
            f"tilesweep: not started after 3 s: 2 units held by SLURM (`scontrol release {held}` starts them); "
            f"`tilesweep wait {sweep}` again once released"
        ), waited.stderr
        assert "still running" not in waited.stderr


def test_wait_of_a_sweep_cancelled_before_anything_was_measured_writes_no_document_and_says_how_to_resume(
    tmp_path: Path,
) -> None:
    spec = held_replay_spec(tmp_path)
    sweep, out = tmp_path / "sweep", tmp_path / "out.json"
    with submitted(spec, sweep, units=2):
        assert cli("cancel", str(sweep)).returncode == 0
        waited = cli("wait", str(sweep))
        assert waited.returncode == 1, waited.stderr
        said = waited.stderr.splitlines()
        assert f"nothing was measured: no unit wrote a record, so {out} is not written" in said, waited.stderr
        assert said[-1] == f"tilesweep: 3 items have no record; `tilesweep resume {sweep}` redoes only those", said
        assert "merged" not in waited.stderr and not out.exists()
        # the final merge job the cancel let run wrote none either
        poll(lambda: (sweep / "final-merge.json").exists(), 300, "the final merge job to end")
        assert not out.exists() and json.loads((sweep / "final-merge.json").read_text())["written"] is False


def test_a_ctrl_c_of_resume_once_sbatch_accepted_its_arrays_says_they_run_on_and_what_follows_them(
    tmp_path: Path,
) -> None:
    spec = held_replay_spec(tmp_path)
    sweep = tmp_path / "sweep"
    with submitted(spec, sweep, units=2):
        assert cli("cancel", str(sweep)).returncode == 0
        known = len((sweep / "jobs.jsonl").read_text().splitlines())
        resume = start_run(spec, sweep, command="resume")
        accepted = lambda: len((sweep / "jobs.jsonl").read_text().splitlines()) > known  # noqa: E731
        poll(lambda: accepted() or resume.poll() is not None, 120, "sbatch to accept the resumed units", 0.001)
        os.killpg(resume.pid, signal.SIGINT)
        _, err = resume.communicate(timeout=120)
        assert resume.returncode == 130 and "Traceback" not in err, err
        assert err.splitlines()[-1] == (
            "tilesweep: interrupted; what sbatch accepted before the stop is recorded and runs on: "
            f"`tilesweep wait {sweep}` follows it, `tilesweep status {sweep}` shows it, "
            f"`tilesweep cancel {sweep}` stops it"
        ), err
        assert "rerun" not in err


def test_a_ctrl_c_of_run_on_slurm_once_sbatch_accepted_its_array_says_it_runs_on_and_what_follows_it(
    tmp_path: Path,
) -> None:
    """``run`` with the slurm executor submits, then waits: stopped as sbatch accepts the array, it
    says that the array runs on and what follows, shows or stops it (a rerun submits nothing again:
    it waits), not that a rerun continues."""
    spec = held_replay_spec(tmp_path)
    sweep = tmp_path / "sweep"
    run = start_run(spec, sweep)
    try:
        accepted = lambda: (sweep / "jobs.jsonl").exists() or run.poll() is not None  # noqa: E731
        poll(accepted, 120, "sbatch to accept the array", 0.001)
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=120)
        assert run.returncode == 130 and "Traceback" not in err, err
        assert unit_jobs(sweep), err
        assert err.splitlines()[-1] == (
            "tilesweep: interrupted; what sbatch accepted before the stop is recorded and runs on: "
            f"`tilesweep wait {sweep}` follows it, `tilesweep status {sweep}` shows it, "
            f"`tilesweep cancel {sweep}` stops it"
        ), err
        assert "rerun" not in err
    finally:
        cli("cancel", str(sweep))


def test_a_task_whose_node_is_drained_is_said_to_wait_for_it_and_starts_once_it_returns(tmp_path: Path) -> None:
    """``ReqNodeNotAvail``: a task bound to a node that is drained waits for it, which no
    resubmission changes; status says so, with what a user can do, and ``wait`` ends merged once
    the node is back. The cluster's one node is drained for the few seconds that takes."""
    spec = held_replay_spec(tmp_path)
    data = json.loads(spec.read_text())
    data["executor"]["slurm_additional_parameters"] = {"nodelist": "vm"}
    spec.write_text(json.dumps(data))
    sweep = tmp_path / "sweep"
    drain = ["scontrol", "update", "nodename=vm", "state=drain", "reason=tilesweep test"]
    subprocess.run(drain, check=True)
    try:
        r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1")
        assert r.returncode == 0, r.stderr
        said = (
            "ReqNodeNotAvail: the nodes it needs (vm) are down, drained or reserved; it starts once they return "
            "(`sinfo -R` says why they are out); to run it elsewhere, cancel it, then resume with "
            "executor.slurm_exclude naming them"
        )
        shown = poll(lambda: (s := cli("status", str(sweep))).returncode == 0 and said in s.stdout and s, 60, said, 0.5)
        assert "cannot start as submitted" not in shown.stdout, shown.stdout
    finally:  # refused only where the node is no longer drained (someone resumed it): back either way
        subprocess.run(["scontrol", "update", "nodename=vm", "state=resume"], capture_output=True)
    try:
        waited = cli("wait", str(sweep), "--interval", "0.5")
        assert waited.returncode == 0, waited.stderr
    finally:
        cli("cancel", str(sweep))
