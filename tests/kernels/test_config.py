"""kernels.config, the jax-free home of the kernel's rules: the config, ``auto``, ``inner``, FLOPs.

The control plane imports these rules on a login node without jax, so the tests check that
they stay jax-free and that every other module hands out these very objects, not copies.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

import kernels
from kernels import attention, smem
from kernels.config import AttentionConfig, attention_flops, auto_config, inner_for
from kernels.smem import H100_SMEM_LIMIT_BYTES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["kernels.config", "kernels.smem"])
def test_module_imports_and_runs_without_jax(module: str) -> None:
    """Importing the module and using every rule it holds loads neither jax nor jaxlib."""
    use = {
        "kernels.config": (
            "m.auto_config(mode='fwd_bwd', dtype='float32', head_dim=128, seq=2048, smem_limit_bytes=232448); "
            "m.inner_for(0.4, target_ms=50.0, max_inner=200); m.attention_flops('fwd', 1, 1, 64, 16)"
        ),
        "kernels.smem": "m.predict_bytes('fwd_bwd', 'bfloat16', 64)",
    }[module]
    code = (
        f"import importlib, sys; m = importlib.import_module({module!r}); {use}; "
        "loaded = [n for n in ('jax', 'jaxlib') if n in sys.modules]; sys.exit(str(loaded) if loaded else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_route_hands_out_the_config_modules_objects() -> None:
    """``kernels.attention`` and the package re-export the rules; they must not be copies."""
    from kernels import config

    for name in ("AttentionConfig", "auto_config"):
        assert getattr(attention, name) is getattr(config, name)
    for name in ("AttentionConfig", "auto_config", "inner_for", "attention_flops"):
        assert getattr(kernels, name) is getattr(config, name)


def test_attention_flops() -> None:
    # batch 4, heads 8, seq 2048, head_dim 64: 4*B*H*S*S*D = 2**35 forward, 3.5x with the backward
    assert attention_flops("fwd", 4, 8, 2048, 64) == 2.0**35
    assert attention_flops("fwd_bwd", 4, 8, 2048, 64) == 3.5 * 2.0**35
    assert attention_flops("bwd", 4, 8, 2048, 64) is None


def test_inner_for_is_clamped() -> None:
    assert inner_for(0.0, target_ms=50.0, max_inner=200) == 200
    assert inner_for(1000.0, target_ms=50.0, max_inner=200) == 1
    assert inner_for(0.9, target_ms=50.0, max_inner=200) == 50
    assert inner_for(0.4, target_ms=50.0, max_inner=7) == 7


@pytest.mark.parametrize("mode", smem.MODES)
@pytest.mark.parametrize(
    ("dtype", "head_dim", "seq"), list(itertools.product(smem.DTYPES, [64, 128, 256], [2048, 8192]))
)
def test_auto_config_fits(mode: str, dtype: str, head_dim: int, seq: int) -> None:
    cfg = auto_config(mode=mode, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=H100_SMEM_LIMIT_BYTES)
    assert smem.first_over(smem.predict(mode, dtype, head_dim, cfg), H100_SMEM_LIMIT_BYTES) is None
    assert cfg.num_warps in (4, 8)
    for block in (cfg.block_q, cfg.block_k, cfg.bwd_outer, cfg.bwd_inner):
        assert seq % block == 0 and block >= 16


def test_auto_config_matches_reference_run_where_known() -> None:
    def auto(mode: str, dtype: str, head_dim: int) -> AttentionConfig:
        return auto_config(mode=mode, dtype=dtype, head_dim=head_dim, seq=2048, smem_limit_bytes=H100_SMEM_LIMIT_BYTES)

    assert auto("fwd", "bfloat16", 64) == AttentionConfig(num_warps=4, num_stages=2)
    assert auto("fwd", "bfloat16", 128) == AttentionConfig(num_warps=8, num_stages=2)
    # float32 head_dim 128 does not fit at 2 stages: 128/128 with 1 stage, as the run's auto.
    assert auto("fwd", "float32", 128) == AttentionConfig(num_warps=8, num_stages=1)
    assert auto("fwd_bwd", "bfloat16", 64) == AttentionConfig(num_warps=8, num_stages=2)
    assert auto("fwd_bwd", "float32", 128) == AttentionConfig(bwd_inner=64, num_warps=8, num_stages=1)


def test_auto_config_without_limit_clamping_and_impossible_limit() -> None:
    assert auto_config(
        mode="fwd_bwd", dtype="float32", head_dim=256, seq=8192, smem_limit_bytes=None
    ) == AttentionConfig(num_warps=8)
    small = auto_config(mode="fwd_bwd", dtype="bfloat16", head_dim=64, seq=64, smem_limit_bytes=H100_SMEM_LIMIT_BYTES)
    assert (small.block_q, small.block_k, small.bwd_outer, small.bwd_inner) == (64, 64, 64, 64)
    assert small.num_warps == 4
    for seq, block in [(192, 64), (96, 32)]:  # powers of two that divide seq
        assert auto_config(mode="fwd", dtype="bfloat16", head_dim=64, seq=seq, smem_limit_bytes=None).block_q == block
    with pytest.raises(ValueError, match="smem_limit_bytes=1000"):
        auto_config(mode="fwd", dtype="float32", head_dim=64, seq=2048, smem_limit_bytes=1000)
