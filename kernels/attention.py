"""Public face of the flash-attention kernel: its config, validation, autodiff and ``auto``.

Every tunable the sweep varies is one field of ``AttentionConfig`` and reaches the kernels
unchanged (no hidden defaults inside a launch), so a record's config is exactly what ran.
Validation happens here, once, with messages that show the offending values, before anything
is traced; the kernels in ``flash_fwd``/``flash_bwd`` assume clean shapes. The reference
helpers are re-exported so callers can take the whole API from this one module.

head_dim that is not a power of two is zero-padded to the next one (Triton tiles must be
powers of two) and the padding is sliced off again; zero columns change neither the scores
nor the gradients. The softmax scale still uses the real head_dim.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

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
from kernels.smem import (
    FWD_KERNEL,
    check_mode,
    dtype_name,
    first_over,
    padded_head_dim,
    predict,
)

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

logger = logging.getLogger(__name__)

MIN_BLOCK = 16  # the smallest tile a Triton dot accepts


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Every tunable of the kernel.

    ``bwd_outer`` is the resident tile of the fused backward (block_kv_dkv = block_q_dq),
    ``bwd_inner`` the streamed one (block_q_dkv = block_kv_dq). ``num_warps`` and
    ``num_stages`` apply to the forward and to every backward launch. ``num_warps=None``
    means 4 if head_dim <= 64 else 8. Blocks larger than seq are clamped to seq; seq must be
    a multiple of each block, and off interpret mode each block must be a power of two.
    """

    block_q: int = 128
    block_k: int = 128
    bwd_outer: int = 128
    bwd_inner: int = 128
    num_warps: int | None = None
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_q", "block_k", "bwd_outer", "bwd_inner", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        w = self.num_warps
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise ValueError(f"num_warps={w!r} must be a positive int or None")


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


def default_num_warps(head_dim: int) -> int:
    """The library default: 4 warps if head_dim <= 64 else 8."""
    return 4 if head_dim <= 64 else 8


def _resolve(config: AttentionConfig, *, seq: int, head_dim: int, sm_scale: float | None,
             interpret: bool | None) -> _Plan:
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    blocks = {}
    for name in ("block_q", "block_k", "bwd_outer", "bwd_inner"):
        block = min(getattr(config, name), seq)
        if seq % block:
            raise ValueError(f"{seq=} must be a multiple of {name}={block}")
        if not interpret and block & (block - 1):
            # Triton would refuse too, but naming the tile and the clamp is clearer.
            raise ValueError(f"{name}={block} (clamped to {seq=}) must be a power of two "
                             "for the Triton backend")
        blocks[name] = block
    return _Plan(
        **blocks,
        num_warps=config.num_warps or default_num_warps(head_dim),
        num_stages=config.num_stages,
        sm_scale=default_sm_scale(head_dim) if sm_scale is None else float(sm_scale),
        interpret=bool(interpret),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q: jax.Array, k: jax.Array, v: jax.Array, plan: _Plan) -> jax.Array:
    return _attention_fwd(q, k, v, plan)[0]


def _attention_fwd(q: jax.Array, k: jax.Array, v: jax.Array,
                   plan: _Plan) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    o, lse = flash_fwd(q, k, v, sm_scale=plan.sm_scale, block_q=plan.block_q,
                       block_k=plan.block_k, num_warps=plan.num_warps,
                       num_stages=plan.num_stages, interpret=plan.interpret)
    return o, (q, k, v, o, lse)


def _attention_bwd(plan: _Plan, residuals: tuple[jax.Array, ...],
                   do: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    q, k, v, o, lse = residuals
    return flash_bwd(q, k, v, o, lse, do, sm_scale=plan.sm_scale,
                     bwd_outer=plan.bwd_outer, bwd_inner=plan.bwd_inner,
                     num_warps=plan.num_warps, num_stages=plan.num_stages,
                     interpret=plan.interpret)


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                    config: AttentionConfig | None = None, *, sm_scale: float | None = None,
                    interpret: bool | None = None) -> jax.Array:
    """Non-causal attention over layout (batch, seq, heads, head_dim), differentiable.

    ``config=None`` means ``AttentionConfig()`` (the library defaults, not checked against
    shared memory; see ``auto_config``). ``sm_scale=None`` means 1/sqrt(head_dim).
    ``interpret=None`` runs Pallas interpret mode whenever the default backend is not a GPU.
    The softmax runs in float32; the output has the inputs' dtype.
    """
    if not (q.ndim == 4 and q.shape == k.shape == v.shape):
        raise ValueError("q, k, v must share one shape (batch, seq, heads, head_dim); got "
                         f"{q.shape=}, {k.shape=}, {v.shape=}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype=}, {k.dtype=}, {v.dtype=}")
    dtype_name(q.dtype)  # raises, naming the allowed dtypes
    _, seq, _, head_dim = q.shape
    plan = _resolve(config or AttentionConfig(), seq=seq, head_dim=head_dim,
                    sm_scale=sm_scale, interpret=interpret)
    padded = padded_head_dim(head_dim)
    if padded == head_dim:
        return _attention(q, k, v, plan)
    pad = ((0, 0), (0, 0), (0, 0), (0, padded - head_dim))
    o = _attention(*(jnp.pad(x, pad) for x in (q, k, v)), plan)
    return o[..., :head_dim]


