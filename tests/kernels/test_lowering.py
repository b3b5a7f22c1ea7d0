"""Every forced config of the reference grid, and of the decoder example (causal, grouped-query)
for both kernel implementations, lowers for CUDA, and its warps/stages arrive.

Runs on the CPU: the Pallas -> Triton lowering happens, the PTX compile does not (see
``kernels.lowering``). About 25 ms per config on a 2-core machine, so the whole grid is cheap.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from kernels.attention import AttentionConfig
from kernels.lowering import lower_for_cuda
from kernels.smem import (
    BWD_KERNEL,
    BWD_PREPROCESS_KERNEL,
    FWD_KERNEL,
    STOCK_BWD_KERNEL,
    STOCK_BWD_PREPROCESS_KERNEL,
    STOCK_FWD_KERNEL,
)
from orchestrator.planning import RUN, expand
from orchestrator.spec.files import spec_from_data

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

BATCH, SEQ, HEADS, HEAD_DIM = 2, 256, 3, 64

FWD_GRID = [
    AttentionConfig(block_q=bq, block_k=bk, num_stages=s, num_warps=w)
    for bq, bk, s, w in itertools.product([32, 64, 128], [32, 64, 128], [1, 2, 3], [4, 8])
]
FWD_BWD_GRID = [
    AttentionConfig(block_q=128, block_k=128, bwd_outer=o, bwd_inner=i, num_stages=s, num_warps=w)
    for o, i, s, w in itertools.product([32, 64, 128], [16, 32, 64, 128], [1, 2], [4, 8])
]


def _id(cfg: AttentionConfig) -> str:
    return f"q{cfg.block_q}k{cfg.block_k}o{cfg.bwd_outer}i{cfg.bwd_inner}s{cfg.num_stages}w{cfg.num_warps}"


def _check(mode: str, cfg: AttentionConfig, dtype: str) -> None:
    calls = lower_for_cuda(mode, cfg, batch=BATCH, seq=SEQ, heads=HEADS, head_dim=HEAD_DIM, dtype=dtype)
    grids = {
        FWD_KERNEL: (SEQ // cfg.block_q, BATCH, HEADS),
        BWD_PREPROCESS_KERNEL: (SEQ // cfg.bwd_outer, BATCH, HEADS),
        BWD_KERNEL: (BATCH, HEADS, SEQ // cfg.bwd_outer),
    }
    expected = [FWD_KERNEL] if mode == "fwd" else [FWD_KERNEL, BWD_PREPROCESS_KERNEL, BWD_KERNEL]
    assert [c["name"] for c in calls] == expected
    for call in calls:
        assert call["num_warps"] == cfg.num_warps, call
        assert call["num_stages"] == cfg.num_stages, call
        assert call["grid"] == grids[call["name"]], call


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("cfg", FWD_GRID, ids=_id)
def test_fwd_grid_lowers(cfg: AttentionConfig, dtype: str) -> None:
    _check("fwd", cfg, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("cfg", FWD_BWD_GRID, ids=_id)
def test_fwd_bwd_grid_lowers(cfg: AttentionConfig, dtype: str) -> None:
    _check("fwd_bwd", cfg, dtype)


def test_default_warps_follow_head_dim() -> None:
    for head_dim, warps in [(64, 4), (128, 8)]:
        calls = lower_for_cuda("fwd", AttentionConfig(), batch=1, seq=128, heads=1, head_dim=head_dim, dtype="bfloat16")
        assert [c["num_warps"] for c in calls] == [warps]


def test_clamped_blocks_reach_the_grid() -> None:
    calls = lower_for_cuda("fwd_bwd", AttentionConfig(), batch=1, seq=64, heads=2, head_dim=64, dtype="float32")
    assert [c["grid"] for c in calls] == [(1, 1, 2), (1, 1, 2), (1, 2, 1)]


def test_padded_head_dim_lowers() -> None:
    calls = lower_for_cuda(
        "fwd_bwd",
        AttentionConfig(block_q=64, block_k=64, bwd_outer=64),
        batch=1,
        seq=128,
        heads=1,
        head_dim=40,
        dtype="bfloat16",
    )
    assert [c["name"] for c in calls] == [FWD_KERNEL, BWD_PREPROCESS_KERNEL, BWD_KERNEL]


def test_block_not_power_of_two_is_refused_off_interpret_mode() -> None:
    with pytest.raises(ValueError, match=r"block_q=96 \(clamped to seq=96\) must be a power"):
        lower_for_cuda("fwd", AttentionConfig(), batch=1, seq=96, heads=1, head_dim=64, dtype="float32")


@pytest.mark.parametrize(
    ("config", "seq", "says"),
    [
        (AttentionConfig(block_k=8), 64, r"block_k=8 \(clamped to seq=64\) must be at least 16"),
        (AttentionConfig(), 8, r"block_q=8 \(clamped to seq=8\) must be at least 16"),
    ],
)
def test_a_block_below_16_is_refused_off_interpret_mode(config: AttentionConfig, seq: int, says: str) -> None:
    """Each block is a dimension of a Triton dot, which takes none below 16: the kernel names
    the tile before Triton's compiler meets it."""
    with pytest.raises(ValueError, match=says):
        lower_for_cuda("fwd", config, batch=1, seq=seq, heads=1, head_dim=64, dtype="float32")


