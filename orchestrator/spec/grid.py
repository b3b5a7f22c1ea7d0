"""The spec's ``grid`` section: per mode, the values each tunable of the kernel implementation
sweeps, named as the implementation names them (``kernels.impls``), checked against its rules.

``"grid": {"fwd": {"block_q": [64, 128], "block_kv": [64, 128, 256]}, "fwd_bwd": {...}}``: a
tunable the grid leaves out sweeps what it would without a grid (for the Triton kernels the
reference config's field, ``fwd_block_q`` ...; for the others the implementation's default
values). The reference config's grid fields keep their meaning for the Triton kernels; for an
implementation that takes none of them (``reference_grid`` empty) giving one is refused, and so
is ``smem_limit_bytes`` for one pruned by the compiler at lowering (its limit is
``kernel.device_kind``'s). Every refusal is one line that names the field and what is allowed.

``"grid": "tokamax"`` (``TOKAMAX_GRID``) is the search of tokamax's own autotuner, per problem
(``orchestrator.planning.tokamax_grid``), for the implementations that run tokamax's ops only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kernels import impls, tokamax_meta
from kernels.impl_base import Value, first_refusal
from kernels.spelling import as_json

TOKAMAX_GRID = "tokamax"
Grid = Mapping[str, Mapping[str, Sequence[Any]]] | str

# The reference config's grid fields, and the spec path (``reference_grid``) each one is.
REFERENCE_GRID_FIELDS: dict[str, str] = {
    "fwd_block_q": "fwd_block_q",
    "fwd_block_k": "fwd_block_k",
    "fwd_stages": "fwd_stages",
    "fwd_warps": "fwd_warps",
    "bwd_outer": "bwd_outer",
    "bwd_inner": "bwd_inner",
    "bwd_stages": "bwd_stages",
    "bwd_warps": "bwd_warps",
    "bwd_fwd_config": "forward_blocks",
}


def ungridded(spec: object, impl_name: str, mode: str, name: str) -> tuple[list[Value], str]:
    """The values a tunable of ``impl_name`` sweeps where the grid does not name it, and where they
    come from (for the plan's notes): the reference config field it is read from
    (``reference_grid``: the Triton kernels' ``fwd_block_q`` ...), else the tunable's default
    values. ``spec``: the ``SweepSpec`` whose fields are read."""
    impl = impls.get(impl_name)
    path = impl.reference_grid(mode).get(name)
    if path is not None:
        value: Any = spec
        for part in path.split("."):
            value = getattr(value, part)
        values = list(value) if isinstance(value, list) else [value]
        return values, path.split(".")[0].replace("forward_blocks", "bwd_fwd_config")
    tunable = next(t for t in impl.tunables(mode) if t.name == name)
    return list(tunable.default), f"{impl.name}'s default {name}"


def fingerprinted(spec: object, impl_name: str, grid: Grid | None) -> dict[str, dict[str, list[Value]]] | str | None:
    """The grid as the sweep's fingerprint counts it: per mode, the tunables it gives other values
    than they sweep without it (``ungridded``), a mode left with none dropped; None where none is
    left (no grid, an empty one, one that writes those values out), so that it is the sweep of the
    same spec without them. ``"tokamax"`` counts as it is."""
    if grid is None or isinstance(grid, str):
        return grid
    counted = {}
    for mode, tunables in grid.items():
        kept = {
            name: list(values)
            for name, values in tunables.items()
            if json.dumps(list(values)) != json.dumps(ungridded(spec, impl_name, mode, name)[0])
        }
        if kept:
            counted[mode] = kept
    return counted or None


def check_shape(grid: Mapping[Any, Any]) -> None:
    """Refuse (``ValueError``, one line naming the key) a grid object that is not an object by
    mode of objects by tunable of lists of values; what the values may be, ``check_grid`` says."""
    example = '{"block_q": [64, 128]}'
    for mode, values in grid.items():
        if mode not in ("fwd", "fwd_bwd"):
            raise ValueError(f'its keys are modes, "fwd" or "fwd_bwd", got {as_json(mode)}')
        if not isinstance(values, Mapping):
            raise ValueError(
                f"grid.{mode} must be an object of tunables and their values ({example}), got {as_json(values)}"
            )
        for name, listed in values.items():
            if not isinstance(listed, list):
                raise ValueError(f"grid.{mode}.{name} must be a list of values ({example}), got {as_json(listed)}")
            for k, v in enumerate(listed):
                if not isinstance(v, int | str):  # bool is an int
                    raise ValueError(
                        f"grid.{mode}.{name}[{k}] is {json.dumps(v)}: a grid's values are whole numbers, true or "
                        f"false, or names ({example})"
                    )


def check_grid(impl_name: str, grid: Grid | None, modes: Sequence[str]) -> str | None:
    """Why a ``grid`` is refused for this implementation and these modes, or None."""
    if not grid:
        return None
    impl = impls.get(impl_name)
    if isinstance(grid, str):
        if impl_name in tokamax_meta.IMPL_NAMES:
            return None
        return (
            f'grid "{grid}" is the search of tokamax\'s autotuner, for kernel.impl '
            f"{' or '.join(as_json(n) for n in impls.SPEC_IMPL_NAMES if n in tokamax_meta.IMPL_NAMES)}; "
            f"kernel.impl {as_json(impl_name)} takes a grid by mode"
        )
    for mode, values in grid.items():
        if mode not in modes:
            listed = as_json(list(modes))
            add = f"add it to modes or drop grid.{mode}"
            return f"grid names mode {as_json(mode)}, which modes {listed} does not list; {add}"
        names = [t.name for t in impl.tunables(mode)]
        unknown = [k for k in values if k not in names]
        if unknown:
            return (
                f"grid.{mode}: {as_json(unknown[0])} is not a tunable of kernel.impl {as_json(impl.name)} "
                f"({impl.title}); "
                f"its {mode} tunables: {', '.join(names)}"
            )
        for name, vals in values.items():
            if not vals:
                return f"grid.{mode}.{name} is empty; give at least one value"
            if len({repr(v) for v in vals}) < len(vals):
                return f"grid.{mode}.{name} lists a value twice: {as_json(list(vals))}"
        why = first_refusal(impl.tunables(mode), values)
        if why:
            return f"grid.{mode}: {why}"
    return None


def check_reference_fields(impl_name: str, given: Mapping[str, Any], modes: Sequence[str]) -> str | None:
    """Why reference grid fields given with non-default values (``given``) are refused for this
    implementation, or None: one it takes none of, or one the ``grid`` names as well."""
    impl = impls.get(impl_name)
    every = impl.capabilities.modes  # a field of a mode the spec does not list is harmless, as for any spec
    used = {path.split(".")[0] for mode in every for path in impl.reference_grid(mode).values()}
    for name in given:
        if name == "smem_limit_bytes":
            if impl.pruning != "model":
                return (
                    "smem_limit_bytes is the Triton kernels' shared-memory model limit; kernel.impl "
                    f"{as_json(impl.name)} is held to kernel.device_kind's limit by its compiler at lowering: "
                    "drop smem_limit_bytes"
                )
            continue
        if REFERENCE_GRID_FIELDS[name] not in used:
            tunables = "; ".join(f"{m}: {', '.join(t.name for t in impl.tunables(m))}" for m in modes)
            return (
                f"{name} is a field of the Triton kernels' grid; kernel.impl {as_json(impl.name)} takes its grid from "
                f"the grid section, by its own tunables ({tunables}): drop {name}"
            )
    return None


def check_overlap(impl_name: str, grid: Grid | None, given: set[str]) -> str | None:
    """Why a tunable given both by a reference field and by ``grid`` is refused, or None."""
    impl = impls.get(impl_name)
    for mode, values in (grid if isinstance(grid, Mapping) else {}).items():
        for name, path in impl.reference_grid(mode).items():
            top = path.split(".")[0]
            field = next((f for f, p in REFERENCE_GRID_FIELDS.items() if p == top), top)
            if name in values and field in given:
                return f"{field} and grid.{mode}.{name} both give {mode} {name} values; keep one"
    return None
