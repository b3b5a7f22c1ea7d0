"""jax's Mosaic GPU attention (``attention_mgpu.attention``) behind the sweep's uniform
``f(q, k, v, do)``, and its ``auto`` (``kernels.impl_mosaic`` says what the sweep knows of it).

A record's config fields are ``TuningConfig``'s own; ``tuning_config`` passes exactly the fields
the installed ``TuningConfig`` has (a jax whose dataclass lacks one of them runs without it,
with a warning), plus the problem's ``causal``. jax's kernel applies no softmax scale, so the
queries are scaled by ``sm_scale`` (1/sqrt(head_dim) by default, as the reference and the other
implementations use) before the call: one elementwise pass over q inside the timed program,
its gradient included, so every implementation computes the same function.

Importing jax's module needs absl-py (it imports ``jax._src.test_util``); tracing it needs a
CUDA plugin's version module (``jax._src.lib.cuda_versions``), without which jax fails with an
empty AssertionError: ``check_available`` says which package to install instead.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from kernels.devices import DeviceKind
from kernels.impl_base import Fields, Value
from kernels.impl_mosaic import (
    AUTO_BLOCK_KV,
    AUTO_BLOCK_Q,
    AUTO_STEPS,
    CAPABILITIES,
    CONFIG_FIELDS,
    MOSAIC,
    auto_backward,
)
from kernels.reference import ModeFn, default_sm_scale, mode_fn

log = logging.getLogger(__name__)

SMEM_REFUSAL = "Mosaic GPU kernel exceeds available shared memory"
INSTALL_PLUGIN = 'pip install --no-deps "jax-cuda12-plugin=={jaxlib}" (scripts/setup-venv.sh does)'


class MosaicUnavailable(RuntimeError):
    """jax's Mosaic GPU attention cannot be traced here: a package is missing (the message says which)."""


def check_available() -> None:
    """Raise ``MosaicUnavailable`` naming the package to install, if tracing cannot work here."""
    try:
        import absl  # noqa: F401
    except ImportError:
        raise MosaicUnavailable(
            "jax's attention_mgpu needs absl-py (it imports jax._src.test_util): pip install absl-py"
        ) from None
    from jax._src import lib

    if lib.cuda_versions is None:
        import jaxlib

        raise MosaicUnavailable(
            "jax's attention_mgpu needs a CUDA plugin's version module even to lower on a CPU: "
            + INSTALL_PLUGIN.format(jaxlib=jaxlib.__version__)
        )


def _module() -> Any:
    check_available()
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    return attention_mgpu


def tuning_config(fields: Fields, *, causal: bool) -> Any:
    """jax's ``TuningConfig`` of a record's fields (raises its own ValueError for a value it refuses)."""
    am = _module()
    known = {f.name for f in dataclasses.fields(am.TuningConfig)}
    missing = sorted(set(fields) - known)
    if missing:
        log.warning("this jax's TuningConfig has no %s; running without", ", ".join(missing))
    kwargs = {k: v for k, v in fields.items() if k in known}
    return am.TuningConfig(**kwargs, causal=causal)


def mosaic_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, fields: Fields, *, causal: bool = False, sm_scale: float | None = None
) -> jax.Array:
    """``attention_mgpu.attention`` with this config over layout (batch, seq, heads, head_dim)."""
    cfg = tuning_config(fields, causal=causal)
    scale = default_sm_scale(q.shape[-1]) if sm_scale is None else float(sm_scale)
    out: jax.Array = _module().attention((q * jnp.asarray(scale, q.dtype)).astype(q.dtype), k, v, cfg)
    return out


def build(
    mode: str,
    fields: Fields,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    interpret: bool | None = None,
) -> ModeFn:
    """``f(q, k, v, do)`` as ``kernels.attention.build`` makes it, running jax's Mosaic GPU kernel."""
    if interpret:
        raise ValueError(f"kernel.impl mosaic: {CAPABILITIES.why['interpret']}")
    attend = functools.partial(mosaic_attention, fields=dict(fields), causal=causal, sm_scale=sm_scale)
    return mode_fn(mode, attend)


def _fits(mode: str, fields: Mapping[str, Value], *, dtype: str, head_dim: int, seq: int, causal: bool) -> bool:
    """Whether the mode's program lowers within shared memory (on a CPU: under the abstract
    device ``kernels.preflight`` set up; on a GPU: for the GPU), batch and heads 1 (they change
    the grid, not a kernel's buffers). Any other error is the caller's to meet."""
    q = jax.ShapeDtypeStruct((1, seq, 1, head_dim), jnp.dtype(dtype))
    fn = build(mode, fields, causal=causal)
    try:
        jax.jit(fn).trace(q, q, q, q).lower(lowering_platforms=("cuda",))
    except ValueError as exc:
        if SMEM_REFUSAL in str(exc):
            return False
        raise
    return True


def auto_fields(mode: str, *, dtype: str, head_dim: int, seq: int, causal: bool = False) -> dict[str, Value]:
    """The config the ``auto`` record runs (``kernels.impl_mosaic``): the first block_kv of
    256, 128, 64 that divides seq and fits; the last one tried if none fits (its error is the record's)."""
    base: dict[str, Value] = {"block_q": AUTO_BLOCK_Q, "max_concurrent_steps": AUTO_STEPS}
    if mode == "fwd_bwd":
        base.update(auto_backward(head_dim))
    candidates = [b for b in AUTO_BLOCK_KV if seq % b == 0] or [AUTO_BLOCK_KV[-1]]
    for block_kv in candidates:
        fields = {**base, "block_kv": block_kv}
        if _fits(mode, fields, dtype=dtype, head_dim=head_dim, seq=seq, causal=causal):
            break
    log.debug("mosaic auto(%s, %s, head_dim=%d, seq=%d) -> %s", mode, dtype, head_dim, seq, fields)
    return fields


def auto_config(
    mode: str, *, dtype: str, head_dim: int, seq: int, device: DeviceKind, causal: bool = False
) -> dict[str, Value]:
    """The config the ``auto`` record runs on ``device``, found as the record finds it there (the
    first block_kv whose program lowers within its shared memory), by lowering for it on this
    machine (``kernels.preflight``), with every field of the mode as a forced record names them
    (``use_schedule_barrier`` as pinned, ``max_concurrent_steps`` as it runs): jax has no default
    config, so a tuned table's "use auto" entry answers this one."""
    from kernels import preflight

    with preflight.target(device):
        fields = auto_fields(mode, dtype=dtype, head_dim=head_dim, seq=seq, causal=causal)
    names = CONFIG_FIELDS[mode]
    params = tuple({**MOSAIC.pinned(mode)[0], **fields}[n] for n in names)
    return dict(zip(names, MOSAIC.runs_as(mode, seq, params), strict=True))
