"""The kernel implementations a sweep can tune, behind one small interface.

An implementation is what the spec's ``kernel.impl`` names. Each says what it can do and what
it runs, so the planner, the cost model and the worker treat them alike instead of branching
on names:

- ``grouped_query``: whether it takes K/V with fewer heads than Q (causal both do);
- ``pinned``: tunables it ignores, with the value it runs instead (per mode), so the planner
  sweeps one value of them and says so once, instead of timing the same kernel twice;
- ``auto``: the config its ``auto`` record runs (ours: ``kernels.config.auto_config``, which
  always fits shared memory; the stock kernel's: its own defaults, what an untuned call runs);
- ``defaults``: the tiles a record's mode leaves out (a fwd record has no backward tiles);
- ``predict``: the shared-memory model's bytes per launch, named as its launches are;
- ``build``: ``f(q, k, v, do)`` for one config, as ``kernels.attention.build`` makes it.

Both take one ``kernels.config.AttentionConfig``: the records' config fields are the same for
both (``kernels.stock`` maps them onto the stock kernel's ``BlockSizes``).

Kept free of jax at import (``build`` imports the kernel when called) so the control plane
can plan on a machine without jax.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernels import smem
from kernels.config import AttentionConfig, auto_config

# What ``mha`` runs when called without block sizes: ``BlockSizes.get_default()`` (128/128
# forward, 32 everywhere in the backward), ``num_warps=None`` (its own rule per launch), 2 stages.
STOCK_DEFAULTS = AttentionConfig(block_q=128, block_k=128, bwd_outer=32, bwd_inner=32, num_warps=None, num_stages=2)


def _stock_default(*, mode: str, dtype: Any, head_dim: int, seq: int, smem_limit_bytes: int | None) -> AttentionConfig:
    """The stock kernel's ``auto``: its defaults (``mha`` clamps blocks to seq itself), not
    checked against shared memory, because that is what a user who does not tune it gets."""
    del mode, dtype, head_dim, seq, smem_limit_bytes
    return STOCK_DEFAULTS


@dataclass(frozen=True)
class Impl:
    """One kernel implementation (module docstring)."""

    name: str
    title: str
    module: str  # holds ``build``; imported on first use (it needs jax)
    grouped_query: bool
    pinned: dict[str, dict[str, int]]  # mode -> {AttentionConfig field: the value it runs}
    pinned_why: str
    kernel_names: tuple[str, str]  # (forward, backward) launch names, as a runtime error shows them
    bwd_num_stages: int | None  # stages the backward runs whatever the config says (None: the config's)
    auto_rule: Callable[..., AttentionConfig]
    defaults: AttentionConfig  # what runs for a tunable a record leaves out (a fwd record's bwd tiles)
    causal_loops: int  # loop bodies per scan when causal: ours 2 (unmasked, then the diagonal), stock 1

    def auto(self, *, mode: str, dtype: Any, head_dim: int, seq: int, smem_limit_bytes: int | None) -> AttentionConfig:
        """The config this implementation's ``auto`` record runs."""
        return self.auto_rule(mode=mode, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=smem_limit_bytes)

    def predict(
        self, mode: str, dtype: Any, head_dim: int, config: dict[str, Any], *, seq: int | None = None
    ) -> list[tuple[str, int]]:
        """``kernels.smem.predict_bytes`` for this implementation's launches (``config``:
        AttentionConfig fields)."""
        return smem.predict_bytes(
            mode,
            dtype,
            head_dim,
            seq=seq,
            bwd_num_stages=self.bwd_num_stages,
            kernel_names=self.kernel_names,
            **config,
        )

    def unsupported(self, *, grouped_query: bool) -> str | None:
        """Why this implementation cannot run a problem with these options, or ``None``."""
        if grouped_query and not self.grouped_query:
            return f"{self.title} has no grouped-query attention (one K/V head per query head)"
        return None

    def build(
        self,
        mode: str,
        config: AttentionConfig,
        *,
        causal: bool = False,
        sm_scale: float | None = None,
        interpret: bool | None = None,
    ) -> Callable[..., tuple[Any, ...]]:
        """``f(q, k, v, do)``: "fwd" -> ``(o,)``; "fwd_bwd" -> ``(o, dq, dk, dv)``."""
        module = importlib.import_module(self.module)
        fn: Callable[..., tuple[Any, ...]] = module.build(
            mode, config, causal=causal, sm_scale=sm_scale, interpret=interpret
        )
        return fn


IMPLS: dict[str, Impl] = {
    "tilesweep": Impl(
        name="tilesweep",
        title="tilesweep's Pallas kernel",
        module="kernels.attention",
        grouped_query=True,
        pinned={},
        pinned_why="",
        kernel_names=(smem.FWD_KERNEL, smem.BWD_KERNEL),
        bwd_num_stages=None,
        auto_rule=auto_config,
        defaults=AttentionConfig(),
        causal_loops=2,
    ),
    "jax": Impl(
        name="jax",
        title="jax's stock Pallas mha (jax.experimental.pallas.ops.gpu.attention)",
        module="kernels.stock",
        grouped_query=False,
        pinned={"fwd_bwd": {"num_stages": smem.STOCK_BWD_STAGES}},
        pinned_why=f"the stock backward ignores num_stages and runs {smem.STOCK_BWD_STAGES}",
        kernel_names=(smem.STOCK_FWD_KERNEL, smem.STOCK_BWD_KERNEL),
        bwd_num_stages=smem.STOCK_BWD_STAGES,
        auto_rule=_stock_default,
        defaults=STOCK_DEFAULTS,
        causal_loops=1,
    ),
}
IMPL_NAMES: tuple[str, ...] = tuple(IMPLS)
DEFAULT_IMPL = "tilesweep"


def get(name: str) -> Impl:
    """The implementation called ``name``, or ValueError naming the allowed ones."""
    try:
        return IMPLS[name]
    except KeyError:
        raise ValueError(f"unknown kernel implementation {name!r}; allowed: {', '.join(IMPL_NAMES)}") from None
