"""The Triton-backed implementations: tilesweep's Pallas kernel and jax's stock Pallas ``mha``.

Both take one ``kernels.config.AttentionConfig``, so their records have the same config fields
(the reference run's): fwd ``block_q, block_k, num_stages, num_warps``; fwd_bwd
``fwd_block_q, fwd_block_k, bwd_outer, bwd_inner, num_stages, num_warps`` (``kernels.stock``
maps them onto the stock kernel's ``BlockSizes``). Their grid comes from the reference config's
fields unless the spec's ``grid`` names the values itself; their shared memory is predicted by
the model (``kernels.smem``), which prunes at plan time. What each says:

- ``grouped_query``: whether it takes K/V with fewer heads than Q (causal both do);
- ``pins``: tunables it ignores, with the value it runs instead (per mode), so the planner
  sweeps one value of them and says so once, instead of timing the same kernel twice;
- ``auto``: the config its ``auto`` record runs (ours: ``kernels.config.auto_config``, which
  always fits shared memory; the stock kernel's: its own defaults, what an untuned call runs);
- ``defaults``: the tiles a record's mode leaves out (a fwd record has no backward tiles);
- ``predict``: the shared-memory model's bytes per launch, named as its launches are;
- ``build``: ``f(q, k, v, do)`` for one config, as ``kernels.attention.build`` makes it.

Kept free of jax at import (``build`` imports the kernel when called).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kernels import smem
from kernels.config import MIN_BLOCK, AttentionConfig, auto_config
from kernels.devices import DeviceKind
from kernels.impl_base import Capabilities, Fields, ModeFn, Tunable, Value
from kernels.spelling import as_json, one_of

MAX_WARPS = 32  # a block holds at most 1024 threads
MAX_STAGES = 8  # software-pipelining depth; deeper never fits shared memory at useful tiles
_MOST = {"num_warps": MAX_WARPS, "num_stages": MAX_STAGES}  # the tunables' upper bounds (the spec's too)

# The record's config fields per mode, in record order (the reference run's layout).
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "fwd": ("block_q", "block_k", "num_stages", "num_warps"),
    "fwd_bwd": ("fwd_block_q", "fwd_block_k", "bwd_outer", "bwd_inner", "num_stages", "num_warps"),
}
# The reference config field (a dotted path of the spec) that gives each tunable's values.
REFERENCE_GRID: dict[str, dict[str, str]] = {
    "fwd": {"block_q": "fwd_block_q", "block_k": "fwd_block_k", "num_stages": "fwd_stages", "num_warps": "fwd_warps"},
    "fwd_bwd": {
        "fwd_block_q": "forward_blocks.block_q",
        "fwd_block_k": "forward_blocks.block_k",
        "bwd_outer": "bwd_outer",
        "bwd_inner": "bwd_inner",
        "num_stages": "bwd_stages",
        "num_warps": "bwd_warps",
    },
}
_BLOCKS = ("block_q", "block_k", "fwd_block_q", "fwd_block_k", "bwd_outer", "bwd_inner")
_RENAMED = {"fwd_block_q": "block_q", "fwd_block_k": "block_k"}  # a fwd_bwd record's forward tiles
_TILE_RULES = f"AttentionConfig; a tile is a dimension of a Triton dot, which tl.dot takes from {MIN_BLOCK}"
_DOCS = {
    "block_q": "query rows per forward tile",
    "block_k": "key/value rows per forward tile",
    "fwd_block_q": "query rows per forward tile of fwd_bwd",
    "fwd_block_k": "key/value rows per forward tile of fwd_bwd",
    "bwd_outer": "the resident tile of both backward scans (block_kv_dkv = block_q_dq)",
    "bwd_inner": "the streamed tile of both backward scans (block_q_dkv = block_kv_dq)",
    "num_stages": "software-pipelining stages",
    "num_warps": "warps per block",
}


def _tunable(name: str, default: Sequence[int]) -> Tunable:
    block = name in _BLOCKS
    return Tunable(
        name,
        _DOCS[name],
        tuple(default),
        minimum=MIN_BLOCK if block else 1,
        recorded_minimum=1 if block else None,  # interpret mode runs any power of two
        maximum=_MOST.get(name),
        power_of_two=block or name == "num_warps",
        rule_source=_TILE_RULES if block else "AttentionConfig",
    )


# The reference config's default grid, as the tunables' defaults.
_DEFAULTS: dict[str, dict[str, tuple[int, ...]]] = {
    "fwd": {"block_q": (32, 64, 128), "block_k": (32, 64, 128), "num_stages": (1, 2, 3), "num_warps": (4, 8)},
    "fwd_bwd": {
        "fwd_block_q": (128,),
        "fwd_block_k": (128,),
        "bwd_outer": (32, 64, 128),
        "bwd_inner": (16, 32, 64, 128),
        "num_stages": (1, 2),
        "num_warps": (4, 8),
    },
}
TUNABLES: dict[str, tuple[Tunable, ...]] = {
    mode: tuple(_tunable(n, _DEFAULTS[mode][n]) for n in names) for mode, names in CONFIG_FIELDS.items()
}


def kernel_kwargs(mode: str, values: Mapping[str, Any] | Sequence[Any]) -> dict[str, int]:
    """A config (a mapping of the record's fields, or their values in record order) as keyword
    arguments of ``AttentionConfig``: a fwd_bwd record's fwd_block_q/fwd_block_k are the forward's
    block_q/block_k; fields a mode does not sweep (bwd tiles of a fwd record) are left out."""
    names = CONFIG_FIELDS["fwd" if mode == "fwd" else "fwd_bwd"]
    vals = [values[n] for n in names] if isinstance(values, Mapping) else list(values)
    if len(vals) != len(names):
        raise ValueError(f"a {mode} config has the fields {', '.join(names)}; got {as_json(vals)}")
    return {_RENAMED.get(n, n): int(v) for n, v in zip(names, vals, strict=True)}


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
    """One Triton-backed kernel implementation (module docstring)."""

    name: str
    title: str
    module: str  # holds ``build``; imported on first use (it needs jax)
    grouped_query: bool
    pins: dict[str, dict[str, int]]  # mode -> {record config field: the value it runs}
    pinned_why: str
    kernel_names: tuple[str, str]  # (forward, backward) launch names, as a runtime error shows them
    bwd_num_stages: int | None  # stages the backward runs whatever the config says (None: the config's)
    auto_rule_fn: Callable[..., AttentionConfig]
    auto_rule: str
    auto_choice: str  # whose choice auto is, in a few words (``Implementation.auto_choice``)
    defaults: AttentionConfig  # what runs for a tunable a record leaves out (a fwd record's bwd tiles)
    causal_loops: int  # loop bodies per scan when causal: ours 2 (unmasked, then the diagonal), stock 1
    pruning: str = "model"
    lowering_sizes_smem: bool = False  # Triton sizes shared memory when PTX is compiled
    capabilities: Capabilities = field(init=False)

    def __post_init__(self) -> None:
        caps = Capabilities(
            dtypes=smem.DTYPES,
            modes=smem.MODES,
            causal_modes=smem.MODES,
            grouped_query=self.grouped_query,
            head_dim_multiple=1,
            interpret=True,
        )
        object.__setattr__(self, "capabilities", caps)

    # -- what the planner asks
    def tunables(self, mode: str) -> tuple[Tunable, ...]:
        return TUNABLES[mode]

    def reference_grid(self, mode: str) -> Mapping[str, str]:
        return REFERENCE_GRID[mode]

    def pinned(self, mode: str) -> tuple[Mapping[str, Value], str]:
        return self.pins.get(mode, {}), self.pinned_why

    def unsupported(
        self,
        *,
        dtypes: Sequence[str],
        modes: Sequence[str],
        causal: Sequence[bool],
        grouped_query: bool,
        head_dims: Sequence[int],
        device: DeviceKind | None,
    ) -> str | None:
        del dtypes, modes, causal, head_dims, device  # the spec's own rules cover them
        if grouped_query and not self.grouped_query:
            return f"{self.title} has no grouped-query attention (one K/V head per query head)"
        return None

    def runs_as(self, mode: str, seq: int, params: tuple[Value, ...]) -> tuple[Value, ...]:
        """Blocks larger than seq are clamped to it (``kernels.smem.clamp_block``)."""
        names = CONFIG_FIELDS[mode]
        return tuple(smem.clamp_block(int(v), seq) if n in _BLOCKS else v for n, v in zip(names, params, strict=True))

    def invalid(self, mode: str, seq: int, params: tuple[Value, ...]) -> str | None:
        for name, block in zip(CONFIG_FIELDS[mode], params, strict=True):
            if name in _BLOCKS and seq % min(int(block), seq):
                return f"ValueError: seq={seq} must be a multiple of {name}={block} (not compiled)"
            if name in _BLOCKS and min(int(block), seq) < MIN_BLOCK:
                return (
                    f"ValueError: {name}={block} runs as {min(int(block), seq)} at seq={seq}, below {MIN_BLOCK}, "
                    "the smallest tile a Triton dot takes (not compiled)"
                )
        return None

    def predict(
        self, mode: str, dtype: str, head_dim: int, params: tuple[Value, ...], seq: int
    ) -> list[tuple[str, int]]:
        """``kernels.smem.predict_bytes`` for this implementation's launches."""
        return smem.predict_bytes(
            mode,
            dtype,
            head_dim,
            seq=seq,
            bwd_num_stages=self.bwd_num_stages,
            kernel_names=self.kernel_names,
            **kernel_kwargs(mode, params),
        )

    # -- what the worker and the cost model ask
    def auto(self, *, mode: str, dtype: Any, head_dim: int, seq: int, smem_limit_bytes: int | None) -> AttentionConfig:
        """The config this implementation's ``auto`` record runs."""
        return self.auto_rule_fn(mode=mode, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=smem_limit_bytes)

    def config(
        self, mode: str, fields: Fields | None, *, dtype: str, head_dim: int, seq: int, smem_limit_bytes: int | None
    ) -> AttentionConfig:
        """The ``AttentionConfig`` a record's fields (None: auto) run."""
        if fields is None:
            return self.auto(mode=mode, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=smem_limit_bytes)
        return AttentionConfig(**kernel_kwargs(mode, fields))

    def cost_fields(
        self, mode: str, fields: Fields | None, *, dtype: str, head_dim: int, seq: int, smem_limit_bytes: int | None
    ) -> dict[str, int]:
        if fields is not None:
            return kernel_kwargs(mode, fields)
        try:
            cfg = self.config(mode, None, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=smem_limit_bytes)
        except ValueError:  # no config fits: that item fails fast
            cfg = AttentionConfig()
        return {k: v for k, v in asdict(cfg).items() if v is not None}

    def make(
        self,
        mode: str,
        fields: Fields | None,
        *,
        dtype: str,
        head_dim: int,
        seq: int,
        smem_limit_bytes: int | None,
        causal: bool = False,
        sm_scale: float | None = None,
        interpret: bool | None = None,
    ) -> ModeFn:
        cfg = self.config(mode, fields, dtype=dtype, head_dim=head_dim, seq=seq, smem_limit_bytes=smem_limit_bytes)
        return self.build(mode, cfg, causal=causal, sm_scale=sm_scale, interpret=interpret)

    def build(
        self,
        mode: str,
        config: AttentionConfig,
        *,
        causal: bool = False,
        sm_scale: float | None = None,
        interpret: bool | None = None,
    ) -> ModeFn:
        """``f(q, k, v, do)``: "fwd" -> ``(o,)``; "fwd_bwd" -> ``(o, dq, dk, dv)``."""
        module = importlib.import_module(self.module)
        fn: ModeFn = module.build(mode, config, causal=causal, sm_scale=sm_scale, interpret=interpret)
        return fn

    def label(self, mode: str, fields: Mapping[str, Any]) -> str | None:
        del mode, fields
        return None  # the reference's fields: ``orchestrator.analysis.report.config_label`` names them

    def refusal_kind(self, exc: BaseException) -> str:
        """Triton lowering refuses a config with a ValueError, NotImplementedError or Pallas's
        ``LoweringError``; anything else is a crash."""
        return "refused" if type(exc).__name__ in ("ValueError", "NotImplementedError", "LoweringError") else "crashed"


TILESWEEP = Impl(
    name="tilesweep",
    title="tilesweep's Pallas kernel",
    module="kernels.attention",
    grouped_query=True,
    pins={},
    pinned_why="",
    kernel_names=(smem.FWD_KERNEL, smem.BWD_KERNEL),
    bwd_num_stages=None,
    auto_rule_fn=auto_config,
    auto_rule="kernels.config.auto_config: 128 x 128 tiles, 2 stages, shrunk until the shared-memory model "
    "says it fits (tilesweep's rule)",
    auto_choice="tilesweep's rule",
    defaults=AttentionConfig(),
    causal_loops=2,
)
STOCK = Impl(
    name="jax",
    title="jax's stock Pallas mha (jax.experimental.pallas.ops.gpu.attention)",
    module="kernels.stock",
    grouped_query=False,
    pins={"fwd_bwd": {"num_stages": smem.STOCK_BWD_STAGES}},
    pinned_why=f"the stock backward ignores num_stages and runs {smem.STOCK_BWD_STAGES}",
    kernel_names=(smem.STOCK_FWD_KERNEL, smem.STOCK_BWD_KERNEL),
    bwd_num_stages=smem.STOCK_BWD_STAGES,
    auto_rule_fn=_stock_default,
    auto_rule="mha's own defaults (BlockSizes.get_default(): 128/128 forward, 32 in the backward, its num_warps "
    "rule, 2 stages): what an untuned call runs",
    auto_choice="mha's own defaults",
    defaults=STOCK_DEFAULTS,
    causal_loops=1,
)

BY_NAME: dict[str, Impl] = {impl.name: impl for impl in (TILESWEEP, STOCK)}


def get(name: str) -> Impl:
    """The Triton-backed implementation called ``name``, or ValueError naming them."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"{as_json(name)} is not a Triton-backed implementation; those are {one_of(BY_NAME)}"
        ) from None
