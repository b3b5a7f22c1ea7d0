"""Public face of the flash-attention kernel: its config, validation, autodiff and ``auto``.

Every tunable the sweep varies is one field of ``AttentionConfig`` and reaches the kernels
unchanged (no hidden defaults inside a launch), so a record's config is exactly what ran.
Validation happens here, once, with messages that show the offending values, before anything
is traced; the kernels in ``flash_fwd``/``flash_bwd`` assume clean shapes. The reference
helpers are re-exported so callers can take the whole API from this one module.

Options beside the tiles: ``causal`` (query i sees keys 0..i; the kernels skip the tiles above
the diagonal) and grouped-query attention, given by the shapes: ``k``/``v`` with ``kv_heads``
heads dividing the query heads (1 is multi-query). head_dim runs from 16 to 256; one that is
not a power of two is padded to the next one inside the kernels (blocks of the padded width,
masked loads and stores; Triton tiles must be powers of two); zero columns change neither the
scores nor the gradients. The softmax scale uses the real head_dim.

The interface follows ``mha`` of jax's Pallas attention (``jax/experimental/pallas/ops/gpu/
attention.py``, Copyright 2023 The JAX Authors, Apache License 2.0; see NOTICE): the layout
(batch, seq, heads, head_dim), a ``jax.custom_vjp`` whose forward keeps (q, k, v, o, lse) for
the backward, blocks clamped to seq, seq a multiple of every block, num_warps by head_dim, and
its block-size naming (``block_q``, ``block_k``; its four backward blocks become ``bwd_outer``
and ``bwd_inner``, see ``flash_bwd``) and its ``causal`` flag. Unlike ``mha``: no segment_ids,
grouped-query attention, sm_scale defaults to 1/sqrt(head_dim) (``mha``: 1.0), and one frozen
config instead of ``BlockSizes`` plus keyword arguments.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax

from kernels.config import MIN_BLOCK, AttentionConfig, auto_config, default_num_warps
from kernels.flash_bwd import flash_bwd
from kernels.flash_fwd import flash_fwd
from kernels.reference import (
    ModeFn,
    attention_reference,
    build_reference,
    default_sm_scale,
    make_inputs,
    mode_fn,
    rel_err,
)
from kernels.smem import check_head_dim, dtype_name, padded_head_dim

__all__ = [
    "AttentionConfig",
    "attention_reference",
    "auto_config",
    "build",
    "build_reference",
    "flash_attention",
    "make_inputs",
    "rel_err",
]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A config resolved against one problem shape; hashable, so it can be a static argument."""

    block_q: int
    block_k: int
    bwd_outer: int
    bwd_inner: int
    num_warps: int
    num_stages: int
    sm_scale: float
    interpret: bool
    causal: bool
    padded: int  # head_dim's block width


def _resolve(
    config: AttentionConfig,
    *,
    seq: int,
    head_dim: int,
    causal: bool,
    sm_scale: float | None,
    interpret: bool | None,
) -> _Plan:
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    blocks = {}
    for name in ("block_q", "block_k", "bwd_outer", "bwd_inner"):
        block = min(getattr(config, name), seq)
        if seq % block:
            raise ValueError(f"{seq=} must be a multiple of {name}={block}")
        if not interpret and block & (block - 1):
            # Triton would refuse too, but naming the tile and the clamp is clearer.
            raise ValueError(f"{name}={block} (clamped to {seq=}) must be a power of two for the Triton backend")
        if not interpret and block < MIN_BLOCK:  # a dot's dimension: tl.dot takes 16 and up
            raise ValueError(f"{name}={block} (clamped to {seq=}) must be at least {MIN_BLOCK} for the Triton backend")
        blocks[name] = block
    return _Plan(
        **blocks,
        num_warps=config.num_warps or default_num_warps(head_dim),
        num_stages=config.num_stages,
        sm_scale=default_sm_scale(head_dim) if sm_scale is None else float(sm_scale),
        interpret=bool(interpret),
        causal=bool(causal),
        padded=padded_head_dim(head_dim),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q: jax.Array, k: jax.Array, v: jax.Array, plan: _Plan) -> jax.Array:
    return _attention_fwd(q, k, v, plan)[0]


def _attention_fwd(q: jax.Array, k: jax.Array, v: jax.Array, plan: _Plan) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    o, lse = flash_fwd(
        q,
        k,
        v,
        sm_scale=plan.sm_scale,
        causal=plan.causal,
        padded=plan.padded,
        block_q=plan.block_q,
        block_k=plan.block_k,
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
        interpret=plan.interpret,
    )
    return o, (q, k, v, o, lse)


def _attention_bwd(
    plan: _Plan, residuals: tuple[jax.Array, ...], do: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    q, k, v, o, lse = residuals
    return flash_bwd(
        q,
        k,
        v,
        o,
        lse,
        do,
        sm_scale=plan.sm_scale,
        causal=plan.causal,
        padded=plan.padded,
        bwd_outer=plan.bwd_outer,
        bwd_inner=plan.bwd_inner,
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
        interpret=plan.interpret,
    )


_attention.defvjp(_attention_fwd, _attention_bwd)


def check_shapes(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    """Raise, showing the shapes, unless q is (batch, seq, heads, head_dim) and k, v are
    (batch, seq, kv_heads, head_dim) with kv_heads dividing heads, all of one supported dtype."""
    if not (q.ndim == 4 and k.shape == v.shape and k.ndim == 4):
        raise ValueError(
            "q, k, v must be (batch, seq, heads, head_dim) with k, v of one shape; "
            f"got {q.shape=}, {k.shape=}, {v.shape=}"
        )
    (batch, seq, heads, head_dim), (kb, ks, kv_heads, kd) = q.shape, k.shape
    if (kb, ks, kd) != (batch, seq, head_dim) or heads % kv_heads:
        raise ValueError(
            "k and v must share q's batch, seq and head_dim and have kv_heads dividing q's heads "
            f"(grouped-query attention); got {q.shape=}, {k.shape=}"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype=}, {k.dtype=}, {v.dtype=}")
    dtype_name(q.dtype)  # raises, naming the allowed dtypes
    check_head_dim(head_dim)


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    config: AttentionConfig | None = None,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Attention over layout (batch, seq, heads, head_dim), differentiable.

    ``k``/``v`` may have fewer heads than ``q`` (grouped-query attention; query head ``h``
    uses K/V head ``h // (heads // kv_heads)``). ``causal`` lets query i see keys 0..i.
    ``config=None`` means ``AttentionConfig()`` (the library defaults, not checked against
    shared memory; see ``auto_config``). ``sm_scale=None`` means 1/sqrt(head_dim).
    ``interpret=None`` runs Pallas interpret mode whenever the default backend is not a GPU.
    The softmax runs in float32; the output has the inputs' dtype.
    """
    check_shapes(q, k, v)
    _, seq, _, head_dim = q.shape
    plan = _resolve(
        config or AttentionConfig(), seq=seq, head_dim=head_dim, causal=causal, sm_scale=sm_scale, interpret=interpret
    )
    return _attention(q, k, v, plan)


def build(
    mode: str,
    config: AttentionConfig,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    interpret: bool | None = None,
) -> ModeFn:
    """``f(q, k, v, do)``: "fwd" -> ``(o,)``; "fwd_bwd" -> ``(o, dq, dk, dv)``. Ready for jit."""
    attend: Callable[..., jax.Array] = functools.partial(
        flash_attention, config=config, causal=causal, sm_scale=sm_scale, interpret=interpret
    )
    return mode_fn(mode, attend)
