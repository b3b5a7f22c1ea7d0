"""The kernel's tunables and the rules that pick them, without jax.

Everything here is plain arithmetic so that the control plane (planner, cost model, report)
can use the very rules the kernel uses instead of keeping copies of them: the tile config
(``AttentionConfig``), the config the sweep's ``auto`` record runs (``auto_config``), how
many calls one timed sample makes (``inner_for``) and the FLOP count that turns a time into
TFLOP/s (``attention_flops``). ``kernels.attention`` re-exports the config and ``auto``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from kernels.smem import FWD_KERNEL, check_mode, dtype_name, first_over, predict
from kernels.spelling import as_json

logger = logging.getLogger(__name__)

MIN_BLOCK = 16  # the smallest tile a Triton dot accepts
PROBE_OVERHEAD_MS = 0.1  # per-call dispatch overhead assumed when sizing ``inner``
PROBES = 3  # single calls timed to size ``inner`` (fewer once they add up to the target); the fastest counts
# FLOPs of one call relative to the forward's 4*B*H*S*S*D: the backward counts 2.5x the
# forward (five matmuls against two, the usual FlashAttention convention).
FLOP_FACTOR: dict[str, float] = {"fwd": 1.0, "fwd_bwd": 3.5}


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Every tunable of the kernel.

    ``bwd_outer`` is the resident tile of the fused backward (block_kv_dkv = block_q_dq),
    ``bwd_inner`` the streamed one (block_q_dkv = block_kv_dq). ``num_warps`` and
    ``num_stages`` apply to the forward and to every backward launch. ``num_warps=None``
    means 4 if head_dim <= 64 else 8. Blocks larger than seq are clamped to seq; seq must be
    a multiple of each block, and off interpret mode each block must be a power of two of at
    least ``MIN_BLOCK`` (each is a dimension of a Triton dot).
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
                raise ValueError(f"{name}={as_json(value)} must be a positive int")
        w = self.num_warps
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise ValueError(f"num_warps={as_json(w)} must be a positive int or null")


def default_num_warps(head_dim: int) -> int:
    """The library default: 4 warps if head_dim <= 64 else 8."""
    return 4 if head_dim <= 64 else 8


def fit_block(seq: int, want: int) -> int:
    """The largest power of two <= min(want, seq) that divides seq, tried down to MIN_BLOCK."""
    block = 1 << (min(want, seq).bit_length() - 1)
    while seq % block and block > MIN_BLOCK:
        block //= 2
    return block


def auto_config(*, mode: str, dtype: Any, head_dim: int, seq: int, smem_limit_bytes: int | None) -> AttentionConfig:
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
    cfg = AttentionConfig(
        block_q=fit_block(seq, 128),
        block_k=fit_block(seq, 128),
        bwd_outer=fit_block(seq, 128),
        bwd_inner=fit_block(seq, 128),
        num_warps=None,
        num_stages=2,
    )
    while over := first_over(predict(mode, dtype, head_dim, cfg), smem_limit_bytes):
        kernel, nbytes = over
        if cfg.num_stages > 1:
            cfg = dataclasses.replace(cfg, num_stages=1)
            continue
        resident, streamed = ("block_q", "block_k") if kernel == FWD_KERNEL else ("bwd_outer", "bwd_inner")
        name = resident if getattr(cfg, resident) > getattr(cfg, streamed) else streamed
        if getattr(cfg, name) // 2 < MIN_BLOCK:
            raise ValueError(
                f"no config fits {smem_limit_bytes=} for {mode=}, {dtype=}, "
                f"{head_dim=}: {kernel} needs {nbytes} bytes at {cfg}"
            )
        cfg = dataclasses.replace(cfg, **{name: getattr(cfg, name) // 2})
    if mode == "fwd":
        warps = default_num_warps(head_dim)
    else:
        big_tiles = cfg.bwd_outer * cfg.bwd_inner >= 128 * 128
        warps = 8 if big_tiles or head_dim > 64 else 4
    cfg = dataclasses.replace(cfg, num_warps=warps)
    logger.debug("auto_config(%s, %s, head_dim=%d, seq=%d) -> %s", mode, dtype, head_dim, seq, cfg)
    return cfg


def inner_for(probe_ms: float, *, target_ms: float, max_inner: int) -> int:
    """Calls per timed sample: ``clamp(floor(target_ms / (probe_ms + 0.1)), 1, max_inner)``.

    The reference run sized its samples this way (49% of its records exactly, 75% within one);
    the 0.1 ms stands for the per-call dispatch overhead of a sub-millisecond kernel."""
    return max(1, min(max_inner, math.floor(target_ms / (probe_ms + PROBE_OVERHEAD_MS))))


def probe_calls(call_ms: float, *, target_ms: float, max_inner: int) -> int:
    """The single calls ``kernels.timing.measure`` probes a kernel whose calls take ``call_ms``
    with: until they add up to ``target_ms``, at most ``PROBES``; none when ``max_inner`` is 1,
    where a sample is one call whatever the probe says."""
    if max_inner <= 1:
        return 0
    return PROBES if call_ms <= 0 else min(PROBES, max(1, math.ceil(target_ms / call_ms)))


def timed_calls(call_ms: float, *, repeats: int, target_ms: float, max_inner: int, warmup: int) -> tuple[int, int]:
    """(inner, calls) of one ``kernels.timing.measure`` of a kernel whose calls take ``call_ms``:
    ``warmup`` calls, the probes (``probe_calls``), then ``repeats`` samples of ``inner`` calls.
    The replay's virtual clock counts timed seconds with it, so a replayed sweep spends what the
    real one would."""
    probes = probe_calls(call_ms, target_ms=target_ms, max_inner=max_inner)
    inner = inner_for(call_ms, target_ms=target_ms, max_inner=max_inner)
    return inner, warmup + probes + repeats * inner


def attention_flops(
    mode: str, batch: int, heads: int, seq: int, head_dim: int, *, causal: bool = False
) -> float | None:
    """FLOPs of one call: fwd ``4*B*H*S*S*D`` (two matmuls, 2 FLOPs per multiply-add),
    fwd_bwd 3.5x that, and half of either for causal attention, which computes only the
    lower triangle of the score matrix (the usual FlashAttention convention: the tiles on the
    diagonal that a kernel computes in full and masks are not counted, so TFLOP/s compares
    kernels by useful work). ``heads`` are the query heads: grouped-query attention does the
    same matmuls with fewer K/V heads. Softmax and elementwise work are not counted. ``None``
    for a mode without a formula."""
    factor = FLOP_FACTOR.get(mode)
    if factor is None:
        return None
    return factor * (0.5 if causal else 1.0) * 4.0 * batch * heads * seq * seq * head_dim
