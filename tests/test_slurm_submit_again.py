"""``submit`` of a sweep directory submitted already, on the real local SLURM cluster: refused in
one line that counts the jobs its ``jobs.jsonl`` holds and names ``resume``, nothing submitted.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, replay_specs
from tests.slurm_cluster import require_cluster
from tests.slurm_sweeps import cli, jobs

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def test_a_second_submit_of_a_one_job_sweep_is_refused_counting_one_job(tmp_path: Path) -> None:
    spec = replay_specs(tmp_path, lambda k: 0.0, "slurm")["instant"]
    held = {"kind": "slurm", "slurm_partition": "cpu", "gpus_per_node": 0}
    held["slurm_additional_parameters"] = {"hold": True}  # nothing runs while the test looks
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "executor": held}))
    sweep = tmp_path / "sweep"
    try:
        assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
        before = jobs(sweep)
        again = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "1")
        assert_one_line_error(again, f"{sweep} was submitted already (1 job in {sweep / 'jobs.jsonl'})", "resume")
        assert jobs(sweep) == before
    finally:
        cli("cancel", str(sweep))