def build(mode: str, config: AttentionConfig, *, sm_scale: float | None = None,
          interpret: bool | None = None) -> ModeFn:
    """``f(q, k, v, do)``: "fwd" -> ``(o,)``; "fwd_bwd" -> ``(o, dq, dk, dv)``. Ready for jit."""
    attend: Callable[..., jax.Array] = functools.partial(
        flash_attention, config=config, sm_scale=sm_scale, interpret=interpret)
    return mode_fn(mode, attend)


def _fit_block(seq: int, want: int) -> int:
    """The largest power of two <= min(want, seq) that divides seq, tried down to MIN_BLOCK."""
    block = 1 << (min(want, seq).bit_length() - 1)
    while seq % block and block > MIN_BLOCK:
        block //= 2
    return block


def auto_config(*, mode: str, dtype: Any, head_dim: int, seq: int,
                smem_limit_bytes: int | None) -> AttentionConfig:
    """The config the sweep's ``auto`` record runs: a guess that always fits shared memory.

    Heuristic (modelled on what the reference H100 run's ``auto`` measured like):

    - Start from 128 x 128 tiles forward and backward, 2 pipeline stages, each block clamped
      to seq (then the largest power of two at or below that which divides seq).
    - While ``kernels.smem`` predicts a kernel over ``smem_limit_bytes``: first drop to 1
      stage, then halve the larger tile of the offending kernel (forward: block_q/block_k,
      backward: bwd_outer/bwd_inner; on a tie the streamed one, block_k or bwd_inner), down to
      16. ``None`` means no limit. If even 16-wide single-stage tiles do not fit, ValueError.
    - num_warps: "fwd" uses the library default (4 if head_dim <= 64 else 8). "fwd_bwd" shares
      one value between forward and backward and picks it for the backward, which dominates:
      8 if bwd_outer * bwd_inner >= 128 * 128 or head_dim > 64, else 4 (the stock backward's
      rule plus the head_dim rule; bf16 head_dim 64 gives 128/128 with 8 warps, as measured).

    Examples with the H100 limit 232448: float32 head_dim 128 fwd -> 128/128 with 1 stage;
    float32 head_dim 128 fwd_bwd -> 1 stage, bwd 128/64.
    """
    check_mode(mode)
    dtype = dtype_name(dtype)
    cfg = AttentionConfig(block_q=_fit_block(seq, 128), block_k=_fit_block(seq, 128),
                          bwd_outer=_fit_block(seq, 128), bwd_inner=_fit_block(seq, 128),
                          num_warps=None, num_stages=2)
    while (over := first_over(predict(mode, dtype, head_dim, cfg), smem_limit_bytes)):
        kernel, nbytes = over
        if cfg.num_stages > 1:
            cfg = dataclasses.replace(cfg, num_stages=1)
            continue
        resident, streamed = (("block_q", "block_k") if kernel == FWD_KERNEL
                              else ("bwd_outer", "bwd_inner"))
        name = resident if getattr(cfg, resident) > getattr(cfg, streamed) else streamed
        if getattr(cfg, name) // 2 < MIN_BLOCK:
            raise ValueError(f"no config fits {smem_limit_bytes=} for {mode=}, {dtype=}, "
                             f"{head_dim=}: {kernel} needs {nbytes} bytes at {cfg}")
        cfg = dataclasses.replace(cfg, **{name: getattr(cfg, name) // 2})
    if mode == "fwd":
        warps = default_num_warps(head_dim)
    else:
        big_tiles = cfg.bwd_outer * cfg.bwd_inner >= 128 * 128
        warps = 8 if big_tiles or head_dim > 64 else 4
    cfg = dataclasses.replace(cfg, num_warps=warps)
    logger.debug("auto_config(%s, %s, head_dim=%d, seq=%d) -> %s", mode, dtype, head_dim, seq, cfg)
    return cfg
