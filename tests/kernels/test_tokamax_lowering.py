"""Pre-flight lowering of tokamax's kernels on this CPU for a named GPU (``tilesweep plan --lower``):
the Mosaic GPU compiler's shared-memory refusal of a tokamax config, with the byte count tokamax's
own lowering of that config gives, recorded as pruned; the same verdicts for H100 and H200; on a
B200 tokamax's sm100 kernels (tcgen05) lowered and refused the same way, with tokamax's own
refusal of an sm100 config beside the compiler's; and tokamax's Triton op lowered for H100, H200
and B200."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kernels import devices
from kernels import tokamax_meta as meta
from orchestrator.planning import PRUNED
from orchestrator.spec.files import spec_from_data
from orchestrator.store import lowering
from orchestrator.store.sweepdir import SweepDir
from tests.helpers import run_cli

pytest.importorskip("tokamax", reason=meta.missing("tests of tokamax's kernels"))

from kernels import preflight, tokamax_ops  # noqa: E402  (needs tokamax)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")]

SHAPE: dict[str, Any] = {"dtypes": ["bfloat16"], "head_dims": [128], "seq_lens": [2048], "batch": 4, "heads": 8}
# block_kv 64 with 4 stages fits at head_dim 128 (it is in tokamax's own list); 256 with 4 stages does not
FWD = {"block_q": [128], "block_kv": [64, 256], "num_stages": [4], "persistent": [False]}
SMEM = re.compile(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)")
P = meta.Problem(batch=4, seq=2048, heads=8, head_dim=128, dtype="bfloat16")
BIG = {"block_q": 128, "block_kv": 256, "num_stages": 4, "fold_q_sequence_heads": False, "split_k": 1}


def _tokamax_refusal(kind: str) -> int:
    """The bytes the Mosaic GPU compiler reports for 128/256/s4 lowered through tokamax's op alone."""
    with pytest.raises(ValueError, match="exceeds available shared memory") as err:
        tokamax_ops.lower("tokamax-mosaic", "fwd", {**BIG, "persistent": False}, P, devices.get(kind))
    found = SMEM.search(str(err.value))
    assert found is not None
    return int(found.group(1))


def test_lowering_for_h100_and_h200_prunes_what_the_compiler_refuses(tmp_path: Path) -> None:
    data = {**SHAPE, "modes": ["fwd"], "grid": {"fwd": FWD}, "output": str(tmp_path / "out.json")}
    data["kernel"] = {"impl": "tokamax-mosaic", "device_kind": "NVIDIA H200"}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data))
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1")
    assert r.returncode == 0, r.stderr
    assert "2 lowered, 1 refused (1 for shared memory), 0 crashed" in r.stdout
    verdicts = lowering.read_verdicts(sweep, spec_from_data(data).fingerprint(), "NVIDIA H200")
    refused = [v for v in verdicts.values() if v.verdict == "refused"]
    assert len(refused) == 1 and refused[0].smem_bytes == _tokamax_refusal("NVIDIA H200") == _tokamax_refusal(
        "NVIDIA H100 80GB HBM3"
    )
    pruned = [it for it in SweepDir.open(sweep).items() if it.kind == PRUNED]
    assert [(it.fields() or {}).get("block_kv") for it in pruned] == [256]
    assert pruned[0].reason is not None and "LoweringRefused: ValueError" in pruned[0].reason


@pytest.mark.parametrize("kind", ["NVIDIA H100", "NVIDIA H200", "NVIDIA B200"])
def test_tokamaxs_triton_op_lowers_for_each_named_gpu(kind: str) -> None:
    fields = {"block_q": 64, "block_k": 64, "num_stages": 2, "num_warps": 4, "split_k": 1, "pack_mask": False}
    shape: dict[str, Any] = {"batch": 1, "seq": 256, "heads": 2, "head_dim": 64, "dtype": "bfloat16"}
    kernels = preflight.lower("tokamax-triton", "fwd", fields, device=devices.get(kind), **shape)
    assert len(kernels) == 1 and kernels[0][1] is None  # Triton sizes shared memory only when PTX is compiled


