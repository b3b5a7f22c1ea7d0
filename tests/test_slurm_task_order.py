"""The order and sizes of a whole-node task's units, as `submit --dry-run` shows them before
anything runs (its GPUs take the largest first, the smallest are left for the task's end), on the
real local SLURM cluster, whose sbatch checks the dry run's scripts.

Skipped (loudly) without a cluster; a failure instead under ``TILESWEEP_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.slurm_cluster import require_cluster
from tests.slurm_sweeps import cli, write_spec

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def test_a_whole_node_task_starts_its_longest_units_first(tmp_path: Path) -> None:
    """Units of unequal cost in one 4-GPU task: its GPUs take the longest first, so the unit
    left queued for the task's end is a short one (in plan order it would be one of 2 items)."""
    over = {"seq_lens": [64, 1024], "modes": ["fwd"], "fwd_block_q": [16, 32, 64], "sharding": {"units": 5}}
    spec = write_spec(tmp_path, "order.json", {"gpus_per_node": 4}, **over)
    sweep = tmp_path / "sweep"
    assert cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    planned = [u["n_items"] for u in json.loads((sweep / "units.json").read_text())]
    assert planned[-1] == 2 and sorted(planned, reverse=True) == [2, 2, 2, 1, 1], planned
    dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    (task,) = [line for line in dry.stdout.splitlines() if line.strip().startswith("task 0:")]
    turns = re.findall(r"\((\d+) items?, (GPU slot \d|queue #\d)\)", task)
    assert [int(n) for n, _ in turns] == [2, 2, 2, 1, 1], task
    assert turns[-1] == ("1", "queue #1"), task


def test_a_whole_node_tasks_units_shrink_towards_its_end(tmp_path: Path) -> None:
    """A 2-GPU task of the planner's default units: the units its GPUs take first are its
    largest, those left for its end its smallest (``ExecutorSettings.unit_shares``), so a unit
    that runs long keeps the other GPU idle for a small unit's time, not a whole one's."""
    grid = {
        "fwd_block_q": [16, 32, 64, 128],
        "fwd_block_k": [16, 32, 64, 128],
        "fwd_stages": [1, 2],
        "fwd_warps": [4, 8],
    }
    spec = write_spec(tmp_path, "taper.json", {"gpus_per_node": 2}, modes=["fwd"], seq_lens=[256, 1024], **grid)
    dry = cli("submit", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    (task,) = [line for line in dry.stdout.splitlines() if line.strip().startswith("task 0:")]
    sizes = [int(n) for n in re.findall(r"\((\d+) items?, (?:GPU slot \d|queue #\d)\)", task)]
    assert len(sizes) == 8, task  # 4 units per GPU
    assert sorted(sizes[-2:]) == sorted(sizes)[:2], task
    assert sum(sizes[:2]) >= 3 * sum(sizes[-2:]), task
