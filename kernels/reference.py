"""Plain-jnp attention, the inputs and the error measure every kernel result is judged by.

Kept apart from the kernel so that a bug in the Pallas code cannot leak into the yardstick:
this module imports nothing from ``kernels.attention``. The reference runs in float32 with
``Precision.HIGHEST`` (on a GPU the default float32 matmul is tf32, which would make the
yardstick as coarse as the thing it measures), or in float64 when x64 is enabled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels.smem import check_mode, dtype_name

# What rel_err compares: one array (a forward output) or a sequence of them (output and gradients).
Outputs = Sequence[Any] | jax.Array | np.ndarray

AttentionFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
ModeFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, ...]]


def default_sm_scale(head_dim: int) -> float:
    """The usual 1/sqrt(head_dim) softmax scale."""
    return 1.0 / math.sqrt(head_dim)


def _compute_dtype() -> Any:
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32


def attention_reference(
    q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False, sm_scale: float | None = None
) -> jax.Array:
    """softmax(q k^T * sm_scale) v over layout (batch, seq, heads, head_dim), as float32.

    ``k``/``v`` may have fewer heads than ``q`` (grouped-query attention: query head ``h``
    reads K/V head ``h // (heads // kv_heads)``); the yardstick simply repeats them, which the
    kernels must not do. ``causal`` lets query ``i`` see keys ``0..i`` only.
    """
    ct = _compute_dtype()
    q, k, v = (x.astype(ct) for x in (q, k, v))
    heads, kv_heads = q.shape[2], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"query heads must be a multiple of K/V heads; got {q.shape=}, {k.shape=}")
    k, v = (jnp.repeat(x, heads // kv_heads, axis=2) for x in (k, v))
    scale = default_sm_scale(q.shape[-1]) if sm_scale is None else sm_scale
    hi = jax.lax.Precision.HIGHEST
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=hi) * scale
    if causal:
        seq = q.shape[1]
        logits = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v, precision=hi).astype(jnp.float32)


def mode_fn(mode: str, attend: AttentionFn) -> ModeFn:
    """Wrap an attention function into the sweep's uniform ``f(q, k, v, do) -> outputs``.

    One signature for both modes lets the timing harness and the worker treat every config
    alike: "fwd" returns ``(o,)`` and ignores ``do``; "fwd_bwd" returns ``(o, dq, dk, dv)``
    from ``jax.vjp`` with ``do`` as the cotangent, so the timed program is forward + backward.
    """
    check_mode(mode)
    if mode == "fwd":

        def fwd(q: jax.Array, k: jax.Array, v: jax.Array, do: jax.Array) -> tuple[jax.Array]:
            del do
            return (attend(q, k, v),)

        return fwd

    def fwd_bwd(q: jax.Array, k: jax.Array, v: jax.Array, do: jax.Array) -> tuple[jax.Array, ...]:
        o, vjp = jax.vjp(attend, q, k, v)
        return (o, *vjp(do.astype(o.dtype)))

    return fwd_bwd


def build_reference(mode: str, *, causal: bool = False, sm_scale: float | None = None) -> ModeFn:
    """``mode_fn`` over ``attention_reference``; every output (gradients too) is float32."""
    inner = mode_fn(mode, lambda q, k, v: attention_reference(q, k, v, causal=causal, sm_scale=sm_scale))

    def reference(q: jax.Array, k: jax.Array, v: jax.Array, do: jax.Array) -> tuple[jax.Array, ...]:
        # Differentiate with respect to upcast inputs so the gradients are not rounded back
        # to the inputs' (possibly bfloat16) dtype.
        ct = _compute_dtype()
        outs = inner(*(x.astype(ct) for x in (q, k, v, do)))
        return tuple(x.astype(jnp.float32) for x in outs)

    return reference


def make_inputs(
    *, batch: int, seq: int, heads: int, head_dim: int, dtype: Any, seed: int = 0, kv_heads: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(q, k, v, do): seeded standard-normal arrays, never zeros (zeros hide wrong kernels).

    Drawn on the host by numpy, each array from its own stream of the seed: the same numbers
    on every backend for a seed, and none depends on the others' shapes. (jax.random draws
    the same everywhere too, but compiles its generator for every new shape: 1.3-1.8 CPU
    seconds a shape, measured, more than the timing of a small sweep's configs.) ``k`` and
    ``v`` have ``kv_heads`` heads (``None``: ``heads``, multi-head attention).
    """
    shape = (batch, seq, heads, head_dim)
    kv_shape = (batch, seq, heads if kv_heads is None else kv_heads, head_dim)
    dt = jnp.dtype(dtype_name(dtype))

    def draw(stream: int, size: tuple[int, ...]) -> jax.Array:
        normal = np.random.default_rng([seed, stream]).standard_normal(size, dtype=np.float32)
        return jnp.asarray(normal.astype(dt))

    return draw(0, shape), draw(1, kv_shape), draw(2, kv_shape), draw(3, shape)


def _as_float64(xs: Sequence[Any] | jax.Array | np.ndarray) -> list[np.ndarray]:
    if isinstance(xs, (jax.Array, np.ndarray)):
        xs = [xs]
    return [np.asarray(x).astype(np.float64) for x in xs]


def rel_err(outs: Outputs, refs: Outputs) -> float:
    """||out - ref|| / ||ref|| over all outputs concatenated (one array or a sequence of them).

    One number per config: for fwd_bwd it pools the output and the three gradients, so a
    wrong gradient cannot hide behind a correct output. Device arrays are reduced on the
    device in float32 (copying a large fwd_bwd result to the host in float64 costs seconds
    per config, more than its compile); host arrays are reduced in float64. Either way the
    square roots and the ratio are taken in float64.
    """
    a, b = _as_list(outs), _as_list(refs)
    if [tuple(x.shape) for x in a] != [tuple(x.shape) for x in b]:
        raise ValueError(
            f"outputs and references differ in shape: {[tuple(x.shape) for x in a]} vs {[tuple(x.shape) for x in b]}"
        )
    if any(isinstance(x, jax.Array) for x in a + b):
        diff_sq, ref_sq = (float(v) for v in _square_sums(tuple(a), tuple(b)))
    else:
        a64, b64 = _as_float64(a), _as_float64(b)
        ref_sq = sum(float(np.sum(y * y)) for y in b64)
        diff_sq = sum(float(np.sum((x - y) ** 2)) for x, y in zip(a64, b64, strict=True))
    ref_norm, diff_norm = math.sqrt(ref_sq), math.sqrt(diff_sq)
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    return diff_norm / ref_norm


def _as_list(xs: Outputs) -> list[Any]:
    return [xs] if isinstance(xs, (jax.Array, np.ndarray)) else list(xs)


@jax.jit
def _square_sums(outs: tuple[Any, ...], refs: tuple[Any, ...]) -> tuple[jax.Array, jax.Array]:
    f32 = jnp.float32
    zero = jnp.zeros((), f32)  # a typed start: the default 0 would make the sums int | Array
    diff = sum(
        (jnp.sum(jnp.square(jnp.asarray(o, f32) - jnp.asarray(r, f32))) for o, r in zip(outs, refs, strict=True)), zero
    )
    ref = sum((jnp.sum(jnp.square(jnp.asarray(r, f32))) for r in refs), zero)
    return diff, ref
