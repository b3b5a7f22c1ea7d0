"""``"grid": "tokamax"``: per problem, exactly the configs tokamax's own autotuner tries on the
spec's target GPU (``kernel.device_kind``), so a sweep reproduces tokamax's search, sharded over
the cluster.

The lists come from tokamax itself (``kernels.tokamax_ops.search_space``: its heuristics' config
and ``_get_autotuning_configs``, with the target standing in as jax's default device), so
planning such a sweep needs tokamax and jax where it runs (one line naming the extra otherwise).
They depend on the problem (dtype, head_dim, seq, causal, kv_heads: tokamax prunes by its own
shared-memory estimate and clamps blocks to seq), not only on the mode, so they are made per
problem and kept per process; the planner keeps them in the sweep directory too
(``store.tokamax_lists``, handed back through ``remember``), so a process that re-expands the
plan asks tokamax nothing. Every config is planned to run: tokamax's estimate has already pruned
its list, and what the compiler still refuses, ``tilesweep plan --lower`` finds.
"""

from __future__ import annotations

import functools
from typing import Any

from kernels import tokamax_meta as meta
from kernels.impl_base import Value
from orchestrator.errors import PlanError
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import config_fields, id_suffix

Params = tuple[Value, ...]


def problem(spec: SweepSpec, dtype: str, head_dim: int, seq: int, causal: bool, kv_heads: int | None) -> meta.Problem:
    """One problem of the spec as tokamax binds it."""
    return meta.Problem(spec.batch, seq, spec.heads, head_dim, dtype, kv_heads=kv_heads, causal=causal)


@functools.cache
def _search(impl: str, mode: str, p: meta.Problem, device_kind: str) -> tuple[Params, ...]:
    if meta.version() is None:
        raise PlanError(meta.missing('grid "tokamax"'))
    from kernels import devices, tokamax_ops

    names = config_fields(mode, impl=impl)
    try:
        found = tokamax_ops.search_space(impl, mode, p, devices.get(device_kind))
    except meta.TokamaxMissing as exc:
        raise PlanError(str(exc)) from None
    except Exception as exc:  # tokamax refuses the problem itself: say so in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PlanError(
            f'grid "tokamax": tokamax\'s {impl} cannot enumerate configs for {p.dtype} head_dim {p.head_dim} '
            f"seq {p.seq} on {device_kind}: {type(exc).__name__}: {first}"
        ) from None
    return tuple(tuple(f[n] for n in names) for f in found)


_known: dict[tuple[str, str, meta.Problem, str], tuple[Params, ...]] = {}


def remember(spec: SweepSpec, lists: dict[tuple[str, meta.Problem], list[Params]]) -> None:
    """Take ``lists`` ((mode, problem) -> configs, as the planner made them) as this process's
    answer for the spec's target, before asking tokamax."""
    target = (spec.measured_impl, spec.kernel.target.name)
    _known.update({(target[0], mode, p, target[1]): tuple(c) for (mode, p), c in lists.items()})


def configs(spec: SweepSpec, mode: str, p: meta.Problem) -> list[Params]:
    """The configs tokamax's autotuner tries for problem ``p`` of one mode, in record field order."""
    key = (spec.measured_impl, mode, p, spec.kernel.target.name)
    known = _known.get(key)
    return list(known if known is not None else _search(*key))


class ProblemGrids:
    """Each (mode, problem)'s configs and their id suffixes, made once per problem."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.names = {mode: config_fields(mode, impl=spec.measured_impl) for mode in spec.modes}
        self.cache: dict[tuple[str, meta.Problem], tuple[list[Params], list[bytes]]] = {}

    def __call__(
        self, mode: str, dtype: str, head_dim: int, seq: int, causal: bool, kv_heads: int | None
    ) -> tuple[list[Params], list[bytes]]:
        p = problem(self.spec, dtype, head_dim, seq, causal, kv_heads)
        out = self.cache.get((mode, p))
        if out is None:
            params = configs(self.spec, mode, p)
            out = self.cache[(mode, p)] = (params, [id_suffix(self.names[mode], c) for c in params])
        return out


def union(spec: SweepSpec, mode: str) -> list[Params]:
    """Every config any problem of the spec tries in one mode, first seen first (what a reader of
    a mode's whole grid, the cost model's value range, takes)."""
    seen: dict[Params, None] = {}
    for p in problems(spec):
        seen.update(dict.fromkeys(configs(spec, mode, p)))
    return list(seen)


def problems(spec: SweepSpec) -> list[meta.Problem]:
    """The spec's problems, in plan order."""
    import itertools

    out: list[meta.Problem] = []
    for dtype, head_dim, seq, kv, causal in itertools.product(
        spec.dtypes, spec.head_dims, spec.seq_lens, spec.kv_heads, spec.causal
    ):
        out.append(problem(spec, dtype, head_dim, seq, causal, None if kv == spec.heads else kv))
    return out


def planned(spec: SweepSpec) -> dict[tuple[Any, ...], list[Params]]:
    """(mode, problem) -> its configs, for ``planning.items.planned_configs``."""
    return {(mode, p): configs(spec, mode, p) for mode in spec.modes for p in problems(spec)}
