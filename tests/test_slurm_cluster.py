"""submitit against the real local SLURM cluster: the behaviour dispatch relies on.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
See docs/slurm-notes.md for what these pin down and why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import submitit

from tests.slurm_cluster import REPO, poll, require_cluster

pytestmark = pytest.mark.slurm

# accounting is written asynchronously by slurmdbd: sacct lags squeue by ~1-2 s
SACCT_WAIT_S = 30.0
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


@pytest.fixture
def executor(tmp_path: Path) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=tmp_path / "logs", cluster="slurm")
    # timeout_min 5: with submitit's --signal=USR2@90 a limit of 1 or 2 minutes sends USR2 within
    # the first seconds, before submitit's handler exists, and kills a slow-starting task
    # (slurm/presets/README.md)
    ex.update_parameters(
        slurm_partition="gpu",
        gpus_per_node=1,
        timeout_min=5,
        name="tilesweep-test",
        slurm_array_parallelism=4,
    )
    return ex


def square(x: int) -> int:
    return x * x


def gpu_env(_: int) -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """JobID -> first word of State ("CANCELLED by 0" -> "CANCELLED"), one sacct call."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(arrays)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    states = {}
    for line in out.splitlines():
        jid, _, state = line.partition("|")
        states[jid] = state.split()[0] if state else ""
    return states


def test_map_array_runs_as_one_array_with_results(executor: submitit.AutoExecutor) -> None:
    jobs = executor.map_array(square, range(4))
    array_id = jobs[0].job_id.split("_")[0]
    assert [j.job_id for j in jobs] == [f"{array_id}_{i}" for i in range(4)]
    assert [j.result() for j in jobs] == [0, 1, 4, 9]
    sbatch = jobs[0].paths.submission_file.read_text()
    assert "#SBATCH --array=0-3%4" in sbatch
    assert "#SBATCH --partition=gpu" in sbatch
    assert "#SBATCH --gpus-per-node=1" in sbatch
    # one sbatch file per array, shared by its tasks; logs are per task
    assert jobs[0].paths.submission_file == jobs[3].paths.submission_file
    assert jobs[2].paths.stdout.name == f"{array_id}_2_0_log.out"


def test_tasks_get_a_fake_gpu_and_sacct_reports_them(executor: submitit.AutoExecutor) -> None:
    jobs = executor.map_array(gpu_env, range(4))
    assert all(j.result() != "" for j in jobs), "CUDA_VISIBLE_DEVICES unset in a 1-GPU task"
    ids = [j.job_id for j in jobs]

    def all_completed() -> dict[str, str] | None:
        states = sacct_states(ids)
        return states if all(states.get(i) == "COMPLETED" for i in ids) else None

    states = poll(all_completed, SACCT_WAIT_S, f"sacct to show {ids} COMPLETED")
    assert set(ids) <= set(states)
    # submitit's own watcher, forced, agrees once accounting has caught up
    assert jobs[0].watcher.get_state(ids[0], mode="force") == "COMPLETED"


def test_job_that_sigkills_itself_is_failed(executor: submitit.AutoExecutor) -> None:
    job = executor.submit(kill_self)

    def terminal_state() -> str | None:
        state = job.watcher.get_state(job.job_id, mode="force")
        return state if state.split()[0] in TERMINAL else None

    assert poll(terminal_state, SACCT_WAIT_S, f"job {job.job_id} to end") == "FAILED"
    # no result file is ever written: submitit waits its results timeout (15 s), then raises
    job._results_timeout_s = 2  # private knob, only to keep this test fast
    with pytest.raises(submitit.core.utils.UncompletedJobError, match="has not produced any output"):
        job.result()


def test_presets_are_valid_executor_parameters(tmp_path: Path) -> None:
    presets = sorted((REPO / "slurm" / "presets").glob("*.json"))
    assert {p.name for p in presets} >= {"local.json", "h100-example.json"}
    for path in presets:
        ex = submitit.AutoExecutor(folder=tmp_path / path.stem, cluster="slurm")
        ex.update_parameters(**json.loads(path.read_text()))  # NameError on an unknown key


def test_local_preset_runs_a_task(tmp_path: Path) -> None:
    ex = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    ex.update_parameters(**json.loads((REPO / "slurm" / "presets" / "local.json").read_text()))
    job = ex.submit(square, 3)
    assert job.result() == 9
    sbatch = job.paths.submission_file.read_text()
    assert "#SBATCH --mem=2GB" in sbatch and "#SBATCH --cpus-per-task=1" in sbatch
