"""jax's stock Pallas attention (``jax.experimental.pallas.ops.gpu.attention.mha``) behind our config.

Users who train with the stock ``mha`` can tune it without switching kernels: the sweep's
config fields map onto its arguments as the reference run's harness mapped them (facts file):

- ``block_q``/``block_k`` -> ``BlockSizes.block_q``/``block_k`` (the forward's tiles);
- ``bwd_outer`` -> ``block_kv_dkv`` and ``block_q_dq`` (the backward's resident tiles; the
  fused backward requires seq/block_q_dq == seq/block_kv_dkv, which one field guarantees);
- ``bwd_inner`` -> ``block_q_dkv`` and ``block_kv_dq`` (the streamed ones);
- ``num_warps`` -> ``num_warps`` (forward and backward; ``None``: mha's own rule per kernel);
- ``num_stages`` -> ``num_stages``, which reaches the forward only: the stock backward deletes
  the argument and runs 2 stages (``kernels.impls`` pins it, so a sweep does not vary it).

What the stock kernel cannot do, it refuses here with the values: grouped-query attention (it
wants one K/V head per query head). head_dim that is not a power of two it pads itself.
``mha``'s sm_scale defaults to 1.0; ours to 1/sqrt(head_dim), passed explicitly so both
implementations compute the same function. The module's import warns that it is deprecated in
favour of tokamax; that warning is silenced here (docs/kernels.md says so).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax

from kernels.config import AttentionConfig
from kernels.reference import ModeFn, default_sm_scale, mode_fn
from kernels.smem import check_head_dim, dtype_name

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pallas.ops.gpu import attention as _stock

BlockSizes = _stock.BlockSizes
mha = _stock.mha


def block_sizes(config: AttentionConfig) -> Any:
    """The ``BlockSizes`` of a config (mapping in the module docstring)."""
    return BlockSizes(
        block_q=config.block_q,
        block_k=config.block_k,
        block_q_dkv=config.bwd_inner,
        block_kv_dkv=config.bwd_outer,
        block_q_dq=config.bwd_outer,
        block_kv_dq=config.bwd_inner,
    )


def mha_kwargs(config: AttentionConfig) -> dict[str, Any]:
    """Keyword arguments of ``mha`` for a config: ``mha(q, k, v, None, **mha_kwargs(cfg))``."""
    return {"block_sizes": block_sizes(config), "num_warps": config.num_warps, "num_stages": config.num_stages}


def stock_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    config: AttentionConfig,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """``mha`` with this config, over layout (batch, seq, heads, head_dim)."""
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            "jax's stock mha has no grouped-query attention: q, k, v must share one shape "
            f"(batch, seq, heads, head_dim); got {q.shape=}, {k.shape=}, {v.shape=}"
        )
    dtype_name(q.dtype)
    head_dim = check_head_dim(q.shape[-1])
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    scale = default_sm_scale(head_dim) if sm_scale is None else float(sm_scale)
    return mha(q, k, v, None, sm_scale=scale, causal=causal, interpret=bool(interpret), **mha_kwargs(config))


def build(
    mode: str,
    config: AttentionConfig,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    interpret: bool | None = None,
) -> ModeFn:
    """``f(q, k, v, do)`` as ``kernels.attention.build`` makes it, running the stock ``mha``."""
    attend = functools.partial(stock_attention, config=config, causal=causal, sm_scale=sm_scale, interpret=interpret)
    return mode_fn(mode, attend)
