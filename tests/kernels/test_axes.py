"""Causal, grouped-query, float16 and head_dim 64..256: our kernel and the stock one against the reference.

Interpret mode on the CPU compiles each case for seconds, so the product causal x grouped-query
x dtype x head_dim (48 cases, times block configs) is covered by a table instead: every dtype
with and without causal, every head_dim, each of causal/non-causal with grouped-query,
multi-query and multi-head, and block shapes where the diagonal crosses tiles of both
orientations (block_q < block_k and >, bwd_outer < bwd_inner and >). Non-causal multi-head
attention in float32/bfloat16 is covered by test_attention.py.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import stock
from kernels.attention import AttentionConfig, build, build_reference, flash_attention, make_inputs, rel_err
from kernels.flash_bwd import key_spans
from kernels.flash_fwd import causal_spans

# Per-dtype tolerance on each of o, dq, dk, dv (measured here: float32 ~4e-7, float16 ~3e-4,
# bfloat16 ~2.5e-3; on a GPU float32 dots run as tf32).
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}
SEQ = 128

# (dtype, head_dim, causal, heads, kv_heads, config)
CASES = [
    ("float16", 256, True, 4, 2, AttentionConfig(block_q=32, block_k=64, bwd_outer=64, bwd_inner=32)),
    ("bfloat16", 96, True, 4, 4, AttentionConfig(block_q=64, block_k=32, bwd_outer=32, bwd_inner=64)),
    ("float32", 96, True, 4, 1, AttentionConfig(block_q=128, block_k=64, bwd_outer=128, bwd_inner=32)),
    ("float32", 128, False, 4, 1, AttentionConfig(block_q=32, block_k=32, bwd_outer=32, bwd_inner=16)),
    ("float16", 64, False, 4, 2, AttentionConfig(block_q=64, block_k=64, bwd_outer=64, bwd_inner=64)),
    ("bfloat16", 64, False, 4, 2, AttentionConfig(block_q=128, block_k=128, bwd_outer=128, bwd_inner=128)),
]


def _id(case: tuple) -> str:
    dtype, d, causal, h, kv, cfg = case
    return (
        f"{dtype}-d{d}-{'causal' if causal else 'full'}-h{h}kv{kv}-"
        f"q{cfg.block_q}k{cfg.block_k}o{cfg.bwd_outer}i{cfg.bwd_inner}"
    )


def _check(outs: tuple, refs: tuple, dtype: str) -> None:
    assert [o.shape for o in outs] == [r.shape for r in refs]
    assert all(o.dtype == jnp.dtype(dtype) for o in outs)
    errs = {n: rel_err([o], [r]) for n, o, r in zip(("o", "dq", "dk", "dv"), outs, refs, strict=True)}
    assert max(errs.values()) < TOL[dtype], errs


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_forward_and_every_gradient_match_the_reference(case: tuple) -> None:
    dtype, head_dim, causal, heads, kv_heads, cfg = case
    args = make_inputs(batch=1, seq=SEQ, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
    refs = jax.jit(build_reference("fwd_bwd", causal=causal))(*args)
    outs = jax.jit(build("fwd_bwd", cfg, causal=causal, interpret=True))(*args)
    assert outs[2].shape == (1, SEQ, kv_heads, head_dim)  # dK/dV summed over the group, per K/V head
    _check(outs, refs, dtype)


def test_stock_kernel_matches_the_reference_in_float16_with_a_padded_head_dim() -> None:
    """The second implementation where it applies (no grouped-query attention); float32 and
    bfloat16, causal or not, are checked against the reference in test_vs_stock.py."""
    cfg = AttentionConfig(block_q=64, block_k=32, bwd_outer=32, bwd_inner=64, num_warps=4)
    args = make_inputs(batch=1, seq=SEQ, heads=2, head_dim=80, dtype="float16")
    refs = jax.jit(build_reference("fwd_bwd", causal=True))(*args)
    outs = jax.jit(stock.build("fwd_bwd", cfg, causal=True, interpret=True))(*args)
    _check(outs, refs, "float16")


def test_stock_kernel_refuses_grouped_query() -> None:
    q, k, v, _ = make_inputs(batch=1, seq=64, heads=4, kv_heads=2, head_dim=32, dtype="float32")
    with pytest.raises(ValueError, match=r"no grouped-query attention.*k\.shape=\(1, 64, 2, 32\)"):
        stock.stock_attention(q, k, v, AttentionConfig(), interpret=True)


@pytest.mark.parametrize(("rows", "cols"), [(32, 64), (64, 32), (64, 64), (16, 128)])
def test_causal_loops_visit_exactly_the_tiles_on_or_below_the_diagonal(rows: int, cols: int) -> None:
    """The loop bounds, not masks, skip what lies above the diagonal: every tile a loop visits
    holds a visible (query >= key) pair, every tile it skips holds none, and only tiles the
    diagonal crosses run masked. Checked for the forward/dQ scans (a query tile streaming key
    blocks) and the dK/dV scan (a key tile streaming query blocks)."""
    seq = 256

    def tile_kind(q0: int, q_rows: int, k0: int, k_cols: int) -> str:
        qs, ks = np.arange(q0, q0 + q_rows)[:, None], np.arange(k0, k0 + k_cols)[None, :]
        visible = qs >= ks
        return "skip" if not visible.any() else "full" if visible.all() else "masked"

    for t in range(seq // rows):
        full, end = (int(x) for x in causal_spans(jnp.int32(t), rows, cols, seq // cols, True))
        got = ["full" if j < full else "masked" if j < end else "skip" for j in range(seq // cols)]
        want = [tile_kind(t * rows, rows, j * cols, cols) for j in range(seq // cols)]
        # a tile wholly visible may still be run masked (harmless), never the other way round
        assert [g == w or (g, w) == ("masked", "full") for g, w in zip(got, want, strict=True)] == [True] * len(got)
        assert got.count("masked") <= math.ceil(rows / cols) + 1
        start, full = (int(x) for x in key_spans(jnp.int32(t), rows, cols, seq // cols, True))
        got = ["skip" if j < start else "masked" if j < full else "full" for j in range(seq // cols)]
        want = [tile_kind(j * cols, cols, t * rows, rows) for j in range(seq // cols)]
        assert [g == w or (g, w) == ("masked", "full") for g, w in zip(got, want, strict=True)] == [True] * len(got)


def test_head_dim_outside_the_range_is_refused_with_the_range() -> None:
    for head_dim in (8, 512):
        q, k, v, _ = make_inputs(batch=1, seq=32, heads=1, head_dim=head_dim, dtype="float32")
        with pytest.raises(ValueError, match=rf"head_dim={head_dim} is not supported; allowed: 16 to 256"):
            flash_attention(q, k, v)


def test_kv_heads_must_divide_heads() -> None:
    q, _, _, _ = make_inputs(batch=1, seq=32, heads=6, head_dim=16, dtype="float32")
    _, k, v, _ = make_inputs(batch=1, seq=32, heads=6, kv_heads=4, head_dim=16, dtype="float32")
    with pytest.raises(ValueError, match=r"kv_heads dividing q's heads.*k\.shape=\(1, 32, 4, 16\)"):
        flash_attention(q, k, v)


def test_reference_does_causal_grouped_query_attention() -> None:
    """The yardstick itself, against the definition in float64 numpy: query head h reads K/V
    head h // group, query i sees keys 0..i."""
    from kernels.reference import attention_reference

    q, k, v, _ = make_inputs(batch=1, seq=16, heads=4, kv_heads=2, head_dim=16, dtype="float32")
    got = attention_reference(q, k, v, causal=True)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    want = np.empty_like(q64)
    for h in range(4):
        s = q64[0, :, h] @ k64[0, :, h // 2].T / 4.0
        s[np.triu_indices(16, 1)] = -np.inf
        w = np.exp(s - s.max(-1, keepdims=True))
        want[0, :, h] = (w / w.sum(-1, keepdims=True)) @ v64[0, :, h // 2]
    assert rel_err([got], [want]) < 1e-5


def test_cases_cover_the_axes() -> None:
    """The table above covers what the issue asks for, pair by pair."""
    dtypes = {c[0] for c in CASES}
    assert dtypes == {"float16", "bfloat16", "float32"}
    assert {c[1] for c in CASES} >= {64, 96, 128, 256}
    kinds = {(c[2], "mha" if c[4] == c[3] else "mqa" if c[4] == 1 else "gqa") for c in CASES}
    assert {(True, "gqa"), (True, "mha"), (True, "mqa"), (False, "gqa"), (False, "mqa")} <= kinds
    assert all(any(c[0] == d and c[2] == causal for c in CASES) for d, causal in itertools.product(dtypes, (0, 1)))
