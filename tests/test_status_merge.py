"""What ``status`` says of a sweep's merge where sbatch refused its final merge job at submission
(``jobs.jsonl``'s ``merge_job_refused`` line): no merge job follows the units while they run, and
the earlier merge job of a sweep submitted before is no longer what merges it; and a merge job whose
state SLURM could not give. The real cluster's refusal, read from another shell, is in
``test_slurm_merge_job.py``."""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.control.scheduler import SchedulerView, TaskState
from orchestrator.control.status import format_status, sweep_status
from orchestrator.store.synthetic import build_sweep, small_spec
from tests.helpers import scheduler_view

WHY = "sbatch refused the job: sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"


def test_a_final_merge_job_sbatch_refused_after_an_earlier_one_is_what_status_says_until_one_is_submitted(
    tmp_path: Path,
) -> None:
    """A resubmission whose final merge job sbatch refused: the earlier merge job ended, none follows
    the new array; status says so while it runs, and no more once a later submission's job follows."""
    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=2), 2, write_partials=[0], output=tmp_path / "o.json")
    now = time.time()
    sd.record_jobs(
        [
            {"unit": units[0].id, "executor": "slurm", "job_id": "50_0", "array_id": "50", "submitted_ts": now},
            {"event": "merge_job", "job_id": "51", "after": ["50"], "submitted_ts": now},
            {"unit": units[1].id, "executor": "slurm", "job_id": "52_0", "array_id": "52", "submitted_ts": now},
            {"event": "merge_job_refused", "after": ["52"], "why": WHY, "ts": now},
        ]
    )
    view = scheduler_view(
        j50_0=TaskState("COMPLETED", "sacct"),
        j51=TaskState("COMPLETED", "sacct"),
        j52_0=TaskState("PENDING", "squeue", "Priority"),
    )
    st = sweep_status(sd, view=view)
    lines = format_status(st).splitlines()
    said = (
        f"final merge: not submitted ({WHY}), so no merge job follows the units; "
        f"once they end, `tilesweep wait {sd.root}` or `tilesweep merge {sd.root}` merges"
    )
    assert said in lines and not any(line.startswith("final merge: job") for line in lines), lines
    assert st.to_json()["merge_refused"] == WHY and not st.command_left  # status exits 0: the unit runs on
    sd.record_jobs([{"event": "merge_job", "job_id": "53", "after": ["54"], "submitted_ts": time.time()}])
    later = sweep_status(sd, view=scheduler_view(j53=TaskState("PENDING", "squeue", "Dependency")))
    assert "final merge: job 53 pending (Dependency)" in format_status(later).splitlines()
    assert later.merge_refused is None, format_status(later)


def test_a_final_merge_job_neither_squeue_nor_sacct_answered_of_is_not_said_missing_from_them(tmp_path: Path) -> None:
    """squeue and sacct asked, neither answering (off PATH, the controller down): the merge job's
    state is unknown, not "not in squeue/sacct", which reads as a job SLURM lost."""
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "o.json")
    sd.record_jobs([{"event": "merge_job", "job_id": "51", "after": ["50"], "submitted_ts": time.time()}])
    notes = ["squeue: `squeue` is not on PATH", "sacct: `sacct` is not on PATH"]
    st = sweep_status(sd, view=SchedulerView(asked=True, squeue_ok=False, sacct_ok=False, notes=notes))
    assert "final merge: job 51 (squeue and sacct could not be asked)" in format_status(st).splitlines()