# ---------------------------------------------------------------------- the new axes, both kernels

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "decoder.json"


def _example_items(impl: str) -> tuple[Any, list[Any]]:
    """The decoder example as a GPU user submits it, with kernel ``impl`` (the stock kernel
    gets multi-head attention: it has no grouped-query attention); its runnable forced items
    at the smallest seq (the tiles do not depend on seq there: nothing is clamped)."""
    data = json.loads(EXAMPLE.read_text())
    data["kernel"] = {**data.get("kernel", {}), "impl": impl}
    if impl == "jax":
        data["kv_heads"] = [None]
    spec = spec_from_data(data)
    seq = min(spec.seq_lens)
    items = [it for it in expand(spec) if it.config == "forced" and it.kind == RUN and it.seq == seq]
    return spec, items


@pytest.mark.parametrize("impl", ["tilesweep", "jax"])
def test_every_forced_config_of_the_decoder_example_lowers(impl: str) -> None:
    """What a GPU user submits reaches Triton whole: every config, with its warps and stages
    (the stock backward keeps its own 2 stages, its preprocess 4 warps and 3), on grids
    over query heads forward and K/V heads backward, K/V arrays never repeated."""
    spec, items = _example_items(impl)
    assert len(items) == {"tilesweep": 32, "jax": 24}[impl]  # the stock backward's stages are pinned
    (kv,) = spec.kv_heads
    kv_heads = kv or spec.heads
    names = {
        "tilesweep": (FWD_KERNEL, BWD_PREPROCESS_KERNEL, BWD_KERNEL),
        "jax": (STOCK_FWD_KERNEL, STOCK_BWD_PREPROCESS_KERNEL, STOCK_BWD_KERNEL),
    }[impl]
    for it in items:
        cfg = AttentionConfig(**it.kernel_config())
        (causal,), (dtype,), (head_dim,) = spec.causal, spec.dtypes, spec.head_dims
        calls = lower_for_cuda(
            it.mode,
            cfg,
            batch=spec.batch,
            seq=it.seq,
            heads=spec.heads,
            kv_heads=kv,
            head_dim=head_dim,
            dtype=dtype,
            causal=causal,
            impl=impl,
        )
        by_name = {c["name"]: c for c in calls}
        assert set(by_name) == set(names[:1] if it.mode == "fwd" else names), (it.params, calls)
        fwd = by_name[names[0]]
        assert (fwd["num_warps"], fwd["num_stages"]) == (cfg.num_warps, cfg.num_stages)
        assert fwd["grid"] == (it.seq // cfg.block_q, spec.batch, spec.heads)
        assert fwd["operands"][1] == (spec.batch, it.seq, kv_heads, head_dim)  # K as it is
        if it.mode == "fwd_bwd":
            bwd = by_name[names[2]]
            assert (bwd["num_warps"], bwd["num_stages"]) == (cfg.num_warps, 2 if impl == "jax" else cfg.num_stages)
            assert bwd["grid"] == (spec.batch, kv_heads, it.seq // cfg.bwd_outer)


@pytest.mark.parametrize(
    ("dtype", "head_dim", "kv_heads", "causal"),
    [
        ("float16", 96, 2, True),
        ("float16", 256, 1, False),
        ("float32", 80, 4, True),
        ("bfloat16", 192, 2, True),
    ],
)
@pytest.mark.parametrize("impl", ["tilesweep", "jax"])
def test_new_axes_lower(impl: str, dtype: str, head_dim: int, kv_heads: int, causal: bool) -> None:
    """float16 and head_dims that are not powers of two, causal, grouped-query (ours only)."""
    kv = kv_heads if impl == "tilesweep" else None
    cfg = AttentionConfig(block_q=64, block_k=32, bwd_outer=32, bwd_inner=64, num_stages=2, num_warps=4)
    calls = lower_for_cuda(
        "fwd_bwd", cfg, batch=1, seq=256, heads=4, kv_heads=kv, head_dim=head_dim, dtype=dtype, causal=causal, impl=impl
    )
    assert len(calls) == 3 and all(c["num_warps"] == 4 for c in calls if "preprocess" not in c["name"])


def test_l2_flush_lowers_for_cuda_as_an_in_place_overwrite_of_256_mib() -> None:
    """What runs before each sample on a GPU: one program that reads and writes a donated
    256 MiB buffer (five times an H100's 50 MB L2)."""
    from kernels.l2 import FLUSH_BYTES
    from kernels.lowering import lower_flush_for_cuda

    text = lower_flush_for_cuda()
    elements = FLUSH_BYTES // 4
    assert FLUSH_BYTES >= 5 * 50 * 10**6
    assert f"%arg0: tensor<{elements}xi32> {{tf.aliasing_output = 0 : i32}}" in text  # donated: in place
    assert "stablehlo.add" in text  # reads and writes every element
    assert f"-> (tensor<{elements}xi32>" in text
