"""What tilesweep knows of tokamax's flash-attention ops without importing tokamax (or jax), so
the control plane can plan, read and write tokamax's tables on a machine without either.

tokamax (``pip install "tilesweep[tokamax]"``) ships two GPU flash-attention ops, each with a
backward op of its own (its ``vjp``), and a config class per op:

- ``tokamax-mosaic``: ``PallasMosaicGpuFlashAttention`` (Mosaic GPU; sm90 ``Config`` of
  ``pallas_mosaic_gpu_kernel_sm90``, sm100 ``Config`` of ``..._sm100``) and
  ``PallasMosaicGpuFlashAttentionVjp`` (``pallas_mosaic_gpu_vjp_common.Config`` on sm90,
  ``pallas_mosaic_gpu_vjp_kernel_sm100.Config`` on sm100);
- ``tokamax-triton``: ``PallasTritonFlashAttention`` and ``PallasTritonFlashAttentionVjp`` (one
  config class each, whatever the GPU).

A tilesweep config of a tokamax op is named field for field as the config class names it: a
forward config is the forward op's config; a forward+backward config is the forward op's config
(the forward runs with residuals) followed by the vjp op's, each vjp field prefixed ``vjp_`` (both
classes have ``num_stages``, the Triton ones ``num_warps`` too). Fields tokamax's autotuner never
varies and leaves at None (the Triton forward's ``block_d``, ``block_d_out``) are not part of it:
they run at the class's default. ``tests/kernels/test_tokamax.py``
holds these names against the installed tokamax's classes.

tokamax keeps its autotuning tables per device kind and op: ``<dir>/<device_dir(kind)>/<stem>.json``
(``stem``: ``tokamax.snake_case_name`` of the op), one file for the forward op, one for its vjp.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernels.spelling import as_json, one_of

DISTRIBUTION = "tokamax"
EXTRA = "tokamax"
INSTALL = f'pip install "tilesweep[{EXTRA}]"'
VJP_PREFIX = "vjp_"
MOSAIC = "tokamax-mosaic"
MOSAIC_SM100 = "tokamax-mosaic-sm100"  # the Mosaic GPU op's records on sm100 GPUs (B200): other config classes
TRITON = "tokamax-triton"
# jax's short dtype names, as tokamax's keys write shapes ("bf16[4,2048,8,128]")
SHORT_DTYPES: dict[str, str] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


class TokamaxMissing(RuntimeError):
    """tokamax is not installed here: the message names the extra that installs it."""


def missing(what: str) -> str:
    """The one line that says tokamax is needed for ``what`` and how to install it."""
    return f"{what} needs tokamax, which is not installed here: {INSTALL}"


def version() -> str | None:
    """The installed tokamax's version (from its distribution metadata: tokamax is not imported),
    or None where it is not installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class ConfigClass:
    """One tokamax config class: where it lives and its fields in declaration order."""

    module: str  # under tokamax._src.ops.attention
    name: str
    fields: tuple[str, ...]
    untuned: tuple[str, ...] = ()  # left at the class's default (None): tokamax's autotuner never varies them

    @property
    def tuned(self) -> tuple[str, ...]:
        """The fields a tilesweep config of this class has (all but ``untuned``)."""
        return tuple(f for f in self.fields if f not in self.untuned)


@dataclass(frozen=True)
class Kernel:
    """One tokamax flash-attention op and its vjp op, as tilesweep names them."""

    impl: str
    title: str
    module: str  # the forward op's module, under tokamax._src.ops.attention
    op_class: str
    vjp_module: str
    vjp_class: str
    stem: str  # the forward op's cache file name, without .json
    fwd: dict[str, ConfigClass]  # arch family ("sm90", "sm100") -> the forward op's config class
    vjp: dict[str, ConfigClass]  # arch family -> the vjp op's config class
    names: dict[str, str] = field(default_factory=dict)  # arch family -> its records' impl, where not ``impl``

    def impl_for(self, fam: str) -> str:
        """The ``impl`` of this op's records in a config family (``family``): the family's config
        classes make the records' fields, so a family with other classes has its own name."""
        return self.names.get(fam, self.impl)

    def record_impl(self, fields: Mapping[str, Any]) -> str:
        """The ``impl`` of a record with these config fields."""
        return self.impl_for(self.family_of(fields))

    @property
    def vjp_stem(self) -> str:
        return self.stem + "_vjp"

    def fields(self, mode: str, fam: str) -> tuple[str, ...]:
        """A config's fields in record order: the forward class's, then (fwd_bwd) the vjp class's,
        prefixed; ``fam``: the config family (``family``)."""
        fwd = self.fwd[fam].tuned
        if mode == "fwd":
            return fwd
        return fwd + tuple(VJP_PREFIX + f for f in self.vjp[fam].tuned)

    def family_of(self, fields: Mapping[str, Any]) -> str:
        """The config family whose forward class has exactly the forward fields of ``fields``
        (sm90 where several do, as the Triton op's one class)."""
        names = {f for f in fields if not f.startswith(VJP_PREFIX)}
        return next((fam for fam, c in self.fwd.items() if set(c.tuned) == names), "sm90")


