"""Closed-form shared-memory model of the flash-attention kernels.

Why a model: on the GPU a config that needs more shared memory than the device has fails only
at compile time, with ``RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested N``.
Knowing N in advance lets ``auto_config`` fall back to a config that fits, and lets a report
explain failures. The formulas were fitted to the reference H100 run (72/72 failures with the
exact requested byte count, 744/744 successes at or under 232448 bytes); the bfloat16 terms and
the single-stage forward term are bounded, not pinned, by that data.

float16 takes the bfloat16 terms (same element size; the model has no other dtype dependence
than the float32 extras), and a head_dim that is not a power of two takes the padded one, as
the kernels pad it. Neither causal masking nor grouped-query attention changes a tile: causal
only shortens the loops (our kernel runs the diagonal tiles in a second, masked loop, which
Triton can give the first loop's buffers back to) and grouped-query only changes which K/V
head a program reads. Those three readings are the model's, not measured on a GPU.

This module is deliberately free of jax so the control plane can use it on a laptop; it also
holds the small vocabulary (modes, dtypes, head_dim range) every kernel module validates against.
"""

from __future__ import annotations

from typing import Any, Protocol

from kernels.spelling import as_json, one_of

MODES: tuple[str, ...] = ("fwd", "fwd_bwd")
DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
_ELEMENT_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
# head_dim the kernels take: a Triton dot needs a contraction of at least 16, and above 256 no
# tile of the sweep fits an H100's shared memory (nor was the model checked there).
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 256
H100_SMEM_LIMIT_BYTES = 232448  # per-block opt-in limit of the reference run's H100 (and H200)

# Kernel names as they appear in pallas_call(name=...) and hence in the lowered custom calls.
FWD_KERNEL = "flash_fwd"
BWD_PREPROCESS_KERNEL = "flash_bwd_preprocess"
BWD_KERNEL = "flash_bwd"
# ... and those of jax's stock kernel (``kernels.stock``), whose backward runs 2 stages always.
STOCK_FWD_KERNEL = "mha_forward"
STOCK_BWD_PREPROCESS_KERNEL = "mha_preprocess_backward"
STOCK_BWD_KERNEL = "mha_backward"
STOCK_BWD_STAGES = 2


class _TileConfig(Protocol):
    """The fields of ``kernels.config.AttentionConfig`` the model reads.

    A protocol rather than an import so this module stays the bottom of the import graph.
    Read-only properties, because ``AttentionConfig`` is a frozen dataclass: plain attributes
    would ask for settable fields, which a frozen config does not have.
    """

    @property
    def block_q(self) -> int: ...
    @property
    def block_k(self) -> int: ...
    @property
    def bwd_outer(self) -> int: ...
    @property
    def bwd_inner(self) -> int: ...
    @property
    def num_stages(self) -> int: ...


def dtype_name(dtype: Any) -> str:
    """Canonical name of a supported dtype given as a string, numpy/jax dtype or scalar type."""
    if isinstance(dtype, str):
        name = dtype
    else:
        name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if name not in _ELEMENT_BYTES:
        raise ValueError(f"unsupported dtype {as_json(name)}; allowed: {one_of(DTYPES)}")
    return name


def element_bytes(dtype: Any) -> int:
    """Bytes of one element of a supported dtype."""
    return _ELEMENT_BYTES[dtype_name(dtype)]


def check_mode(mode: str) -> str:
    """Return ``mode`` if it is one of ``MODES``, else raise naming the allowed values."""
    if mode not in MODES:
        raise ValueError(f"unsupported mode {as_json(mode)}; allowed: {one_of(MODES)}")
    return mode


def padded_head_dim(head_dim: int) -> int:
    """The kernels pad head_dim to a power of two (Triton tiles must be powers of two)."""
    if head_dim < 1:
        raise ValueError(f"{head_dim=} must be positive")
    return 1 << (head_dim - 1).bit_length()


def check_head_dim(head_dim: int) -> int:
    """Return ``head_dim`` if the kernels take it, else raise naming the allowed range."""
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"{head_dim=} is not supported; allowed: {MIN_HEAD_DIM} to {MAX_HEAD_DIM} "
            "(not a power of two is fine: it is padded inside the kernel)"
        )
    return head_dim


