"""What ``plan --lower`` refuses of the lowering array's partition (``executor.lower_partition``)
on the real local SLURM cluster: in one line naming the spec's field and what to do, before
sbatch (whose words name neither) and before the sweep directory is written; and how the array it
takes counts its configs and CPUs."""

from __future__ import annotations

import json
import re
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


def test_a_lowering_of_one_config_says_one_config_and_counts_its_cpus_as_a_line_says_them(tmp_path: Path) -> None:
    """The lowering array's submission and its task's log count its configs and its CPUs as a
    line says them: 1 config, not 1 configs."""
    require_cluster()
    spec, sweep = tmp_path / "spec.json", tmp_path / "sweep"
    given = {"kind": "slurm", "slurm_partition": "gpu", "lower_partition": "cpu", "cpus_per_task": 1, "timeout_min": 5}
    one = {**SPEC, "auto_only": True, "executor": given, "output": str(tmp_path / "out.json")}
    spec.write_text(json.dumps(one))
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "-v", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "submitted pre-flight lowering of 1 config as array" in r.stderr, r.stderr
    logs = "".join(p.read_text() for p in (sweep / "logs").glob("*_log.err"))
    said = re.search(r"lowered 1 of 1 config on (\d+) (CPUs?) in", logs)
    assert said is not None, logs
    assert said.group(2) == ("CPU" if said.group(1) == "1" else "CPUs"), said.group(0)
