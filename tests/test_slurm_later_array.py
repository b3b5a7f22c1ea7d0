"""A submission whose later array sbatch refused (a per-user job limit reached part-way, a busy
controller), on the real local SLURM cluster: the first array runs on, and ``status`` from another
shell says that the units never submitted wait for ``resume``, which submits them while it runs.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import replay_specs
from tests.slurm_cluster import require_cluster
from tests.slurm_sweeps import cli, unit_jobs

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def _refusing_the_second_sbatch(folder: Path) -> dict[str, str]:
    """An environment whose sbatch refuses its second job (the second array) as a site's per-user
    job limit does, and hands every other one to the real sbatch."""
    bin_dir, count = folder / "bin", folder / "sbatch-calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f"#!/bin/sh\necho call >> {count}\n"
        f'if [ "$(wc -l < {count})" -eq 2 ]; then\n'
        "  echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2; exit 1\nfi\n"
        f'exec {shutil.which("sbatch")} "$@"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_units_a_later_array_left_unsubmitted_are_said_with_the_resume_that_submits_them_while_the_first_runs(
    tmp_path: Path,
) -> None:
    spec = replay_specs(tmp_path, lambda k: 0.0, "slurm")["instant"]
    held = {"kind": "slurm", "slurm_partition": "cpu", "gpus_per_node": 0}
    held["slurm_additional_parameters"] = {"hold": True}  # the first array waits while the test looks
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "executor": held}))
    sweep = tmp_path / "sweep"
    env = _refusing_the_second_sbatch(tmp_path)
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "3", "--max-array-size", "1", env=env)
    try:
        assert r.returncode == 0 and "2 units were not submitted: " in r.stderr, r.stderr
        shown = cli("status", str(sweep))
        said = f"to submit the 2 units never submitted while the others run on: tilesweep resume {sweep}"
        assert shown.returncode == 1 and shown.stdout.splitlines()[-1] == said, shown.stdout
        resumed = cli("resume", str(sweep))
        assert resumed.returncode == 0 and "submitted 2 units" in resumed.stdout, resumed.stdout + resumed.stderr
        assert len(unit_jobs(sweep)) == 3
        assert "resume" not in cli("status", str(sweep)).stdout.splitlines()[-1]
    finally:
        cli("cancel", str(sweep))
