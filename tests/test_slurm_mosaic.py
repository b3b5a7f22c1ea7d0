"""A replayed sweep of jax's Mosaic GPU kernel (``kernel.impl: replay``, ``replay.impl:
mosaic``) on the real local SLURM cluster: its own config fields through the job array, the
partials, the final merge job and the report. Skipped (loudly) without a cluster; a failure
instead under ``TILESWEEP_REQUIRE_SLURM=1``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.store.synthetic import document
from tests.helpers import run_cli
from tests.slurm_cluster import require_cluster
from tests.test_mosaic import MOSAIC

pytestmark = pytest.mark.slurm

EXECUTOR = {"kind": "slurm", "slurm_partition": "cpu", "cpus_per_task": 1, "timeout_min": 5, "merge_partition": "cpu"}


def test_a_replayed_mosaic_sweep_runs_on_the_cluster(tmp_path: Path) -> None:
    require_cluster()
    source = tmp_path / "measured.json"
    source.write_text(json.dumps(document({**MOSAIC, "output": "measured.json"}, seed=5)))
    out = tmp_path / "replayed.json"
    spec = tmp_path / "spec.json"
    replay = {"source": str(source), "impl": "mosaic"}
    data = {**MOSAIC, "output": str(out), "kernel": {"impl": "replay"}, "replay": replay, "executor": EXECUTOR}
    spec.write_text(json.dumps({**data, "sharding": {"units": 2}}))
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"), timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    recs = json.loads(out.read_text())["results"]
    measured = json.loads(source.read_text())["results"]
    assert len(recs) == len(measured) and {rec["impl"] for rec in recs} == {"mosaic"}
    assert len({rec["unit"] for rec in recs}) == 2 and all(
        "block_kv" in rec for rec in recs if rec["config"] == "forced"
    )
    assert "bkv" in r.stdout  # the report names the best configs by the kernel's own fields