def test_lowering_for_b200_lowers_tokamaxs_sm100_kernels_and_prunes_what_they_refuse(tmp_path: Path) -> None:
    fwd = {"block_q": [128, 256], "block_kv": [128, 256], "num_stages": [4], "collective": [False, True]}
    data = {**SHAPE, "modes": ["fwd"], "grid": {"fwd": {**fwd, "persistent": ["static"]}}}
    data.update(output=str(tmp_path / "out.json"), kernel={"impl": "tokamax-mosaic", "device_kind": "NVIDIA B200"})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data))
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1")
    assert r.returncode == 0, r.stderr
    assert "for NVIDIA B200 (sm_100" in r.stdout and "2 lowered, 5 refused (3 for shared memory), 0 crashed" in r.stdout
    verdicts = lowering.read_verdicts(sweep, spec_from_data(data).fingerprint(), "NVIDIA B200")
    items = {it.id: it for it in SweepDir.open(sweep).items()}
    lowered = [v for v in verdicts.values() if v.verdict == "lowered"]
    assert {k for v in lowered for k, _ in v.kernels} == {"flash_attention_sm100"}  # the auto config's and 128/128's
    errors = {(v.error or "").split(": ", 1)[1].split(" Got")[0] for v in verdicts.values() if v.verdict == "refused"}
    assert any(e.startswith("Mosaic GPU kernel exceeds available shared memory") for e in errors)
    # tokamax's own check of an sm100 config as a whole (block_q 128, collective: 64 per CTA) is
    # made at plan time: those two are invalid, never lowered
    tmem = "(config): Value error, For SM100 attention forward, block_q per CTA must be at least 128 to support TMEM"
    invalid = [it for it in items.values() if it.kind == "invalid"]
    assert len(invalid) == 2 and all(tmem in (it.reason or "") for it in invalid)
    pruned = {it.id for it in items.values() if it.kind == PRUNED}
    assert pruned == {v.id for v in verdicts.values() if v.verdict == "refused"} and len(pruned) == 5
    assert all(items[i].impl == "tokamax-mosaic-sm100" for i in pruned)


def test_tokamaxs_triton_op_is_never_said_to_be_pruned_for_shared_memory_by_its_lowering(tmp_path: Path) -> None:
    """Triton sizes shared memory when the GPU compiles PTX: a config far over it (float32,
    head_dim 256, 128/128 tiles, 4 stages) lowers. impls, plan and plan --lower each say that its
    lowering sizes none, and that such a config fails on the GPU as an error record; a Mosaic GPU
    op's say nothing of it."""
    listed = {d["name"]: d for d in json.loads(run_cli("impls", "--json").stdout)}
    assert not listed["tokamax-triton"]["lowering_sizes_smem"] and listed["tokamax-mosaic"]["lowering_sizes_smem"]
    text = run_cli("impls").stdout
    assert "pruning: compiler's verdict (plan --lower), which sizes no shared memory: a config over it fails " in text
    assert text.count("which sizes no shared memory") == 1, text  # tokamax-triton's only
    fwd = {"block_q": [128], "block_k": [128], "num_stages": [4], "num_warps": [4]}
    data = {**SHAPE, "dtypes": ["float32"], "head_dims": [256], "seq_lens": [1024], "batch": 1, "heads": 2}
    data.update(modes=["fwd"], grid={"fwd": fwd}, output=str(tmp_path / "out.json"), kernel={"impl": "tokamax-triton"})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data))
    plan = run_cli("plan", str(spec), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    said = 'kernel.impl "tokamax-triton" has no shared-memory model, and its lowering sizes none (a config over it '
    assert said in plan.stderr, plan.stderr
    r = run_cli("plan", str(spec), "--lower", "--dry-run", "--lower-workers", "1")
    assert r.returncode == 0, r.stderr
    assert (
        "2 lowered, 0 refused (its lowering sizes no shared memory: a config over it fails to compile on the GPU, "
        "an error record), 0 crashed" in r.stdout
    ), r.stdout
