"""The cost model and measured costs: consistent with the timing harness and the reference run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ResultsError
from orchestrator.planning import RUN, costs, expand
from orchestrator.spec import records
from orchestrator.spec.model import SweepSpec
from orchestrator.store import document


def test_planner_and_kernel_rules_import_without_jax() -> None:
    """The planner uses the kernel's own ``auto`` and ``inner`` rules (kernels.config), not
    copies of them, and still runs on a login node without jax."""
    import subprocess
    import sys

    code = (
        "import sys, orchestrator.planning, orchestrator.planning.costs, kernels.config, kernels.smem; "
        "sys.exit('jax' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "jax was imported"
    from kernels import config, timing

    assert costs.inner_for is config.inner_for and timing.inner_for is config.inner_for


def test_model_agrees_with_the_reference_run(sample_doc: dict[str, Any]) -> None:
    spec = SweepSpec(**sample_doc["config"])
    items = expand(spec)
    cost, scale = costs.item_costs(items, spec)
    assert scale == 1.0
    run = [it for it in items if it.kind == RUN]
    compile_total = 0.0
    for it in run:
        cfg = (
            costs.auto_estimate(it.mode, it.dtype, it.head_dim, it.seq, spec.smem_limit_bytes)
            if it.config == "auto"
            else it.kernel_config()
        )
        assert cfg is not None
        compile_total += costs.compile_estimate(it.mode, it.dtype, it.head_dim, it.seq, cfg)
    # The whole reference run compiled for 427 s (its records' compile_s summed).
    assert 0.8 * 427 < compile_total < 1.2 * 427
    # Per record of the excerpt, model and measurement agree within a factor of 2.5, and
    # per class within 20%.
    by_key = {records.record_key(it.record_fields()): cost[it.index] for it in run}
    sums: dict[tuple[str, str], list[float]] = {}
    for rec in sample_doc["results"]:
        measured = costs.measured_cost(rec, repeats=spec.repeats, warmup=spec.timing.warmup)
        if measured is None:
            continue
        model = by_key[records.record_key(rec)]
        assert 0.4 < model / measured < 2.5, rec
        s = sums.setdefault((rec["dtype"], rec["mode"]), [0.0, 0.0])
        s[0] += model
        s[1] += measured
    assert len(sums) == 3
    for cls, (model, measured) in sums.items():
        assert 0.8 < model / measured < 1.2, cls


def test_cost_grows_with_tiles_warps_and_mode() -> None:
    big = costs.compile_estimate("fwd", "float32", 128, 2048, {"block_q": 128, "block_k": 128, "num_warps": 4})
    small = costs.compile_estimate("fwd", "float32", 128, 2048, {"block_q": 32, "block_k": 32, "num_warps": 4})
    wide = costs.compile_estimate("fwd", "float32", 128, 2048, {"block_q": 128, "block_k": 128, "num_warps": 8})
    bwd = costs.compile_estimate(
        "fwd_bwd",
        "float32",
        128,
        2048,
        {"block_q": 128, "block_k": 128, "num_warps": 8, "bwd_outer": 64, "bwd_inner": 64},
    )
    assert small < wide < big and bwd > wide
    # blocks larger than seq are clamped, as the kernel clamps them
    assert costs.compile_estimate(
        "fwd", "bfloat16", 64, 32, {"block_q": 128, "block_k": 128}
    ) == costs.compile_estimate("fwd", "bfloat16", 64, 32, {"block_q": 32, "block_k": 32})
    spec = SweepSpec()
    short = costs.timed_estimate("fwd", "bfloat16", 4, 8, 2048, 64, spec)
    long = costs.timed_estimate("fwd_bwd", "float32", 4, 8, 16384, 128, spec)
    assert 0.1 < short < long


def test_load_costs_reads_measurements_and_refuses_non_documents(sample_doc: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(sample_doc))
    table = document.load_costs(path)
    rec = sample_doc["results"][0]
    assert table.get(rec) == pytest.approx(rec["compile_s"] + (1 + 2 + 5 * rec["inner"]) * rec["median_ms"] / 1e3)
    # a tag is a label: the same config under another tag has the same cost
    assert table.get({**rec, "tag": "other"}) == table.get(rec)
    failed = next(r for r in sample_doc["results"] if "error" in r)
    assert table.get(failed) is None
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ResultsError, match="not a results document"):
        document.load_costs(bad)
    with pytest.raises(ResultsError, match="--costs .*missing.json: no such file"):
        document.load_costs(tmp_path / "missing.json")
