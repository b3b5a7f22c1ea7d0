"""Every forced config of the reference grid lowers for CUDA, and its warps/stages arrive.

Runs on the CPU: the Pallas -> Triton lowering happens, the PTX compile does not (see
``kernels.lowering``). About 25 ms per config on a 2-core machine, so the whole grid is cheap.
"""

from __future__ import annotations

import itertools

import pytest

from kernels.attention import AttentionConfig
from kernels.lowering import lower_for_cuda
from kernels.smem import BWD_KERNEL, BWD_PREPROCESS_KERNEL, FWD_KERNEL

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
    return (f"q{cfg.block_q}k{cfg.block_k}o{cfg.bwd_outer}i{cfg.bwd_inner}"
            f"s{cfg.num_stages}w{cfg.num_warps}")


def _check(mode: str, cfg: AttentionConfig, dtype: str) -> None:
    calls = lower_for_cuda(mode, cfg, batch=BATCH, seq=SEQ, heads=HEADS, head_dim=HEAD_DIM,
                           dtype=dtype)
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
        calls = lower_for_cuda("fwd", AttentionConfig(), batch=1, seq=128, heads=1,
                               head_dim=head_dim, dtype="bfloat16")
        assert [c["num_warps"] for c in calls] == [warps]


def test_clamped_blocks_reach_the_grid() -> None:
    calls = lower_for_cuda("fwd_bwd", AttentionConfig(), batch=1, seq=64, heads=2,
                           head_dim=64, dtype="float32")
    assert [c["grid"] for c in calls] == [(1, 1, 2), (1, 1, 2), (1, 2, 1)]


def test_padded_head_dim_lowers() -> None:
    calls = lower_for_cuda("fwd_bwd", AttentionConfig(block_q=64, block_k=64, bwd_outer=64),
                           batch=1, seq=128, heads=1, head_dim=40, dtype="bfloat16")
    assert [c["name"] for c in calls] == [FWD_KERNEL, BWD_PREPROCESS_KERNEL, BWD_KERNEL]


def test_block_not_power_of_two_is_refused_off_interpret_mode() -> None:
    with pytest.raises(ValueError, match=r"block_q=96 \(clamped to seq=96\) must be a power"):
        lower_for_cuda("fwd", AttentionConfig(), batch=1, seq=96, heads=1, head_dim=64,
                       dtype="float32")
