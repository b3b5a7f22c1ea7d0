"""Pre-flight lowering of jax's Mosaic GPU attention on this CPU, for H100 and H200: the
compiler's verdicts (a shared-memory refusal with its byte count, checked against a direct
lowering of jax's kernel), the verdicts kept in the sweep directory and recorded by the
workers as pruned, and the capability table checked against the installed kernel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.planning import PRUNED, RUN, WorkItem, expand
from orchestrator.spec.files import load_spec, spec_from_data, with_device_kind
from orchestrator.spec.model import SweepSpec
from orchestrator.store import lowering
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import document
from tests.helpers import run_cli

mosaic = pytest.importorskip("kernels.mosaic")
try:
    mosaic.check_available()
except mosaic.MosaicUnavailable as exc:  # scripts/setup-venv.sh installs both
    pytest.skip(f"cannot lower jax's Mosaic GPU kernel here: {exc}", allow_module_level=True)

pytestmark = pytest.mark.slow

# head_dim 128, seq 1024: 64/64 with 4 steps fits (about 160 KiB); 64/256 with 4 steps does not
SPEC: dict[str, Any] = {
    "dtypes": ["float16"],
    "head_dims": [128],
    "seq_lens": [1024],
    "modes": ["fwd"],
    "batch": 1,
    "heads": 1,
    "grid": {"fwd": {"block_q": [64], "block_kv": [64, 256], "max_concurrent_steps": [4]}},
}
SMEM = re.compile(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)")


def _direct_refusal(device_kind: str) -> int:
    """The bytes jax's own attention_mgpu reports for 64/256/4, lowered here without tilesweep."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    cfg = am.TuningConfig(block_q=64, block_kv=256, max_concurrent_steps=4)
    q = jax.ShapeDtypeStruct((1, 1024, 1, 128), jnp.float16)
    mesh = AbstractMesh(
        (1,), ("x",), abstract_device=AbstractDevice(device_kind=device_kind, num_cores=132, platform="cuda")
    )
    with use_abstract_mesh(mesh), pytest.raises(ValueError, match="exceeds available shared memory") as err:
        jax.jit(lambda q, k, v: am.attention(q, k, v, cfg)).trace(q, q, q).lower(lowering_platforms=("cuda",))
    found = SMEM.search(str(err.value))
    assert found is not None
    return int(found.group(1))


def test_lowering_for_h100_and_h200_prunes_what_the_compiler_refuses(tmp_path: Path) -> None:
    source = tmp_path / "measured.json"
    source.write_text(json.dumps(document({**SPEC, "kernel": {"impl": "mosaic"}, "output": "m.json"})))
    replay = {"source": str(source), "impl": "mosaic"}
    kernel = {"impl": "replay", "device_kind": "NVIDIA H200"}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, "output": str(tmp_path / "out.json"), "kernel": kernel, "replay": replay}))
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1")
    assert r.returncode == 0, r.stderr
    assert "3 lowered" not in r.stdout and "2 lowered, 1 refused (1 for shared memory), 0 crashed" in r.stdout
    h200 = lowering.read_verdicts(sweep, spec_from_data(json.loads(spec.read_text())).fingerprint(), "NVIDIA H200")
    h100 = _lowered_here(with_device_kind(load_spec(spec), "NVIDIA H100"))
    refused = h100["forced", 256]
    assert refused["verdict"] == "refused" and refused["smem_bytes"] == _direct_refusal("NVIDIA H200")
    assert refused["error"].startswith("ValueError: Mosaic GPU kernel exceeds available shared memory")
    assert h100["forced", 64]["verdict"] == h100["auto", None]["verdict"] == "lowered"
    assert 0 < h100["forced", 64]["smem_bytes"] <= 232448
    assert sorted((v.verdict, v.smem_bytes) for v in h200.values()) == sorted(
        (v["verdict"], v["smem_bytes"]) for v in h100.values()
    )
    pruned = [it for it in SweepDir.open(sweep).items() if it.kind == PRUNED]
    assert [it.smem_bytes for it in pruned] == [refused["smem_bytes"]]
    assert pruned[0].reason is not None and "LoweringRefused: ValueError" in pruned[0].reason
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug")
    assert r.returncode == 0, r.stderr
    recs = json.loads((tmp_path / "out.json").read_text())["results"]
    gone = [rec for rec in recs if rec.get("pruned")]
    assert len(recs) == 3 and len(gone) == 1 and gone[0]["block_kv"] == 256
    assert gone[0]["smem_bytes"] == refused["smem_bytes"] and "pre-flight lowering for NVIDIA H200" in gone[0]["error"]


def _lowered_here(spec: SweepSpec) -> dict[tuple[str, Any], dict[str, Any]]:
    """Verdicts of lowering the spec's runnable items in this process, by (config kind, block_kv)."""
    from jobs.lowering import lower_items

    items = {it.id: it for it in expand(spec)}
    found: list[lowering.Verdict] = []
    lower_items(spec, list(items.values()), on_verdict=found.append, mode="threads", workers=1)
    return {(items[v.id].config, (items[v.id].fields() or {}).get("block_kv")): v.line() for v in found}


