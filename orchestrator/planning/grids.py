"""A spec's grid per mode, as its kernel implementation takes it, and what the planner refuses
or says once about that implementation. Pure: no I/O.

Each tunable of the implementation (``kernels.impls``: ``tunables(mode)``, in record order)
sweeps, in this order of precedence: the one value it runs, for a tunable it ignores
(``pinned``); the spec's ``grid`` values; the reference config field it is read from
(``reference_grid``: the Triton kernels' ``fwd_block_q`` ...); the tunable's default values.
The grid is their product, last tunable fastest.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from kernels import impls
from kernels.impl_base import Value
from kernels.spelling import as_json
from orchestrator import PROG, counted
from orchestrator.errors import PlanError
from orchestrator.spec.grid import TOKAMAX_GRID, ungridded
from orchestrator.spec.model import SweepSpec


def axis_values(spec: SweepSpec, mode: str, name: str) -> tuple[list[Value], str]:
    """The values a tunable sweeps, and where they come from (for the plan's notes)."""
    given = spec.grid.get(mode, {}) if isinstance(spec.grid, dict) else {}
    if name in given:
        return list(given[name]), f"grid.{mode}.{name}"
    return ungridded(spec, spec.measured_impl, mode, name)


def mode_grid(spec: SweepSpec, mode: str) -> list[tuple[Value, ...]]:
    """The grid of one mode: every config the spec sweeps, in record field order (``"grid":
    "tokamax"``: every config tokamax tries for any of its problems, ``planning.tokamax_grid``)."""
    if spec.grid == TOKAMAX_GRID:
        from orchestrator.planning import tokamax_grid

        return tokamax_grid.union(spec, mode)
    impl = impls.get(spec.measured_impl)
    pinned, _ = impl.pinned(mode)
    axes = [[pinned[t.name]] if t.name in pinned else axis_values(spec, mode, t.name)[0] for t in impl.tunables(mode)]
    return list(itertools.product(*axes))


def check_supported(spec: SweepSpec, source: str | None = None) -> None:
    """Refuse, in one line, what the spec's kernel implementation cannot do, naming ``source`` or
    else the spec file it was read from (``spec.files``), whichever command planned it."""
    source = source if source is not None else spec._source
    impl = impls.get(spec.measured_impl)
    gqa = [v for v in spec.kv_heads if v not in (None, spec.heads)]
    device = spec.kernel.target if spec.kernel.device_kind is not None or impl.capabilities.archs else None
    why = impl.unsupported(
        dtypes=spec.dtypes,
        modes=spec.modes,
        causal=spec.causal,
        grouped_query=bool(gqa),
        head_dims=spec.head_dims,
        device=device,
    )
    if why is None:
        return
    head = f"{source}: kernel.impl" if source is not None else "kernel.impl"
    if gqa and not impl.capabilities.grouped_query:
        allowed = [n for n in impls.SPEC_IMPL_NAMES if impls.IMPLS[n].capabilities.grouped_query]
        raise PlanError(
            f"{head} {as_json(impl.name)}: {why}, so kv_heads {gqa} cannot be planned; allowed with it: "
            f"kv_heads [null] (or [{spec.heads}]); for grouped-query attention use kernel.impl "
            f"{' or '.join(map(as_json, allowed))}"
        )
    raise PlanError(f"{head} {as_json(impl.name)}: {why}")


LOWER_COMMAND = f"{PROG} plan SPEC --lower --sweep-dir DIR"


@dataclass(frozen=True)
class Verdicts:
    """Where a sweep directory's configs to measure stand with pre-flight lowering
    (``store.lowering_todo``): how many its verdicts say lower, were refused, or crashed, and
    how many ``plan --lower`` would lower (``unlowered``: no verdict yet), by ``command``."""

    lowered: int
    refused: int
    crashed: int
    unlowered: int
    command: str = LOWER_COMMAND


def prunes_by_lowering(spec: SweepSpec) -> bool:
    """Whether the configs the spec measures are pruned by the compiler's verdict at lowering
    (an implementation with no shared-memory model), which ``plan --lower`` gives them."""
    return impls.get(spec.measured_impl).pruning == "lowering" and spec.kernel.impl != "replay"


def notes(
    spec: SweepSpec, *, lowering: bool = False, verdicts: Verdicts | None = None, command: str = LOWER_COMMAND
) -> list[str]:
    """What the plan output says once about the spec's implementation: each tunable it
    ignores, swept at the one value it runs instead of the spec's list, and a pruning rule
    that needs lowering (not for ``plan --lower``, ``lowering``: that is what it runs), with
    what the sweep directory's ``verdicts`` say already where it has some."""
    impl = impls.get(spec.measured_impl)
    out: list[str] = []
    if spec.auto_only:
        return out
    for mode in spec.modes:
        pinned, why = impl.pinned(mode)
        for name, value in pinned.items():
            values, source = axis_values(spec, mode, name)
            if values == [value]:
                continue  # nothing the spec asked for is left out
            out.append(
                f"kernel.impl {as_json(impl.name)}: {why}, so {mode} configs are planned with "
                f"{name}={_show(value)} only ({source} {_show(values)} is not swept)"
            )
    if spec.grid == TOKAMAX_GRID:
        from kernels import tokamax_meta

        out.append(
            f'grid "tokamax": per problem, the configs tokamax {tokamax_meta.version()}\'s own autotuner tries for '
            f"{impl.name} on {spec.kernel.target.name}"
        )
    if prunes_by_lowering(spec) and not lowering:
        out.append(_lowering_note(spec, verdicts, command))
    return out


def _lowering_note(spec: SweepSpec, verdicts: Verdicts | None, command: str) -> str:
    """That the configs are pruned by lowering: what the verdicts say, and the ``plan --lower``
    that lowers the configs without one (none where every config to measure has one)."""
    head = f"kernel.impl {as_json(spec.measured_impl)} has no shared-memory model"
    if not impls.get(spec.measured_impl).lowering_sizes_smem:  # Triton sizes it when the GPU compiles
        head += ", and its lowering sizes none (a config over it fails to compile on the GPU: an error record)"
    target = spec.kernel.target.name
    command = verdicts.command if verdicts is not None else command
    if verdicts is None:
        return f"{head}: `{command}` prunes by the compiler's verdict for {target} before any GPU time"
    given = verdicts.lowered + verdicts.refused + verdicts.crashed
    if not given and not verdicts.unlowered:
        return f"{head}; no config left to measure needs pre-flight lowering (each has a record, or is reused)"
    if not given:
        return (
            f"{head}: `{command}` prunes its {counted(verdicts.unlowered, 'config')} to measure by the compiler's "
            f"verdict for {target} before any GPU time"
        )
    said = (
        f"{head}; pre-flight lowering for {target} gave {counted(given, 'config')} a verdict: "
        f"{verdicts.lowered} lower, {verdicts.refused} refused (pruned, never run)"
    )
    if verdicts.crashed:
        said += f", {verdicts.crashed} crashed in the compiler (invalid, never run)"
    if not verdicts.unlowered:
        return f"{said}; every config to measure has a verdict, so plan --lower has nothing left to lower"
    return f"{said}; `{command}` lowers the {counted(verdicts.unlowered, 'config')} to measure without one"


def _show(value: Any) -> str:
    """A value as the spec writes it (true, [1, 2])."""
    import json

    return json.dumps(value)
