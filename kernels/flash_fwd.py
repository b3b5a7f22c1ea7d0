"""Forward flash-attention Pallas kernel (Triton backend).

One program per (query tile, batch, query head); it keeps its Q tile resident and streams K/V
in ``block_k`` steps with an online softmax, so the (seq x seq) score matrix never exists. The
softmax runs in base 2 (``exp2`` with log2(e) folded into the scale) because that is the cheap
instruction on the GPU. Besides the output it writes the base-2 log-sum-exp per row, which the
backward kernel uses to rebuild the probabilities without a second online softmax.

Causal attention skips the K/V blocks above the diagonal by its loop bounds, not by masks: a
query tile runs the blocks wholly below the diagonal in one loop without a mask, then the few
blocks the diagonal crosses in a second loop with one (``causal_spans``). Grouped-query
attention reads K/V head ``h // group`` (the index map divides the query head), so K/V arrays
keep their ``kv_heads`` heads and are never repeated in memory. head_dim that is not a power of
two is padded inside the kernel: the blocks have the padded width and loads and stores are
masked to the real one, as in the stock kernel (no padded copy of q, k, v in memory).

Shapes reaching this module are already validated by ``kernels.attention``.

Modelled on jax's Pallas attention, ``jax/experimental/pallas/ops/gpu/attention.py``
(Copyright 2023 The JAX Authors, Apache License 2.0; see NOTICE). Taken from it as a model:
the grid (seq/block_q, batch, heads) with the Q tile resident and K/V handed over whole along
seq, the ``fori_loop`` over K/V in ``block_k`` steps, the online softmax in base 2 with
log2(e) folded into the scale, the base-2 lse as the backward's residual, the causal loop
bound, masked loads for a padded head_dim, and the names ``block_q``/``block_k``. Ours splits
the causal loop so only the diagonal blocks pay for a mask, and has no segment masks.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.smem import FWD_KERNEL

LOG2E = math.log2(math.e)
# A finite "minus infinity" for masked scores: a row whose first block were all masked would
# otherwise compute inf - inf (as the stock kernel, which uses the same value).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# The online softmax's loop state: (output accumulator, row max, row sum), all float32.
_Carry = tuple[jax.Array, jax.Array, jax.Array]


def dot_f32(a: jax.Array, b: jax.Array, *, contract_a: int = 1, contract_b: int = 0) -> jax.Array:
    """A 2-D matmul accumulated in float32 (maps onto one ``tt.dot``)."""
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


def cdiv(a: jax.Array, b: int) -> jax.Array:
    """Ceiling division of a traced index (``//`` is not defined on every index type here)."""
    return lax.div(a + b - 1, b)


def causal_spans(
    tile: jax.Array, rows: int, cols: int, steps: int, causal: bool
) -> tuple[jax.Array | int, jax.Array | int]:
    """Loop bounds for a resident query tile against streamed key blocks.

    The tile holds query rows ``[tile*rows, (tile+1)*rows)``, the loop streams key blocks of
    ``cols``. Returns ``(full, end)``: blocks ``[0, full)`` are wholly at or below the
    diagonal (no mask), ``[full, end)`` are crossed by it (masked), ``[end, steps)`` lie above
    it and are skipped. Without ``causal``: ``(steps, steps)``, static, so the loop is the
    fixed-trip-count loop it always was.
    """
    if not causal:
        return steps, steps
    return lax.div(tile * rows, cols), cdiv((tile + 1) * rows, cols)


def causal_mask(row0: jax.Array, rows: int, col0: jax.Array, cols: int) -> jax.Array:
    """(rows, cols) booleans: query ``row0 + r`` may see key ``col0 + c``."""
    return (row0 + jnp.arange(rows))[:, None] >= (col0 + jnp.arange(cols))[None, :]


def head_mask(padded: int, head_dim: int) -> jax.Array | None:
    """Columns of a padded head_dim that hold data, or ``None`` when nothing is padded."""
    return None if padded == head_dim else (jnp.arange(padded) < head_dim)[None, :]


def load(ref: Any, mask: jax.Array | None) -> jax.Array:
    """A block read, masked to the real head_dim (padding reads as zeros). ``ref``: a block's
    ref or a view of it (``ref.at[...]``), hence ``Any``."""
    return ref[...] if mask is None else plgpu.load(ref, mask=mask, other=0.0)


def store(ref: Any, value: jax.Array, mask: jax.Array | None) -> None:
    """A block write that leaves the padding columns alone (they do not exist in the array)."""
    if mask is None:
        ref[...] = value
    else:
        plgpu.store(ref, value, mask=mask)


def _fwd_kernel(
    q_ref: jax.Ref,
    k_ref: jax.Ref,
    v_ref: jax.Ref,
    o_ref: jax.Ref,
    lse_ref: jax.Ref,
    *,
    qk_scale: float,
    block_k: int,
    causal: bool,
    head_dim: int,
) -> None:
    """One (query tile, batch, head) program: Q tile resident, K/V streamed.

    Pallas passes every operand as a ref to its block (a tracer whose abstract value is a
    ``jax.ref.AbstractRef``; ``isinstance(ref, jax.Ref)`` holds for it), hence ``jax.Ref``:
    ``ref[...]`` reads the block as an array, ``ref[...] = x`` writes it.
    """
    block_q, padded = q_ref.shape
    seq = k_ref.shape[0]
    cols = head_mask(padded, head_dim)
    q = load(q_ref, cols)
    tile = pl.program_id(0)

    def step(j: jax.Array, carry: _Carry, *, masked: bool) -> _Carry:
        acc, m_prev, l_prev = carry
        kv_rows = pl.ds(j * block_k, block_k)
        k = load(k_ref.at[kv_rows, :], cols)
        v = load(v_ref.at[kv_rows, :], cols)
        s = dot_f32(q, k, contract_b=1) * qk_scale  # (block_q, block_k), log2 domain
        if masked:
            s = jnp.where(causal_mask(tile * block_q, block_q, j * block_k, block_k), s, MASK_VALUE)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        alpha = jnp.exp2(m_prev - m_new)  # rescales what was summed so far
        p = jnp.exp2(s - m_new[:, None])
        l_new = alpha * l_prev + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot_f32(p.astype(v.dtype), v)
        return acc, m_new, l_new

    init = (
        jnp.zeros((block_q, padded), jnp.float32),
        jnp.full((block_q,), -jnp.inf, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
    )
    full, end = causal_spans(tile, block_q, block_k, seq // block_k, causal)
    carry = lax.fori_loop(0, full, functools.partial(step, masked=False), init)
    if causal:
        carry = lax.fori_loop(full, end, functools.partial(step, masked=True), carry)
    acc, m, l_sum = carry
    store(o_ref, (acc / l_sum[:, None]).astype(o_ref.dtype), cols)
    lse_ref[...] = m + jnp.log2(l_sum)


def flash_fwd(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    sm_scale: float,
    causal: bool,
    padded: int,
    block_q: int,
    block_k: int,
    num_warps: int,
    num_stages: int,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """Output (batch, seq, heads, head_dim) and base-2 lse (batch, heads, seq) in float32.

    ``k``/``v`` have ``kv_heads`` heads dividing ``heads``; ``padded`` is the block width of
    head_dim (the next power of two)."""
    batch, seq, heads, head_dim = q.shape
    group = heads // k.shape[2]
    kernel = functools.partial(
        _fwd_kernel, qk_scale=sm_scale * LOG2E, block_k=block_k, causal=causal, head_dim=head_dim
    )
    q_tile = pl.BlockSpec((None, block_q, None, padded), lambda i, b, h: (b, i, h, 0))
    full_seq = pl.BlockSpec((None, seq, None, padded), lambda i, b, h: (b, 0, lax.div(h, group), 0))
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
