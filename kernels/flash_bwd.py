"""Backward flash-attention Pallas kernels (Triton backend).

Two launches. A preprocess kernel computes ``delta = rowsum(o * do)``, the term every softmax
gradient row subtracts. Then one fused kernel per (batch, K/V head, outer tile) does two scans:
dK/dV for a resident K/V tile of ``bwd_outer`` rows while streaming Q/dO in ``bwd_inner`` steps,
then dQ for a resident Q tile of ``bwd_outer`` rows while streaming K/V in ``bwd_inner`` steps.
Fusing both scans in one launch with the same outer tile is why ``bwd_outer`` stands for both
block_kv_dkv and block_q_dq (and ``bwd_inner`` for block_q_dkv and block_kv_dq).

Grouped-query attention: the grid runs over K/V heads, and each program loops over the
``group = heads // kv_heads`` query heads that share its K/V head. dK/dV are summed over the
group in the program's accumulators, so K/V are neither repeated in memory nor reduced after
the kernel; the dQ scan writes one query head's tile per group member. (The price: a grid of
``batch * kv_heads * seq/outer`` programs, fewer than with one program per query head; with
multi-head attention, group 1, the kernel is the plain one.)

Causal attention skips by loop bounds what lies above the diagonal: the dK/dV scan of K/V tile
``t`` starts at the first query block that can see it, the dQ scan stops after the last key
block a query tile can see, and only the blocks the diagonal crosses are masked.

Unlike the stock jax kernel, which hard-codes two pipeline stages here, the config's
``num_stages`` and ``num_warps`` reach every backward launch: the reference run's
shared-memory failures only make sense that way, and a tuner must be able to vary them.
Probabilities are rebuilt from the forward's base-2 lse, so no online softmax is needed.

Modelled on the backward of jax's Pallas attention, ``jax/experimental/pallas/ops/gpu/
attention.py`` (Copyright 2023 The JAX Authors, Apache License 2.0; see NOTICE). Taken from it
as a model: the delta preprocess launch, the fused dK/dV + dQ kernel with its two scans, the
causal loop bounds, and its block names, which ``bwd_outer``/``bwd_inner`` fold as above.
Where ours differs, besides warps and stages and grouped-query: the preprocess tiles rows by
``bwd_outer`` (upstream: the forward's block_q, 4 warps, 3 stages), only the diagonal blocks
are masked, and sm_scale multiplies dK and dQ once after each scan instead of every dS (so
bfloat16 dq/dk differ from upstream by rounding only).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.flash_fwd import LOG2E, causal_mask, causal_spans, cdiv, dot_f32, head_mask, load, store
from kernels.smem import BWD_KERNEL, BWD_PREPROCESS_KERNEL

_Pair = tuple[jax.Array, jax.Array]


def _delta_kernel(o_ref: jax.Ref, do_ref: jax.Ref, delta_ref: jax.Ref, *, head_dim: int) -> None:
    """delta = rowsum(o * do) for one row tile; refs as in ``flash_fwd._fwd_kernel``."""
    cols = head_mask(o_ref.shape[-1], head_dim)
    o = load(o_ref, cols).astype(jnp.float32)
    do = load(do_ref, cols).astype(jnp.float32)
    delta_ref[...] = jnp.sum(o * do, axis=1)


def key_spans(
    tile: jax.Array, rows: int, cols: int, steps: int, causal: bool
) -> tuple[jax.Array | int, jax.Array | int]:
    """Loop bounds for a resident key tile against streamed query blocks (the dK/dV scan).

    The tile holds keys ``[tile*rows, (tile+1)*rows)``, the loop streams query blocks of
    ``cols``. Returns ``(start, full)``: blocks before ``start`` cannot see the tile (skipped),
    ``[start, full)`` are crossed by the diagonal (masked), ``[full, steps)`` see all of it.
    Without ``causal``: ``(0, 0)``, every block unmasked.
    """
    if not causal:
        return 0, 0
    return lax.div(tile * rows, cols), cdiv((tile + 1) * rows, cols)


def _over_group(group: int, body: Callable[[Any, Any], Any], init: Any) -> Any:
    """``body(member, carry)`` for each query head of a K/V head's group, in a loop when the
    group has more than one member (multi-head attention keeps the loop-free kernel)."""
    return body(0, init) if group == 1 else lax.fori_loop(0, group, body, init)


@dataclasses.dataclass(frozen=True)
class _Program:
    """What both scans of one (batch, K/V head, outer tile) program share. With a group of
    query heads, q/do/dq blocks carry a heads axis of ``group`` and lse/delta a leading one;
    member ``h`` indexes it (``at``, ``rows``)."""

    tile: jax.Array  # the outer tile's index along seq
    outer: int
    inner: int
    steps: int  # inner blocks along seq
    causal: bool
    group: int
    qk_scale: float
    cols: jax.Array | None  # head_dim columns that hold data (None: not padded)

    def at(self, ref: Any, rows: Any, h: Any) -> Any:
        return ref.at[rows, :] if self.group == 1 else ref.at[rows, h, :]

    def rows(self, ref: Any, rows: Any, h: Any) -> jax.Array:
        return ref[rows] if self.group == 1 else ref[h, rows]


def _dkdv_scan(pr: _Program, q_ref: Any, k_ref: Any, v_ref: Any, do_ref: Any, lse_ref: Any, delta_ref: Any) -> _Pair:
    """dK (unscaled), dV for K/V rows ``tile``, summed over the group; streams query rows."""
    t, outer, inner, cols = pr.tile, pr.outer, pr.inner, pr.cols
    tile = pl.ds(t * outer, outer)
    k = load(k_ref.at[tile, :], cols)
    v = load(v_ref.at[tile, :], cols)

    def step(j: jax.Array, carry: _Pair, *, h: Any, masked: bool) -> _Pair:
        dk, dv = carry
        rows = pl.ds(j * inner, inner)
        q = load(pr.at(q_ref, rows, h), cols)
        do = load(pr.at(do_ref, rows, h), cols)
        # (inner, outer) probabilities, rebuilt from the forward's base-2 lse
        p = jnp.exp2(dot_f32(q, k, contract_b=1) * pr.qk_scale - pr.rows(lse_ref, rows, h)[:, None])
        if masked:
            p = jnp.where(causal_mask(j * inner, inner, t * outer, outer), p, 0.0)
        dv = dv + dot_f32(p.astype(do.dtype), do, contract_a=0)
        ds = p * (dot_f32(do, v, contract_b=1) - pr.rows(delta_ref, rows, h)[:, None])
        dk = dk + dot_f32(ds.astype(q.dtype), q, contract_a=0)
        return dk, dv

    start, full = key_spans(t, outer, inner, pr.steps, pr.causal)

    def member(h: Any, carry: _Pair) -> _Pair:
        if pr.causal:
            carry = lax.fori_loop(start, full, functools.partial(step, h=h, masked=True), carry)
        return lax.fori_loop(full, pr.steps, functools.partial(step, h=h, masked=False), carry)

    zeros = jnp.zeros((outer, k.shape[-1]), jnp.float32)
    dk, dv = _over_group(pr.group, member, (zeros, zeros))
    return dk, dv


def _dq_scan(
    pr: _Program,
    q_ref: Any,
    k_ref: Any,
    v_ref: Any,
    do_ref: Any,
    lse_ref: Any,
    delta_ref: Any,
    dq_ref: Any,
    sm_scale: float,
) -> None:
    """dQ for query rows ``tile`` of each member of the group; streams key/value rows."""
    t, outer, inner, cols = pr.tile, pr.outer, pr.inner, pr.cols
    tile = pl.ds(t * outer, outer)
    unmasked, end = causal_spans(t, outer, inner, pr.steps, pr.causal)

    def member(h: Any, carry: int) -> int:
        q = load(pr.at(q_ref, tile, h), cols)
        do = load(pr.at(do_ref, tile, h), cols)
        lse = pr.rows(lse_ref, tile, h)
        delta = pr.rows(delta_ref, tile, h)

        def step(j: jax.Array, dq: jax.Array, *, masked: bool) -> jax.Array:
            rows = pl.ds(j * inner, inner)
            k = load(k_ref.at[rows, :], cols)
            v = load(v_ref.at[rows, :], cols)
            p = jnp.exp2(dot_f32(q, k, contract_b=1) * pr.qk_scale - lse[:, None])  # (outer, inner)
            if masked:
                p = jnp.where(causal_mask(t * outer, outer, j * inner, inner), p, 0.0)
            ds = p * (dot_f32(do, v, contract_b=1) - delta[:, None])
            return dq + dot_f32(ds.astype(k.dtype), k)

        dq = lax.fori_loop(0, unmasked, functools.partial(step, masked=False), jnp.zeros(q.shape, jnp.float32))
        if pr.causal:
            dq = lax.fori_loop(unmasked, end, functools.partial(step, masked=True), dq)
        store(dq_ref if pr.group == 1 else dq_ref.at[:, h, :], (dq * sm_scale).astype(dq_ref.dtype), cols)
        return carry

    _over_group(pr.group, member, 0)


def _bwd_kernel(
    q_ref: jax.Ref,
    k_ref: jax.Ref,
    v_ref: jax.Ref,
    do_ref: jax.Ref,
    lse_ref: jax.Ref,
    delta_ref: jax.Ref,
    dq_ref: jax.Ref,
    dk_ref: jax.Ref,
    dv_ref: jax.Ref,
    *,
    sm_scale: float,
    outer: int,
    inner: int,
    causal: bool,
    head_dim: int,
    group: int,
) -> None:
    """One (batch, K/V head, outer tile) program, inputs whole along seq (refs as in
    ``flash_fwd._fwd_kernel``): the dK/dV scan, then the dQ scan."""
    seq, padded = k_ref.shape
    cols = head_mask(padded, head_dim)
    pr = _Program(pl.program_id(2), outer, inner, seq // inner, causal, group, sm_scale * LOG2E, cols)
    dk, dv = _dkdv_scan(pr, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref)
    store(dk_ref, (dk * sm_scale).astype(dk_ref.dtype), cols)
    store(dv_ref, dv.astype(dv_ref.dtype), cols)
    _dq_scan(pr, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, sm_scale)


def _delta(o: jax.Array, do: jax.Array, *, outer: int, padded: int, params: Any, interpret: bool) -> jax.Array:
    """The preprocess launch: delta (batch, heads, seq) in float32."""
    batch, seq, heads, head_dim = o.shape
    row_tile = pl.BlockSpec((None, outer, None, padded), lambda i, b, h: (b, i, h, 0))
    return pl.pallas_call(
        functools.partial(_delta_kernel, head_dim=head_dim),
        grid=(seq // outer, batch, heads),
        in_specs=[row_tile, row_tile],
        out_specs=pl.BlockSpec((None, None, outer), lambda i, b, h: (b, h, i)),
        out_shape=jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32),
        compiler_params=params,
        interpret=interpret,
        name=BWD_PREPROCESS_KERNEL,
    )(o, do)


def flash_bwd(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    do: jax.Array,
    *,
    sm_scale: float,
    causal: bool,
    padded: int,
    bwd_outer: int,
    bwd_inner: int,
    num_warps: int,
    num_stages: int,
    interpret: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv) in the input dtype, from the forward's output and base-2 lse.

    ``k``/``v`` have ``kv_heads`` heads dividing ``heads``; ``padded`` is the block width of
    head_dim."""
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    params = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    delta = _delta(o, do, outer=bwd_outer, padded=padded, params=params, interpret=interpret)

    members = None if group == 1 else group  # the group's query heads, one block
    q_seq = pl.BlockSpec((None, seq, members, padded), lambda b, g, i: (b, 0, g, 0))
    kv_seq = pl.BlockSpec((None, seq, None, padded), lambda b, g, i: (b, 0, g, 0))
    q_rows = pl.BlockSpec((None, members, seq), lambda b, g, i: (b, g, 0))
    dq_tile = pl.BlockSpec((None, bwd_outer, members, padded), lambda b, g, i: (b, i, g, 0))
    kv_tile = pl.BlockSpec((None, bwd_outer, None, padded), lambda b, g, i: (b, i, g, 0))
    kernel = functools.partial(
        _bwd_kernel,
        sm_scale=sm_scale,
        outer=bwd_outer,
        inner=bwd_inner,
        causal=causal,
        head_dim=head_dim,
        group=group,
    )
    return pl.pallas_call(
        kernel,
        grid=(batch, kv_heads, seq // bwd_outer),
        in_specs=[q_seq, kv_seq, kv_seq, q_seq, q_rows, q_rows],
        out_specs=[dq_tile, kv_tile, kv_tile],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
        compiler_params=params,
        interpret=interpret,
        name=BWD_KERNEL,
    )(q, k, v, do, lse, delta)
