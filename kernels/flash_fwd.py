"""Forward flash-attention Pallas kernel (Triton backend).

One program per (query tile, batch, head); it keeps its Q tile resident and streams K/V in
``block_k`` steps with an online softmax, so the (seq x seq) score matrix never exists. The
softmax runs in base 2 (``exp2`` with log2(e) folded into the scale) because that is the cheap
instruction on the GPU. Besides the output it writes the base-2 log-sum-exp per row, which the
backward kernel uses to rebuild the probabilities without a second online softmax.

Shapes reaching this module are already validated and padded by ``kernels.attention``.

Modelled on jax's Pallas attention, ``jax/experimental/pallas/ops/gpu/attention.py``
(Copyright 2023 The JAX Authors, Apache License 2.0; see NOTICE). Taken from it as a model:
the grid (seq/block_q, batch, heads) with the Q tile resident and K/V handed over whole along
seq, the ``fori_loop`` over K/V in ``block_k`` steps, the online softmax in base 2 with
log2(e) folded into the scale, the base-2 lse as the backward's residual, and the names
``block_q``/``block_k``. Ours has no causal or segment masks and no masked loads (the caller
pads head_dim instead).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.smem import FWD_KERNEL

LOG2E = math.log2(math.e)
# The online softmax's loop state: (output accumulator, row max, row sum), all float32.
_Carry = tuple[jax.Array, jax.Array, jax.Array]


def dot_f32(a: jax.Array, b: jax.Array, *, contract_a: int = 1, contract_b: int = 0) -> jax.Array:
    """A 2-D matmul accumulated in float32 (maps onto one ``tt.dot``)."""
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


def _fwd_kernel(
    q_ref: jax.Ref,
    k_ref: jax.Ref,
    v_ref: jax.Ref,
    o_ref: jax.Ref,
    lse_ref: jax.Ref,
    *,
    qk_scale: float,
    block_k: int,
) -> None:
    """One (query tile, batch, head) program: Q tile resident, K/V streamed.

    Pallas passes every operand as a ref to its block (a tracer whose abstract value is a
    ``jax.ref.AbstractRef``; ``isinstance(ref, jax.Ref)`` holds for it), hence ``jax.Ref``:
    ``ref[...]`` reads the block as an array, ``ref[...] = x`` writes it.
    """
    block_q, head_dim = q_ref.shape
    seq = k_ref.shape[0]
    q = q_ref[...]

    def step(j: jax.Array, carry: _Carry) -> _Carry:
        acc, m_prev, l_prev = carry
        kv_rows = pl.ds(j * block_k, block_k)
        k = k_ref[kv_rows, :]
        v = v_ref[kv_rows, :]
        s = dot_f32(q, k, contract_b=1) * qk_scale  # (block_q, block_k), log2 domain
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        alpha = jnp.exp2(m_prev - m_new)  # rescales what was summed so far
        p = jnp.exp2(s - m_new[:, None])
        l_new = alpha * l_prev + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot_f32(p.astype(v.dtype), v)
        return acc, m_new, l_new

    init = (
        jnp.zeros((block_q, head_dim), jnp.float32),
        jnp.full((block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
    )
    acc, m, l_sum = lax.fori_loop(0, seq // block_k, step, init)
    o_ref[...] = (acc / l_sum[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(l_sum)


def flash_fwd(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    sm_scale: float,
    block_q: int,
    block_k: int,
    num_warps: int,
    num_stages: int,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """Output (batch, seq, heads, head_dim) and base-2 lse (batch, heads, seq) in float32."""
    batch, seq, heads, head_dim = q.shape
    kernel = functools.partial(_fwd_kernel, qk_scale=sm_scale * LOG2E, block_k=block_k)
    q_tile = pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0))
    full_seq = pl.BlockSpec((None, seq, None, head_dim), lambda i, b, h: (b, 0, h, 0))
    return pl.pallas_call(
        kernel,
        grid=(seq // block_q, batch, heads),
        in_specs=[q_tile, full_seq, full_seq],
        out_specs=[q_tile, pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i))],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name=FWD_KERNEL,
    )(q, k, v)
