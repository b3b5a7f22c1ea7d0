"""The shared-memory model against the reference run (``auto_config`` against it: test_config)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from kernels import smem
from kernels.config import AttentionConfig
from kernels.smem import H100_SMEM_LIMIT_BYTES

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "attention_tiles.sample.json"


def _sample_records() -> list[dict]:
    return [r for r in json.loads(SAMPLE.read_text())["results"] if r["config"] == "forced"]


def _record_config(rec: dict) -> AttentionConfig:
    if rec["mode"] == "fwd":
        return AttentionConfig(
            block_q=rec["block_q"], block_k=rec["block_k"], num_stages=rec["num_stages"], num_warps=rec["num_warps"]
        )
    return AttentionConfig(
        block_q=rec["fwd_block_q"],
        block_k=rec["fwd_block_k"],
        bwd_outer=rec["bwd_outer"],
        bwd_inner=rec["bwd_inner"],
        num_stages=rec["num_stages"],
        num_warps=rec["num_warps"],
    )


def test_model_reproduces_reference_sample() -> None:
    records = _sample_records()
    failures = successes = 0
    for rec in records:
        preds = smem.predict(rec["mode"], rec["dtype"], rec["head_dim"], _record_config(rec), seq=rec["seq"])
        over = smem.first_over(preds, H100_SMEM_LIMIT_BYTES)
        if "error" in rec:
            match = re.search(r"requested (\d+), available: 232448", rec["error"])
            assert match, rec["error"]
            requested = int(match[1])
            assert over is not None and over[1] == requested, (rec, preds)
            failures += 1
        else:
            assert over is None, (rec, preds)
            assert max(b for _, b in preds) <= H100_SMEM_LIMIT_BYTES
            successes += 1
    assert failures > 0 and successes > 0  # the sample holds both kinds


def test_known_byte_counts() -> None:
    # The default float32 head_dim-128 forward: the reference run's one auto fallback.
    assert smem.fwd_bytes("float32", 128, 128, 128, 2) == 262144
    assert smem.fwd_bytes(jnp.float32, 128, 128, 128, 1) == 196608
    # The closest success in the reference run.
    assert smem.bwd_bytes("float32", 128, 128, 64, 1) == 229376
    assert smem.bwd_bytes(jnp.bfloat16, 64, 128, 128, 2) == 66560


def test_predict_order_clamping_and_keyword_form() -> None:
    cfg = AttentionConfig(bwd_outer=64, bwd_inner=32, num_stages=3)
    preds = smem.predict("fwd_bwd", "bfloat16", 64, cfg)
    assert [k for k, _ in preds] == [smem.FWD_KERNEL, smem.BWD_KERNEL]
    assert preds == smem.predict_bytes(
        "fwd_bwd", "bfloat16", 64, block_q=128, block_k=128, bwd_outer=64, bwd_inner=32, num_stages=3, num_warps=8
    )
    assert smem.predict("fwd", "bfloat16", 64, cfg, seq=32) == [
        (smem.FWD_KERNEL, smem.fwd_bytes("bfloat16", 64, 32, 32, 3))
    ]
    # A non-power-of-two head_dim is modelled at its padded size.
    assert smem.fwd_bytes("float32", 40, 64, 64, 2) == smem.fwd_bytes("float32", 64, 64, 64, 2)


def test_first_over_reports_first_kernel_over_limit() -> None:
    preds = [("a", 10), ("b", 30), ("c", 40)]
    assert smem.first_over(preds, 25) == ("b", 30)
    assert smem.first_over(preds, 40) is None
    assert smem.first_over(preds, None) is None


def test_vocabulary_errors_name_allowed_values() -> None:
    with pytest.raises(ValueError, match=re.escape('unsupported mode "bwd"; allowed: "fwd", "fwd_bwd"')):
        smem.predict("bwd", "float32", 64, AttentionConfig())
    with pytest.raises(ValueError, match=re.escape('dtype "float64"; allowed: "bfloat16", "float16", "float32"')):
        smem.fwd_bytes("float64", 64, 64, 64, 2)
    with pytest.raises(ValueError, match=re.escape('unsupported dtype "int8";')):  # a dtype object, by its name
        smem.dtype_name(np.dtype("int8"))
    with pytest.raises(ValueError, match="allowed: 16 to 256"):
        smem.check_head_dim(512)


def test_an_implementation_name_none_has_is_refused_naming_those_there_are_as_a_spec_spells_them() -> None:
    from kernels import impl_triton, impls, tokamax_meta

    with pytest.raises(ValueError, match=re.escape('unknown kernel implementation "triton"; allowed: "tilesweep", ')):
        impls.get("triton")
    with pytest.raises(ValueError, match=re.escape('"mosaic" is not a Triton-backed implementation; those are "')):
        impl_triton.get("mosaic")
    with pytest.raises(ValueError, match=re.escape('"jax" is not a tokamax implementation; those are: "tokamax-')):
        tokamax_meta.kernel("jax")
    with pytest.raises(ValueError, match=re.escape("block_q, block_k, num_stages, num_warps; got [64, null]")):
        impl_triton.kernel_kwargs("fwd", [64, None])
