"""The final merge job on the real local SLURM cluster: submitted with the sbatch options of
``executor.slurm_additional_parameters`` a site asks of every job (here a ``comment``, standing in
for a reservation or licenses, which this cluster has none of), and without those that shape the
units' tasks (``cpus_per_gpu``) or hold them (``hold``: its dependency waits for the arrays); and a
sweep whose merge job sbatch refused, said by status from another shell to have no merge job after
its units while they wait, and to be not merged once they ended, with the command that merges
(``wait`` merges it itself)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import replay_specs
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import cli, jobs, status, write_spec

pytestmark = pytest.mark.slurm

SITE = {"slurm_additional_parameters": {"comment": "site-rule", "hold": True, "cpus_per_gpu": 1}}
HELD = {"slurm_additional_parameters": {"hold": True}}
MERGE_SCRIPT = "--- sbatch script of the final merge job"
SBATCH_SAYS = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"
REFUSAL = f"sbatch refused the job: {SBATCH_SAYS}"  # what submit and status say of the merge job


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


def _refusing_merge_jobs(folder: Path) -> dict[str, str]:
    """An environment whose sbatch refuses a job that depends on others (the final merge job), as
    a site's sbatch refuses one its arrays passed, and hands every other job to the real sbatch."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\nfor a; do script=$a; done\n"
        'if grep -q -- --dependency "$script"; then\n'
        f"  echo '{SBATCH_SAYS}' >&2; exit 1\nfi\n"
        f'exec {shutil.which("sbatch")} "$@"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_sweep_whose_merge_job_sbatch_refused_says_so_while_its_units_run_and_not_merged_once_they_end(
    tmp_path: Path,
) -> None:
    """The refusal is the sweep's, not only the submitting shell's: a status from another shell
    while the arrays wait says that no merge job follows them and what merges once they end."""
    spec = replay_specs(tmp_path, lambda k: 0.0, "slurm")["instant"]
    held = {"kind": "slurm", "slurm_partition": "cpu", "gpus_per_node": 0, **HELD}
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "executor": held}))  # released one task at a time
    sweep, output = tmp_path / "sweep", tmp_path / "out.json"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "2", env=_refusing_merge_jobs(tmp_path))
    try:
        assert r.returncode == 0 and "the final merge job was not submitted (sbatch refused" in r.stderr, r.stderr
        queued = cli("status", str(sweep))
        said = (
            f"final merge: not submitted ({REFUSAL}), so no merge job follows the units; "
            f"once they end, `tilesweep wait {sweep}` or `tilesweep merge {sweep}` merges"
        )
        assert queued.returncode == 0 and said in queued.stdout.splitlines(), queued.stdout
        assert status(sweep)["merge_refused"] == REFUSAL
        first = next(e for e in jobs(sweep) if "unit" in e)
        subprocess.run(["scontrol", "release", first["job_id"]], check=True)
        poll(lambda: any(u["state"] == "done" for u in status(sweep)["units"]), 120, "the released task's unit")
    finally:
        cli("cancel", str(sweep))
    poll(lambda: all(u["state"] in ("done", "cancelled") for u in status(sweep)["units"]), 60, "the other unit's end")
    shown = cli("status", str(sweep))
    said = (
        f"not merged (sbatch refused its final merge job): {output} is not written; "
        f"to merge the records done: tilesweep merge {sweep}"
    )
    assert shown.returncode == 1 and said in shown.stdout.splitlines(), shown.stdout
    assert f"final merge: not submitted ({REFUSAL})" in shown.stdout.splitlines(), shown.stdout
    waited = cli("wait", str(sweep))
    assert "merged 1 record (0 errors, 2 of 3 planned missing) into" in waited.stderr, waited.stderr
    assert output.is_file() and "not merged" not in cli("status", str(sweep)).stdout


def test_a_merge_job_scancelled_while_its_units_wait_is_said_with_what_merges_and_status_exits_0(
    tmp_path: Path,
) -> None:
    """A final merge job scancelled from another shell (``scancel -n``, a clean-up of the queue)
    while the arrays wait: status says no merge job follows them and what merges once they end,
    and exits 0 (the units run on, nothing waits for a command yet)."""
    spec = write_spec(tmp_path, "held.json", HELD)
    sweep = tmp_path / "sweep"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    merge_id = next((e["job_id"] for e in jobs(sweep) if e.get("event") == "merge_job"), None)
    try:
        assert r.returncode == 0 and merge_id is not None, r.stderr
        subprocess.run(["scancel", merge_id], check=True)
        poll(lambda: status(sweep)["no_merge_follows"], 60, "status to see the merge job cancelled")
        shown = cli("status", str(sweep))
        said = (
            f"final merge: job {merge_id} cancelled, so no merge job follows the units; "
            f"once they end, `tilesweep wait {sweep}` or `tilesweep merge {sweep}` merges"
        )
        assert shown.returncode == 0 and said in shown.stdout.splitlines(), shown.stdout
    finally:
        cli("cancel", str(sweep))