def fwd_bytes(dtype: Any, head_dim: int, block_q: int, block_k: int, num_stages: int) -> int:
    """Shared memory of the forward kernel.

    Term by term: a Q tile, K/V tiles ``2*(S-1)`` deep when pipelined (one when not), and one
    more block_k x head_dim tile for float32. Only the totals were checked against the GPU;
    which buffer each term is, is our reading.
    """
    e = _ELEMENT_BYTES[dtype_name(dtype)]
    d = padded_head_dim(head_dim)
    kv_tiles = 2 * (num_stages - 1) if num_stages >= 2 else 1
    f32_extra = block_k if e == 4 else 0
    return e * d * (block_q + block_k * kv_tiles + f32_extra)


def bwd_bytes(dtype: Any, head_dim: int, bwd_outer: int, bwd_inner: int, num_stages: int) -> int:
    """Shared memory of the fused dK/dV + dQ backward kernel.

    Term by term: two outer tiles, ``S-1`` pipelined pairs of inner tiles plus 8 bytes a row
    (two float32 row statistics, lse and delta), and for float32 one more inner pair and an
    outer x inner float32 tile. Only the totals were checked; the reading is ours.
    """
    e = _ELEMENT_BYTES[dtype_name(dtype)]
    d = padded_head_dim(head_dim)
    o, i, s = bwd_outer, bwd_inner, num_stages
    resident = 2 * o * d * e
    pipelined = (s - 1) * (2 * i * d * e + 8 * i) if s >= 2 else 0
    f32_extra = (2 * i * d * e + 4 * o * i) if e == 4 else 0
    return resident + pipelined + f32_extra


def clamp_block(block: int, seq: int) -> int:
    """The tile the kernel runs for a block asked of a sequence: a block larger than seq is
    clamped to seq (one tile covers the sequence). The planner records configs with the
    tiles that run, so it asks here rather than keeping its own copy of the rule."""
    return min(block, seq)


def predict_bytes(
    mode: str,
    dtype: Any,
    head_dim: int,
    *,
    seq: int | None = None,
    block_q: int = 128,
    block_k: int = 128,
    bwd_outer: int = 128,
    bwd_inner: int = 128,
    num_stages: int = 2,
    num_warps: int | None = None,
    bwd_num_stages: int | None = None,
    kernel_names: tuple[str, str] = (FWD_KERNEL, BWD_KERNEL),
) -> list[tuple[str, int]]:
    """(kernel name, bytes) per shared-memory-relevant kernel, in launch order.

    Keyword form of ``predict`` for callers holding plain config fields (num_warps is accepted
    and ignored: it does not change shared memory). With ``seq``, blocks are clamped to seq
    as the kernel clamps them. fwd_bwd runs the forward (block_q/block_k, the config's stages)
    before the backward; the delta preprocess kernel has no loop to pipeline and holds no
    tiles in shared memory, so it is left out. ``bwd_num_stages`` is for a backward that runs
    its own stage count whatever the config says (jax's stock kernel: 2), ``kernel_names`` the
    (forward, backward) names a runtime error would carry (``kernels.impls``).
    """
    del num_warps
    check_mode(mode)

    def clamp(block: int) -> int:
        return block if seq is None else clamp_block(block, seq)

    fwd_name, bwd_name = kernel_names
    out = [(fwd_name, fwd_bytes(dtype, head_dim, clamp(block_q), clamp(block_k), num_stages))]
    if mode == "fwd_bwd":
        stages = num_stages if bwd_num_stages is None else bwd_num_stages
        out.append((bwd_name, bwd_bytes(dtype, head_dim, clamp(bwd_outer), clamp(bwd_inner), stages)))
    return out


def predict(
    mode: str, dtype: Any, head_dim: int, config: _TileConfig, *, seq: int | None = None
) -> list[tuple[str, int]]:
    """``predict_bytes`` for an ``AttentionConfig``."""
    return predict_bytes(
        mode,
        dtype,
        head_dim,
        seq=seq,
        block_q=config.block_q,
        block_k=config.block_k,
        bwd_outer=config.bwd_outer,
        bwd_inner=config.bwd_inner,
        num_stages=config.num_stages,
    )


def first_over(predictions: list[tuple[str, int]], limit: int | None) -> tuple[str, int] | None:
    """The first kernel over ``limit``: the one whose byte count the runtime would report."""
    if limit is None:
        return None
    for name, nbytes in predictions:
        if nbytes > limit:
            return name, nbytes
    return None
