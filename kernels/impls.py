"""The kernel implementations a sweep can tune, behind one small interface.

An implementation is what the spec's ``kernel.impl`` names; it is one object that satisfies
``kernels.impl_base.Implementation``: what it can do (``capabilities``), its tunables with their
valid values and constraints, named as the kernel's own API names them (``tunables``), where
its grid comes from when the spec gives none (``reference_grid``, the tunables' defaults), the
tunables it ignores (``pinned``), its ``auto``, its pruning rule (``pruning``: the
shared-memory model's ``predict``, or the compiler's verdict at lowering) and how to build it
(``make``). The planner, the cost model, the worker and pre-flight lowering ask only these, so
nothing outside ``kernels`` spells out an implementation's fields, and another implementation
is one more object here:

- ``tilesweep`` and ``jax`` (``kernels.impl_triton``): tilesweep's Pallas kernel and jax's stock
  ``mha``, both Triton-backed and configured by ``kernels.config.AttentionConfig``;
- ``mosaic`` (``kernels.impl_mosaic``): jax's Mosaic GPU ``attention_mgpu`` and its
  ``TuningConfig``;
- ``tokamax-mosaic`` and ``tokamax-triton`` (``kernels.impl_tokamax``): tokamax's flash-attention
  ops and their vjp ops, configured by tokamax's config classes (the ``tokamax`` extra);
  ``tokamax-mosaic-sm100``: the Mosaic GPU op with its sm100 classes, what ``tokamax-mosaic`` runs
  as on a B200 (``resolve``).

Kept free of jax at import so the control plane can plan on a machine without jax.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels import impl_tokamax
from kernels.devices import DeviceKind
from kernels.impl_base import Capabilities, Fields, Implementation, ModeFn, Tunable, Value
from kernels.impl_mosaic import MOSAIC, MosaicImpl
from kernels.impl_tokamax import TOKAMAX_MOSAIC, TOKAMAX_MOSAIC_SM100, TOKAMAX_TRITON
from kernels.impl_triton import STOCK, STOCK_DEFAULTS, TILESWEEP, Impl
from kernels.spelling import as_json, one_of

__all__ = [
    "DEFAULT_IMPL",
    "IMPLS",
    "IMPL_NAMES",
    "SPEC_IMPL_NAMES",
    "STOCK_DEFAULTS",
    "Capabilities",
    "Fields",
    "Impl",
    "Implementation",
    "ModeFn",
    "MosaicImpl",
    "Tunable",
    "Value",
    "describe",
    "worker_modules",
    "field_types",
    "get",
    "label",
    "resolve",
]

IMPLS: dict[str, Implementation] = {
    impl.name: impl for impl in (TILESWEEP, STOCK, MOSAIC, TOKAMAX_MOSAIC, TOKAMAX_MOSAIC_SM100, TOKAMAX_TRITON)
}
IMPL_NAMES: tuple[str, ...] = tuple(IMPLS)  # every implementation, as records name them
# what a spec's kernel.impl names: tokamax-mosaic-sm100 is what tokamax-mosaic runs as on a B200 (``resolve``)
SPEC_IMPL_NAMES: tuple[str, ...] = tuple(n for n in IMPLS if n != TOKAMAX_MOSAIC_SM100.name)
DEFAULT_IMPL = "tilesweep"


# What every compile-and-time worker imports before its first config: jax, the timer, the inputs
# and the reference (``kernels.attention``).
MEASURING_MODULES = ("jax", "kernels.timing", "kernels.attention")
# What jax's Pallas lowering imports at a worker's first config in interpret mode (jax's own
# modules: where a jax release moves one, a task skips it and each worker imports what it needs).
INTERPRET_MODULES = (
    "jax._src.pallas.mosaic.interpret.interpret_pallas_call",
    "jax._src.pallas.mosaic.interpret.params",
    "jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call",
    "jax._src.pallas.mosaic_gpu.interpret.params",
)


def worker_modules(name: str, interpret: bool) -> tuple[str, ...]:
    """The modules a worker measuring implementation ``name`` imports before its first config:
    those of ``MEASURING_MODULES``, the implementation's own (``module``) and, in interpret mode,
    ``INTERPRET_MODULES``; a task imports them once, before it forks its workers, so that each
    worker starts with them loaded. Another implementation's modules are left out."""
    names = (*MEASURING_MODULES, get(name).module, *(INTERPRET_MODULES if interpret else ()))
    return tuple(dict.fromkeys(names))


def get(name: str) -> Implementation:
    """The implementation called ``name``, or ValueError naming the allowed ones."""
    try:
        return IMPLS[name]
    except KeyError:
        raise ValueError(f"unknown kernel implementation {as_json(name)}; allowed: {one_of(IMPL_NAMES)}") from None


def resolve(name: str, device: DeviceKind) -> str:
    """The implementation ``kernel.impl: name`` runs as on ``device`` (``kernels.impl_tokamax.for_device``:
    tokamax's Mosaic GPU op has other config classes on sm_100); ``name`` itself for every other one."""
    return impl_tokamax.for_device(name, device.arch)


def field_types() -> dict[str, tuple[type, ...]]:
    """Every implementation's config fields and the types a record holds them as (implementations
    that share a name, block_q, share its types: a name whose types differ is refused, unless one
    implementation's are the other's plus values of its own, as tokamax's sm100 ``persistent`` adds
    ``"static"`` to the sm90 class's booleans)."""
    out: dict[str, tuple[type, ...]] = {}
    for impl in IMPLS.values():
        for mode in impl.capabilities.modes:
            for t in impl.tunables(mode):
                had = out.setdefault(t.name, t.kinds)
                if had[0] is not t.kind:
                    raise TypeError(
                        f"config field {t.name} is {had[0].__name__} in one implementation, "
                        f"{t.kind.__name__} in {impl.name}"
                    )
                out[t.name] = tuple(dict.fromkeys((*had, *t.kinds)))
    return out


def label(mode: str, fields: Mapping[str, Any]) -> str | None:
    """A config's short name by the implementation whose config fields it has (None: the
    reference's fields, which the report names itself)."""
    names = tuple(fields)
    for impl in IMPLS.values():
        if mode in impl.capabilities.modes and names == tuple(t.name for t in impl.tunables(mode)):
            found = impl.label(mode, fields)
            if found is not None:
                return found
    return None


def describe(impl: Implementation) -> dict[str, Any]:
    """What ``tilesweep impls --json`` says of an implementation."""
    modes = impl.capabilities.modes
    return {
        "name": impl.name,
        "title": impl.title,
        "capabilities": impl.capabilities.describe(),
        "pruning": impl.pruning,
        "lowering_sizes_smem": impl.lowering_sizes_smem,
        "tunables": {
            mode: [
                {
                    "name": t.name,
                    "type": t.kind.__name__,
                    "rule": t.rule,
                    "default": list(t.default),
                    "reference_field": impl.reference_grid(mode).get(t.name),
                    "doc": t.doc,
                }
                for t in impl.tunables(mode)
            ]
            for mode in modes
        },
        "pinned": {mode: dict(impl.pinned(mode)[0]) for mode in modes if impl.pinned(mode)[0]},
        "auto": impl.auto_rule,
        "auto_choice": impl.auto_choice,
    }