@dataclass(frozen=True)
class Problem:
    """One attention problem as tokamax binds it: q (batch, seq, heads, head_dim), k and v with
    ``kv_heads`` heads (None: heads), non-causal or causal, tokamax's default softmax scale."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    dtype: str  # tilesweep's name: "bfloat16"
    kv_heads: int | None = None
    causal: bool = False

    @property
    def k_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads


def family(arch: tuple[int, int]) -> str:
    """The config family tokamax picks for a compute capability: sm100 for 10.x, else sm90."""
    return "sm100" if arch[0] == 10 else "sm90"


_MOSAIC_FWD = ("block_q", "block_kv", "num_stages", "fold_q_sequence_heads", "split_k")
_MOSAIC_VJP = ("block_q_dkv", "block_kv_dkv", "block_q_dq", "block_kv_dq", "num_stages", "compute_wgs")
_TRITON_FWD = ConfigClass(
    "pallas_triton",
    "Config",
    ("block_q", "block_k", "num_stages", "num_warps", "block_d", "block_d_out", "split_k", "pack_mask"),
    untuned=("block_d", "block_d_out"),
)
_TRITON_VJP = ConfigClass(
    "pallas_triton_vjp", "Config", ("block_m1", "block_n1", "block_m2", "block_n2", "num_stages", "num_warps")
)

KERNELS: dict[str, Kernel] = {
    MOSAIC: Kernel(
        impl=MOSAIC,
        title="tokamax's Mosaic GPU flash attention (PallasMosaicGpuFlashAttention and its vjp)",
        module="pallas_mosaic_gpu",
        op_class="PallasMosaicGpuFlashAttention",
        vjp_module="pallas_mosaic_gpu_vjp",
        vjp_class="PallasMosaicGpuFlashAttentionVjp",
        stem="pallas_mosaic_gpu_flash_attention",
        fwd={
            "sm90": ConfigClass("pallas_mosaic_gpu_kernel_sm90", "Config", (*_MOSAIC_FWD, "persistent")),
            "sm100": ConfigClass(
                "pallas_mosaic_gpu_kernel_sm100", "Config", (*_MOSAIC_FWD, "num_tma_splits", "collective", "persistent")
            ),
        },
        vjp={
            "sm90": ConfigClass("pallas_mosaic_gpu_vjp_common", "Config", _MOSAIC_VJP),
            "sm100": ConfigClass("pallas_mosaic_gpu_vjp_kernel_sm100", "Config", (*_MOSAIC_VJP, "residual_stages")),
        },
        names={"sm100": MOSAIC_SM100},
    ),
    TRITON: Kernel(
        impl=TRITON,
        title="tokamax's Pallas Triton flash attention (PallasTritonFlashAttention and its vjp)",
        module="pallas_triton",
        op_class="PallasTritonFlashAttention",
        vjp_module="pallas_triton_vjp",
        vjp_class="PallasTritonFlashAttentionVjp",
        stem="pallas_triton_flash_attention",
        fwd={"sm90": _TRITON_FWD, "sm100": _TRITON_FWD},
        vjp={"sm90": _TRITON_VJP, "sm100": _TRITON_VJP},
    ),
}
_BY_NAME: dict[str, Kernel] = {n: k for k in KERNELS.values() for n in (k.impl, *k.names.values())}
IMPL_NAMES: tuple[str, ...] = tuple(_BY_NAME)  # every ``impl`` a record of a tokamax op has


def kernel(impl: str) -> Kernel:
    """The tokamax op behind ``impl`` (any of its records' names), or ValueError naming the tokamax implementations."""
    try:
        return _BY_NAME[impl]
    except KeyError:
        raise ValueError(f"{as_json(impl)} is not a tokamax implementation; those are: {one_of(IMPL_NAMES)}") from None


def untuned_of(module: str, name: str) -> tuple[str, ...]:
    """The untuned fields of the config class ``name`` of ``module`` (under tokamax._src.ops.attention)."""
    for k in KERNELS.values():
        for c in (*k.fwd.values(), *k.vjp.values()):
            if (c.module, c.name) == (module, name):
                return c.untuned
    return ()


def by_stem(stem: str) -> tuple[Kernel, str] | None:
    """(op, "fwd" or "vjp") of a cache file name without .json, or None for a name tokamax's
    attention ops do not write."""
    for k in KERNELS.values():
        if stem == k.stem:
            return k, "fwd"
        if stem == k.vjp_stem:
            return k, "vjp"
    return None


def holds_table(obj: Any) -> bool:
    """Whether a parsed JSON value is one of tokamax's autotuning tables: an object whose keys
    are tokamax's keys of a problem (the JSON text of an op's arguments: ``{"q":...`` of a
    forward op's, ``{"residuals":...`` of a vjp op's)."""
    return (
        isinstance(obj, dict)
        and bool(obj)
        and all(isinstance(k, str) and k.startswith('{"') and k.endswith("}") for k in obj)
    )


@dataclass(frozen=True)
class Merged:
    """What writing a table over an earlier one did to the earlier one's problems (``merged``)."""

    kept: int = 0  # its other problems, kept as they were
    replaced: int = 0  # its problems the new table holds too, each replaced whole by the new one's configs
    same: int = 0  # of those replaced, the ones the new table holds as they were (the same configs and data)
    dropped: int = 0  # configs of those replaced problems the new table does not hold: measured before, not again


def merged(existing: str, new: str) -> tuple[str, Merged]:
    """A table's text ``new`` written over the table ``existing`` (tokamax's cache format: one
    JSON object, a problem's key to its configs' data): ``new``'s problems replace the same
    problems of ``existing`` whole (one export's ranking per problem: tokamax runs the fastest of
    a problem's configs, and a fwd_bwd export ranks one op's configs only beside the other op's
    best), its other problems are kept, in their order; and what that did to ``existing``.
    ``existing`` not a table (empty, damaged): ``new`` as it is."""
    try:
        old, fresh = json.loads(existing), json.loads(new)
    except ValueError:
        return new, Merged()
    if not (holds_table(old) and isinstance(fresh, dict)):
        return new, Merged()
    kept = {k: v for k, v in old.items() if k not in fresh}
    replaced = [k for k in old if k in fresh]
    dropped = sum(len(set(_configs(old[k])) - set(_configs(fresh[k]))) for k in replaced)
    same = sum(1 for k in replaced if old[k] == fresh[k])
    done = Merged(kept=len(kept), replaced=len(replaced), same=same, dropped=dropped)
    if not kept:
        return new, done
    return json.dumps({**kept, **fresh}, indent=2) + "\n", done


def _configs(block: Any) -> list[str]:
    """The configs of one problem of a table (its keys), none where it is not an object."""
    return list(block) if isinstance(block, dict) else []


def device_dir(device_kind: str) -> str:
    """The folder tokamax keeps a device kind's tables in (its cache's own rule: lower case,
    spaces to underscores): "NVIDIA H200" -> "nvidia_h200"."""
    return device_kind.lower().replace(" ", "_")


def split(impl: str, mode: str, fields: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A record's config fields as (forward config kwargs, vjp config kwargs; empty for fwd)."""
    fwd = {f: v for f, v in fields.items() if not f.startswith(VJP_PREFIX)}
    if mode == "fwd":
        return fwd, {}
    return fwd, {f[len(VJP_PREFIX) :]: v for f, v in fields.items() if f.startswith(VJP_PREFIX)}


def join(fwd: Mapping[str, Any], vjp: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """(forward config, vjp config) as one record's config fields (``split``'s inverse)."""
    out = dict(fwd)
    out.update({VJP_PREFIX + k: v for k, v in (vjp or {}).items()})
    return out


def default_logits_scale(head_dim: int) -> float:
    """The softmax scale tokamax binds when none is given, 1/sqrt(head_dim): tilesweep's too."""
    return 1.0 / math.sqrt(head_dim)


@dataclass(frozen=True)
class Measured:
    """One config of one op as a tokamax table keeps it (its ``BenchmarkData``)."""

    fields: dict[str, Any]  # the op's config class's fields (vjp fields unprefixed)
    evaluation_times_ms: list[float]
    compile_time_ms: float
    lower_time_ms: float
    metadata: dict[str, Any]


@dataclass(frozen=True)
class KeyEntry:
    """One key of a tokamax table: an op ("fwd" or "vjp") bound for a problem, and its configs."""

    impl: str
    half: str
    residuals: bool  # the forward bound with return_residuals (the forward of fwd_bwd); the vjp: True
    problem: Problem
    configs: list[Measured]

    @property
    def stem(self) -> str:
        k = kernel(self.impl)
        return k.stem if self.half == "fwd" else k.vjp_stem