def _lower(mode: str, fields: dict[str, Any] | None, **shape: Any) -> list[tuple[str, int | None]]:
    from kernels import devices, preflight

    problem = {"batch": 1, "seq": 256, "heads": 2, "head_dim": 64, "dtype": "float16", **shape}
    return preflight.lower("mosaic", mode, fields, device=devices.get("NVIDIA H100"), **problem)


BWD = {"compute_wgs_bwd": 1, "block_q_dkv": 64, "block_kv_dkv": 64, "block_q_dq": 64, "block_kv_dq": 64}
FWD = {"block_q": 64, "block_kv": 64, "max_concurrent_steps": 2, "use_schedule_barrier": True}


def test_the_capability_table_is_what_the_installed_kernel_lowers() -> None:
    from kernels.impl_mosaic import CAPABILITIES

    assert CAPABILITIES.dtypes == ("float16",) and CAPABILITIES.causal_modes == ("fwd",)
    with pytest.raises(ValueError, match="Expected dtypes to match"):  # bfloat16: refused when traced
        _lower("fwd", FWD, dtype="bfloat16")
    with pytest.raises(NotImplementedError, match="backwards pass"):
        _lower("fwd_bwd", {**FWD, **BWD}, causal=True)
    assert len(_lower("fwd", FWD, causal=True)) == 1
    assert CAPABILITIES.grouped_query and len(_lower("fwd_bwd", {**FWD, **BWD}, kv_heads=1)) == 3


def test_a_lowering_that_crashes_is_a_verdict_not_a_stop() -> None:
    from jobs.lowering import lower_item

    spec = spec_from_data({**SPEC, "seq_lens": [256], "kernel": {"impl": "mosaic"}, "modes": ["fwd_bwd"], "grid": None})
    params = (64, 64, 2, True, 0, 64, 64, 64, 64)  # compute_wgs_bwd 0, which the spec itself refuses
    item = WorkItem(0, "float16", 128, 256, 1, 1, "", "fwd_bwd", "forced", params, "x0", RUN, impl="mosaic")
    verdict = lower_item(item, spec).verdict
    assert verdict is not None and verdict.verdict == "crashed" and verdict.error is not None
    assert verdict.error.startswith("ZeroDivisionError")


def test_verdict_files_keep_the_last_verdict_of_this_sweep_and_target(tmp_path: Path) -> None:
    header = lowering.lowering_header("fp", "NVIDIA H200", {"jax": "x"})
    with lowering.VerdictWriter(tmp_path, header) as w:
        w.write(lowering.Verdict("a", "lowered", [("entry", 100)], smem_bytes=100))
        w.write(lowering.Verdict("b", "refused", smem_bytes=300000, error="ValueError: too big"))
        w.write(lowering.Verdict("a", "crashed", error="ZeroDivisionError"))
    with lowering.VerdictWriter(tmp_path, lowering.lowering_header("other", "NVIDIA H200", {})) as w:
        w.write(lowering.Verdict("b", "lowered"))
    with open(tmp_path / lowering.FILE, "a") as f:
        f.write('{"id": "c", "verd')  # a torn last line
    found = lowering.read_verdicts(tmp_path, "fp", "NVIDIA H200")
    assert {k: v.verdict for k, v in found.items()} == {"a": "crashed", "b": "refused"}
    assert lowering.read_verdicts(tmp_path, "fp", "NVIDIA H100") == {}


def test_lowering_without_the_cuda_plugin_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax._src import lib

    from orchestrator.cli.lower import _check_can_lower
    from orchestrator.errors import PlanError

    monkeypatch.setattr(lib, "cuda_versions", None)
    with pytest.raises(PlanError) as err:
        _check_can_lower(spec_from_data({**SPEC, "kernel": {"impl": "mosaic"}}))
    assert "\n" not in err.value.message and 'pip install --no-deps "jax-cuda12-plugin==' in err.value.message


def test_lower_json_has_a_line_for_every_config_of_the_plan(tmp_path: Path) -> None:
    """``plan --lower --dry-run --json``: one object per config, as ``plan --dry-run --json``
    gives them; the configs not lowered (pruned by the shared-memory model, invalid) with no
    verdict."""
    data = {
        "output": str(tmp_path / "out.json"),
        "dtypes": ["bfloat16"],
        "head_dims": [64],
        "seq_lens": [256],
        "modes": ["fwd"],
        "batch": 1,
        "heads": 1,
        "grid": {"fwd": {"block_q": [64, 256], "block_k": [64, 256], "num_stages": [2, 8], "num_warps": [4]}},
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data))
    planned = [json.loads(line) for line in run_cli("plan", str(spec), "--dry-run", "--json").stdout.splitlines()]
    r = run_cli("plan", str(spec), "--lower", "--dry-run", "--json", "--lower-workers", "1")
    assert r.returncode == 0, r.stderr
    lowered = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lowered) == len(planned) and any(p["pruned"] for p in planned)
    assert all((line["lowering"] is None) == line["pruned"] for line in lowered)
