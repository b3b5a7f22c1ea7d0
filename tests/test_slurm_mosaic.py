"""jax's Mosaic GPU kernel on the real local SLURM cluster: pre-flight lowering as a CPU job
array (``executor.lower_partition``), and a replayed sweep (``kernel.impl: replay``,
``replay.impl: mosaic``) with its own config fields through the job array, the partials, the
final merge job and the report. Skipped (loudly) without a cluster; a failure instead under
``TILESWEEP_REQUIRE_SLURM=1``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.planning import PRUNED
from orchestrator.store import lowering
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import document
from tests.helpers import MOSAIC_SPEC, assert_one_line_error, run_cli
from tests.slurm_cluster import require_cluster

pytestmark = pytest.mark.slurm

EXECUTOR = {"kind": "slurm", "slurm_partition": "cpu", "cpus_per_task": 1, "timeout_min": 5, "merge_partition": "cpu"}


def test_a_replayed_mosaic_sweep_runs_on_the_cluster(tmp_path: Path) -> None:
    require_cluster()
    source = tmp_path / "measured.json"
    source.write_text(json.dumps(document({**MOSAIC_SPEC, "output": "measured.json"}, seed=5)))
    out = tmp_path / "replayed.json"
    spec = tmp_path / "spec.json"
    replay = {"source": str(source), "impl": "mosaic"}
    data = {**MOSAIC_SPEC, "output": str(out), "kernel": {"impl": "replay"}, "replay": replay, "executor": EXECUTOR}
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


def test_lowering_runs_as_a_cpu_job_array_and_prunes_what_it_refused(tmp_path: Path) -> None:
    require_cluster()
    grid = {"fwd": {"block_q": [64], "block_kv": [64, 256], "max_concurrent_steps": [4]}}
    data = {**MOSAIC_SPEC, "modes": ["fwd"], "head_dims": [128], "seq_lens": [1024], "heads": 1, "grid": grid}
    executor = {**EXECUTOR, "slurm_partition": "gpu", "lower_partition": "cpu"}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**data, "output": str(tmp_path / "out.json"), "executor": executor}))
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "as job array" in r.stderr and "partition cpu" in r.stdout
    assert "2 lowered, 1 refused (1 for shared memory), 0 crashed" in r.stdout
    task = (sweep / lowering.task_file(0)).read_text().splitlines()
    assert json.loads(task[-1]) == {"lowering_end": 3} and json.loads(task[0])["device_kind"] == "NVIDIA H100"
    pruned = [it for it in SweepDir.open(sweep).items() if it.kind == PRUNED]
    fields = pruned[0].fields() if len(pruned) == 1 else None
    assert fields is not None and fields["block_kv"] == 256
    assert pruned[0].smem_bytes is not None and pruned[0].smem_bytes > 232448
    assert pruned[0].reason is not None and "LoweringRefused" in pruned[0].reason
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), timeout=300)
    assert r.returncode == 0 and "nothing to lower" in r.stdout, (r.stdout, r.stderr)
    r = run_cli("plan", str(spec), "--dry-run", "--sweep-dir", str(sweep))  # the plan counts what lowering refused
    assert r.returncode == 0 and "1 refused by pre-flight lowering" in r.stdout, (r.stdout, r.stderr)


def test_a_spec_the_kernel_cannot_plan_is_named_by_submit_and_resume(tmp_path: Path) -> None:
    """``submit`` refuses a spec file the kernel cannot plan in one line naming the file, as ``plan``
    and ``run`` do; ``resume`` of a sweep whose frozen spec the kernel cannot plan (a jax that took it
    planned it) names the file that spec is kept in, the sweep's sweep.json."""
    require_cluster()
    spec = tmp_path / "spec.json"
    data = {**MOSAIC_SPEC, "output": str(tmp_path / "out.json"), "executor": EXECUTOR}
    spec.write_text(json.dumps({**data, "head_dims": [96]}))
    fix = 'kernel.impl "mosaic": head_dims [96] cannot be planned'
    assert_one_line_error(run_cli("submit", str(spec), "--sweep-dir", str(tmp_path / "no")), f"error: {spec}: {fix}")
    assert not (tmp_path / "no").exists()
    spec.write_text(json.dumps(data))
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    frozen = sweep / "sweep.json"
    meta = json.loads(frozen.read_text())
    frozen.write_text(json.dumps({**meta, "spec": {**meta["spec"], "head_dims": [96]}}))
    assert_one_line_error(run_cli("resume", str(sweep)), f"error: {frozen}: {fix}")
    assert not list((sweep / "logs").glob("*")) and run_cli("status", str(sweep)).returncode != 2
