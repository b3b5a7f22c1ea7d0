"""The final merge job on the real local SLURM cluster: submitted with the sbatch options of
``executor.slurm_additional_parameters`` a site asks of every job (here a ``comment``, standing in
for a reservation or licenses, which this cluster has none of), and without those that shape the
units' tasks (``cpus_per_gpu``) or hold them (``hold``: its dependency waits for the arrays)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.slurm_cluster import require_cluster
from tests.slurm_sweeps import cli, jobs, write_spec

pytestmark = pytest.mark.slurm

SITE = {"slurm_additional_parameters": {"comment": "site-rule", "hold": True, "cpus_per_gpu": 1}}
MERGE_SCRIPT = "--- sbatch script of the final merge job"


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def test_the_merge_job_takes_the_sites_sbatch_options_but_not_the_tasks_gpus_nor_their_hold(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "site.json", SITE)
    sweep = tmp_path / "sweep"
    dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run")
    assert dry.returncode == 0 and MERGE_SCRIPT in dry.stdout, dry.stdout + dry.stderr
    arrays, merge = dry.stdout.split(MERGE_SCRIPT)
    for option in ("#SBATCH --comment=site-rule", "#SBATCH --hold", "#SBATCH --cpus-per-gpu=1"):
        assert option in arrays, arrays
    assert "#SBATCH --comment=site-rule" in merge and "--hold" not in merge and "gpu" not in merge, merge

    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    merge_id = next((e["job_id"] for e in jobs(sweep) if e.get("event") == "merge_job"), None)
    try:
        assert r.returncode == 0 and "not submitted" not in r.stderr and merge_id is not None, r.stderr
        shown = subprocess.run(["scontrol", "show", "job", merge_id], capture_output=True, text=True, check=True)
        fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
        assert fields["Comment"] == "site-rule" and fields["Partition"] == "cpu", shown.stdout
        assert fields["Reason"] == "Dependency" and fields["Priority"] != "0", shown.stdout  # queued, not held
    finally:
        cli("cancel", str(sweep))
        if merge_id is not None:
            subprocess.run(["scancel", merge_id], check=False)
