"""The kernel against the plain-jnp reference in interpret mode, forward and gradients."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.typing import DTypeLike

from kernels.attention import (
    AttentionConfig,
    attention_reference,
    build,
    build_reference,
    flash_attention,
    make_inputs,
    rel_err,
)

TOL = {"float32": 1e-5, "bfloat16": 2e-2}
DTYPES = ("float32", "bfloat16")
SHAPE = {"batch": 1, "heads": 2}

CONFIGS = {
    "default": AttentionConfig(),
    "fwd64x32_bwd64x32": AttentionConfig(block_q=64, block_k=32, bwd_outer=64, bwd_inner=32),
    "fwd32x64_bwd32x128": AttentionConfig(block_q=32, block_k=64, bwd_outer=32, bwd_inner=128),
    "bwd128x16_1stage": AttentionConfig(bwd_outer=128, bwd_inner=16, num_stages=1, num_warps=8),
}


@functools.cache
def _problem(mode: str, dtype: str, seq: int, head_dim: int, sm_scale: float | None = None) -> tuple[tuple, tuple]:
    args = make_inputs(seq=seq, head_dim=head_dim, dtype=dtype, **SHAPE)
    refs = jax.jit(build_reference(mode, sm_scale=sm_scale))(*args)
    return args, refs


def _assert_close(
    mode: str, dtype: str, config: AttentionConfig, *, seq: int = 256, head_dim: int = 64, sm_scale: float | None = None
) -> None:
    args, refs = _problem(mode, dtype, seq, head_dim, sm_scale)
    outs = jax.jit(build(mode, config, sm_scale=sm_scale))(*args)
    assert [o.shape for o in outs] == [r.shape for r in refs]
    assert all(o.dtype == jnp.dtype(dtype) for o in outs)
    names = ("o", "dq", "dk", "dv")
    errs = {n: rel_err([o], [r]) for n, o, r in zip(names, outs, refs, strict=False)}  # fwd: one output, four names
    assert max(errs.values()) < TOL[dtype], errs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CONFIGS)
def test_fwd_bwd_matches_reference(name: str, dtype: str) -> None:
    _assert_close("fwd_bwd", dtype, CONFIGS[name])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fwd_mode_matches_reference(dtype: str) -> None:
    _assert_close("fwd", dtype, AttentionConfig(block_q=64, block_k=128))


def test_blocks_larger_than_seq_are_clamped() -> None:
    _assert_close("fwd_bwd", "float32", AttentionConfig(), seq=64)


def test_explicit_sm_scale() -> None:
    _assert_close("fwd_bwd", "float32", AttentionConfig(), seq=128, sm_scale=0.3)


def test_jax_grad_works() -> None:
    q, k, v, _ = make_inputs(seq=128, head_dim=32, dtype="float32", **SHAPE)
    cfg = AttentionConfig(block_q=64, block_k=64, bwd_outer=64, bwd_inner=32)

    def loss(fn: Callable[..., jax.Array], q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(fn(q, k, v)))

    got = jax.grad(functools.partial(loss, functools.partial(flash_attention, config=cfg)), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(functools.partial(loss, attention_reference), argnums=(0, 1, 2))(q, k, v)
    assert rel_err(got, want) < TOL["float32"]


def test_reference_in_float64_when_x64_enabled() -> None:
    with jax.enable_x64(True):
        q, k, v, _ = make_inputs(seq=64, head_dim=16, dtype="float32", **SHAPE)
        out = attention_reference(q, k, v)
        q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    assert out.dtype == jnp.float32
    logits = np.einsum("bqhd,bkhd->bhqk", q64, k64) / np.sqrt(16)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    want = np.einsum("bhqk,bkhd->bqhd", w, v64)
    assert rel_err([out], [want]) < 1e-6


# ---------------------------------------------------------------------- validation


def _qkv(seq: int = 96, head_dim: int = 32, dtype: str = "float32") -> tuple[jax.Array, jax.Array, jax.Array]:
    return make_inputs(seq=seq, head_dim=head_dim, dtype=dtype, **SHAPE)[:3]


@pytest.mark.parametrize(
    ("field", "config"),
    [
        ("block_q", AttentionConfig(block_q=64, block_k=32, bwd_outer=32, bwd_inner=32)),
        ("block_k", AttentionConfig(block_q=32, block_k=64, bwd_outer=32, bwd_inner=32)),
        ("bwd_outer", AttentionConfig(block_q=32, block_k=32, bwd_outer=64, bwd_inner=32)),
        ("bwd_inner", AttentionConfig(block_q=32, block_k=32, bwd_outer=32, bwd_inner=64)),
    ],
)
def test_seq_not_multiple_of_block_names_the_values(field: str, config: AttentionConfig) -> None:
    with pytest.raises(ValueError, match=f"seq=96 must be a multiple of {field}=64"):
        flash_attention(*_qkv(), config)


def test_mismatched_shapes_show_them() -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k\.shape=\(1, 64, 2, 32\)"):
        flash_attention(q, k[:, :64], v[:, :64])
    with pytest.raises(ValueError, match=r"k\.shape=\(1, 64, 2, 32\), v\.shape=\(1, 96, 2, 32\)"):
        flash_attention(q, k[:, :64], v)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"block_q": 0}, "block_q=0 must be a positive int"),
        ({"bwd_inner": -16}, "bwd_inner=-16 must be a positive int"),
        ({"num_stages": 0}, "num_stages=0 must be a positive int"),
        ({"num_warps": 0}, "num_warps=0 must be a positive int or null"),
        ({"block_k": 2.5}, "block_k=2.5 must be a positive int"),
        ({"block_q": True}, "block_q=true must be a positive int"),  # as a config file spells the value
        ({"num_stages": "2"}, 'num_stages="2" must be a positive int'),
    ],
)
def test_bad_config_values(kwargs: dict, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        AttentionConfig(**kwargs)


def test_bad_mode_names_allowed_values() -> None:
    with pytest.raises(ValueError, match=re.escape('mode "bwd"; allowed: "fwd", "fwd_bwd"')):
        build("bwd", AttentionConfig())
    with pytest.raises(ValueError, match=re.escape('mode "forward"; allowed: "fwd", "fwd_bwd"')):
        build_reference("forward")


def test_bad_dtype_names_allowed_values() -> None:
    allowed = 'allowed: "bfloat16", "float16", "float32"'
    with pytest.raises(ValueError, match=re.escape(f'dtype "float64"; {allowed}')):
        make_inputs(seq=64, head_dim=16, dtype="float64", **SHAPE)
    q, k, v = (x.astype(jnp.int8) for x in _qkv(seq=64))
    with pytest.raises(ValueError, match=re.escape(f'dtype "int8"; {allowed}')):  # the array's dtype, by its name
        flash_attention(q, k, v)


# ---------------------------------------------------------------------- inputs and rel_err


@pytest.mark.parametrize("dtype", [jnp.bfloat16, "float32"])
def test_make_inputs_seeded_random_not_zero(dtype: DTypeLike) -> None:
    a = make_inputs(seq=32, head_dim=16, dtype=dtype, seed=3, **SHAPE)
    b = make_inputs(seq=32, head_dim=16, dtype=dtype, seed=3, **SHAPE)
    c = make_inputs(seq=32, head_dim=16, dtype=dtype, seed=4, **SHAPE)
    assert len(a) == 4 and all(x.shape == (1, 32, 2, 16) for x in a)
    assert all(x.dtype == jnp.dtype(dtype) for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    assert not any(np.array_equal(a[0], x) for x in a[1:])  # four different draws
    assert all(float(jnp.std(x.astype(jnp.float32))) > 0.5 for x in a)


def test_rel_err_pools_outputs_in_float64() -> None:
    ref = [np.ones(3), np.ones(1)]
    assert rel_err(ref, ref) == 0.0
    assert rel_err([np.full(3, 2.0), np.ones(1)], ref) == pytest.approx(np.sqrt(3) / 2)
    assert rel_err(jnp.ones(4, jnp.bfloat16) * 1.5, np.ones(4)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shape"):
        rel_err([np.ones(4)], [np.ones((2, 2))])
