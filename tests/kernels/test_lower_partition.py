"""What ``plan --lower`` refuses of the lowering array's partition (``executor.lower_partition``)
on the real local SLURM cluster: in one line naming the spec's field and what to do, before
sbatch (whose words name neither) and before the sweep directory is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import assert_one_line_error, run_cli
from tests.kernels.test_lower_reruns import SPEC
from tests.slurm_cluster import require_cluster

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize(
    ("executor", "said"),
    [
        (
            {"lower_partition": "nosuch"},
            'executor.lower_partition "nosuch" is not a partition of this cluster (scontrol: Partition nosuch not '
            "found); name one that `sinfo -s` lists, or leave it out to use this machine's CPUs",
        ),
        (
            {"lower_partition": "short"},
            "executor.timeout_min 5 is over the time limit of partition short (00:01:00, 1 min), which each task "
            "of the lowering array asks for; lower executor.timeout_min, or name a partition that allows it in "
            "executor.lower_partition (`sinfo -s` lists their limits)",
        ),
        (
            {"lower_partition": "cpu", "cpus_per_task": 4096},
            "executor.cpus_per_task 4096 is more than any node of partition cpu has",
        ),
    ],
)
def test_a_lowering_array_the_partition_cannot_take_is_refused_in_one_line_before_sbatch(
    tmp_path: Path, executor: dict[str, Any], said: str
) -> None:
    require_cluster()
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    given = {"kind": "slurm", "slurm_partition": "gpu", "cpus_per_task": 1, "timeout_min": 5, **executor}
    spec.write_text(json.dumps({**SPEC, "executor": given, "output": str(tmp_path / "out.json")}))
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1", timeout=300)
    line = assert_one_line_error(r, said)
    assert "sbatch" not in line and not sweep.exists()
    if executor["lower_partition"] == "cpu":  # the field to change is the lowering array's partition
        assert "name a partition with larger nodes in executor.lower_partition" in line, line
