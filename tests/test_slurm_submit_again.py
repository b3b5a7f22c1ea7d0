"""``submit`` of a sweep directory submitted already, on the real local SLURM cluster: refused in
one line that counts the jobs its ``jobs.jsonl`` holds and names ``resume``, nothing submitted.
``resume`` of a sweep planned and never submitted submits the plan's own units.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.store.sweepdir import SweepDir
from tests.helpers import assert_one_line_error
from tests.slurm_cluster import require_cluster
from tests.slurm_sweeps import cli, held_replay_spec, jobs, submitted, unit_jobs

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def test_a_second_submit_of_a_one_job_sweep_is_refused_counting_one_job(tmp_path: Path) -> None:
    spec, sweep = held_replay_spec(tmp_path), tmp_path / "sweep"
    with submitted(spec, sweep, units=1):
        before = jobs(sweep)
        again = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1")
        assert_one_line_error(again, f"{sweep} was submitted already (1 job in {sweep / 'jobs.jsonl'})", "resume")
        assert jobs(sweep) == before


def test_resume_of_a_plan_never_submitted_submits_the_plans_own_units(tmp_path: Path) -> None:
    spec, sweep = held_replay_spec(tmp_path), tmp_path / "sweep"
    assert cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    planned = [u["id"] for u in SweepDir.open(sweep).unit_index()]
    try:
        r = cli("resume", str(sweep))
        assert r.returncode == 0 and "2 units never started, taken as planned" in r.stdout, r.stdout + r.stderr
        assert sorted(unit_jobs(sweep)) == sorted(planned)
        assert [u["id"] for u in SweepDir.open(sweep).unit_index()] == planned
    finally:
        cli("cancel", str(sweep))
