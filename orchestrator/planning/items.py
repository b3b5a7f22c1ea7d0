"""Expanding a spec into work items, each classified. Pure: no I/O, no submitit.

Item order is the reference run's record order (checked against all 832 of its records):
shapes nested dtype -> head_dim -> seq in the order the spec lists them; inside a shape the
``auto`` record of each mode first, then each mode's forced grid, axes nested in the order the
spec lists them, last axis fastest. The grouped-query and causal axes nest inside seq
(kv_heads, then causal), so the problems that share inputs follow one another. An item's id
is a hash of its identity and config fields (``orchestrator.spec.records.item_id``), so the
same measurement has the same id in every sweep (resume and append key on it).

The kernel implementation (``SweepSpec.measured_impl``: ``kernel.impl``, or for a replay the
``replay.impl`` its source measured; ``kernels.impls``) decides what can be planned: an
axis it cannot do (grouped-query attention on the stock kernel) is refused in one line
(``grids.check_supported``), and a tunable it ignores is swept at the one value it runs, with a
note that says so (``grids.notes``); its grid per mode is ``grids.mode_grid``.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from kernels.impl_base import Value
from orchestrator.planning import tokamax_grid
from orchestrator.planning.classify import INVALID, PRUNED, RUN, Clamped, Classifier
from orchestrator.planning.grids import check_supported, mode_grid
from orchestrator.spec.grid import TOKAMAX_GRID
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import (
    DEFAULT_IMPL,
    config_fields,
    id_of,
    id_prefix,
    id_suffix,
    ids_of,
    kernel_kwargs,
    key_of,
)

log = logging.getLogger(__name__)

# a grid past this many items is said before it is expanded: expanding it takes a while (3.6M
# items: 40 s, 1.8 GB), and a sweep of it far longer
LARGE_GRID_ITEMS = 200_000


class _Variant(TypedDict):
    """A problem's optional identity fields (``records.OPTIONAL_DEFAULTS``), as ``id_prefix`` takes them."""

    causal: bool
    kv_heads: int | None  # None: multi-head attention
    impl: str


class _Extras(_Variant):
    """The fields every item of a problem shares beyond its shape, as ``WorkItem`` takes them."""

    shown: tuple[bool, bool]  # whether the record carries causal, kv_heads


@dataclass(slots=True)
class WorkItem:
    """One record to produce. ``params`` holds the config fields in record order."""

    index: int
    dtype: str
    head_dim: int
    seq: int
    batch: int
    heads: int
    tag: str
    mode: str
    config: str  # "auto" or "forced"
    params: tuple[Value, ...]  # values of the mode's config fields (records.config_fields); () for auto
    id: str = ""
    kind: str = RUN
    reason: str | None = None  # why an item is invalid or pruned
    smem_bytes: int | None = None
    unit: int = -1
    causal: bool = False
    kv_heads: int | None = None  # None: multi-head attention
    impl: str = DEFAULT_IMPL
    shown: tuple[bool, bool] = (False, False)  # whether the record carries causal, kv_heads

    @property
    def shape(self) -> tuple[str, int, int, int, int, int | None]:
        """What the inputs depend on (not causal: both variants share inputs)."""
        return (self.dtype, self.head_dim, self.seq, self.batch, self.heads, self.kv_heads)

    def record_key(self) -> tuple[Any, ...]:
        """``records.record_key`` of this item's record, without building the record."""
        return key_of(
            self.dtype,
            self.head_dim,
            self.seq,
            self.batch,
            self.heads,
            self.mode,
            self.config,
            self.params,
            causal=self.causal,
            kv_heads=self.kv_heads,
            impl=self.impl,
        )

    @property
    def param_names(self) -> tuple[str, ...]:
        return config_fields(self.mode, self.config, self.impl)

    def fields(self) -> dict[str, Value] | None:
        """The config fields of a forced item, named as its implementation names them; None for auto."""
        if self.config == "auto":
            return None
        return dict(zip(self.param_names, self.params, strict=True))

    def record_fields(self) -> dict[str, Any]:
        """Identity and config fields exactly as a reference record has them (plus the
        optional identity fields of ``orchestrator.spec.records`` where the sweep has them)."""
        rec: dict[str, Any] = {
            "dtype": self.dtype,
            "head_dim": self.head_dim,
            "seq": self.seq,
            "batch": self.batch,
            "heads": self.heads,
        }
        if self.shown[0]:
            rec["causal"] = self.causal
        if self.shown[1]:
            rec["kv_heads"] = self.heads if self.kv_heads is None else self.kv_heads
        rec["tag"] = self.tag
        rec["mode"] = self.mode
        if self.impl != DEFAULT_IMPL:
            rec["impl"] = self.impl
        rec["config"] = self.config
        rec.update(zip(self.param_names, self.params, strict=True))
        return rec

    def kernel_config(self) -> dict[str, int] | None:
        """Keyword arguments of a Triton kernel's AttentionConfig, or None for auto."""
        if self.config == "auto":
            return None
        return kernel_kwargs(self.mode, self.params)


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """Pause the cyclic garbage collector while allocating millions of acyclic objects:
    its generation scans would otherwise take as long as building the items."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def expand(spec: SweepSpec) -> list[WorkItem]:
    """All work items of a spec in reference record order, each classified.

    Built for millions of items: a grid's parameter tuples, id suffixes and
    classifications are made once and shared by every shape they apply to, and an id
    hashes a shape prefix plus the grid suffix (the same bytes ``item_id`` hashes)."""
    with bulk():
        return _expand(spec)


def say_if_large(spec: SweepSpec) -> None:
    """Warn, before a plan expands it, of a grid of more than ``LARGE_GRID_ITEMS`` items (an
    upper bound: tiles larger than a sequence clamp alike and count once; a "tokamax" grid's
    configs, chosen per problem, are not counted)."""
    problems = len(spec.dtypes) * len(spec.head_dims) * len(spec.seq_lens) * len(spec.kv_heads) * len(spec.causal)
    per_problem = spec.auto_only or spec.grid == TOKAMAX_GRID
    configs = 0 if per_problem else sum(len(mode_grid(spec, mode)) for mode in spec.modes)
    items = problems * (len(spec.modes) + configs)
    if items > LARGE_GRID_ITEMS:
        log.warning(
            "the spec expands to up to %s items (%s x %s and auto); planning them takes a while, measuring them "
            "far longer: narrow the grid, or measure part of it (timing.strategy search)",
            f"{items:,}",
            f"{problems:,} problem{'s' if problems != 1 else ''}",
            f"{configs:,} config{'s' if configs != 1 else ''}",
        )


def _expand(spec: SweepSpec) -> list[WorkItem]:
    check_supported(spec)
    items: list[WorkItem] = []
    append = items.append
    batch, heads, tag, impl = spec.batch, spec.heads, spec.tag, spec.measured_impl
    shown = (spec.sweeps_causal, spec.sweeps_kv_heads)
    per_problem = tokamax_grid.ProblemGrids(spec) if spec.grid == TOKAMAX_GRID else None
    grids = {}
    for mode in () if per_problem else spec.modes:
        params = mode_grid(spec, mode)
        names = config_fields(mode, impl=impl)
        grids[mode] = (params, [id_suffix(names, p) for p in params])
    classes = Classifier(spec, {mode: grids[mode][0] for mode in grids})
    clamped = Clamped(grids, impl)
    for dtype, head_dim, seq, kv, causal in itertools.product(
        spec.dtypes, spec.head_dims, spec.seq_lens, spec.kv_heads, spec.causal
    ):
        kv_heads = None if kv == heads else kv
        variant: _Variant = {"causal": causal, "kv_heads": kv_heads, "impl": impl}
        extra: _Extras = {**variant, "shown": shown}
        for mode in spec.modes:
            auto_id = id_of(id_prefix(dtype, head_dim, seq, batch, heads, tag, mode, "auto", **variant), b"")
            append(WorkItem(len(items), dtype, head_dim, seq, batch, heads, tag, mode, "auto", (), auto_id, **extra))
        if spec.auto_only:
            continue
        for mode in spec.modes:
            if per_problem is None:
                params, suffixes = clamped(mode, seq)
                kinds = classes(mode, dtype, head_dim, seq, params)
            else:  # tokamax's own search: every config runs unless lowering refuses it
                params, suffixes = per_problem(mode, dtype, head_dim, seq, causal, kv_heads)
                kinds = [(RUN, None, None)] * len(params)
            ids = ids_of(id_prefix(dtype, head_dim, seq, batch, heads, tag, mode, "forced", **variant), suffixes)
            items.extend(
                _forced(len(items), (dtype, head_dim, seq, batch, heads, tag, mode), params, ids, kinds, extra)
            )
    return items


Problem = tuple[str, int, int, int, int, str, str]  # dtype, head_dim, seq, batch, heads, tag, mode


def _forced(
    start: int,
    problem: Problem,
    params: Sequence[tuple[Value, ...]],
    ids: Sequence[str],
    kinds: Sequence[tuple[str, str | None, int | None]],
    extra: _Extras,
) -> list[WorkItem]:
    """The forced items of one problem and mode, numbered from ``start``: one per config of
    ``params``, with its id and classification. Positional arguments: a fifth of the cost of
    keywords, on a million items."""
    causal, kv_heads, impl, shown = extra["causal"], extra["kv_heads"], extra["impl"], extra["shown"]
    return [
        WorkItem(start + j, *problem, "forced", p, iid, kind, reason, nbytes, -1, causal, kv_heads, impl, shown)
        for j, (p, iid, (kind, reason, nbytes)) in enumerate(zip(params, ids, kinds, strict=True))
    ]


@dataclass
class PlannedConfigs:
    """The forced configs a spec plans per problem, without expanding it: the grid of a mode
    depends on the problem only through seq (blocks clamped to it), so one list per (mode,
    seq) serves every dtype, head_dim and tag. What a report of an incomplete sweep compares
    its records with, to say how many configs are missing."""

    # records.problem_key: (dtype, head_dim, seq, batch, heads, mode, tag, causal, kv_heads, impl)
    problems: set[tuple[Any, ...]]
    grids: dict[tuple[str, int], list[tuple[Value, ...]]]
    per_problem: dict[tuple[Any, ...], list[tuple[Value, ...]]] | None = None  # "grid": "tokamax": by problem

    def of(self, problem: tuple[Any, ...]) -> list[tuple[Value, ...]] | None:
        """The planned configs (values of ``records.config_fields(mode)``), or None if the
        spec does not plan this problem."""
        if problem not in self.problems:
            return None
        if self.per_problem is not None:
            return self.per_problem[problem]
        return self.grids[(problem[5], problem[2])]


def planned_configs(spec: SweepSpec) -> PlannedConfigs:
    if spec.grid == TOKAMAX_GRID and not spec.auto_only:
        return _planned_tokamax(spec)
    full = {}
    for mode in spec.modes:
        params = [] if spec.auto_only else mode_grid(spec, mode)
        full[mode] = (params, [b""] * len(params))  # id suffixes are not needed here
    clamped = Clamped(full, spec.measured_impl)
    grids = {(mode, seq): clamped(mode, seq)[0] for mode in spec.modes for seq in spec.seq_lens}
    heads, impl = spec.heads, spec.measured_impl
    problems = {
        (dtype, head_dim, seq, spec.batch, heads, mode, spec.tag, causal, None if kv == heads else kv, impl)
        for dtype, head_dim, seq, kv, causal in itertools.product(
            spec.dtypes, spec.head_dims, spec.seq_lens, spec.kv_heads, spec.causal
        )
        for mode in spec.modes
    }
    return PlannedConfigs(problems, grids)


def _planned_tokamax(spec: SweepSpec) -> PlannedConfigs:
    """``planned_configs`` of a ``"grid": "tokamax"`` spec: tokamax's configs per problem."""
    per_problem = {
        (p.dtype, p.head_dim, p.seq, p.batch, p.heads, mode, spec.tag, p.causal, p.kv_heads, spec.measured_impl): c
        for (mode, p), c in tokamax_grid.planned(spec).items()
    }
    return PlannedConfigs(set(per_problem), {}, per_problem)


def plan_line(item: WorkItem) -> dict[str, Any]:
    """What ``tilesweep plan --dry-run --json`` prints for an item (its ``unit`` once it is
    placed in one: ``plan --lower`` lowers items before any are)."""
    rec = item.record_fields()
    if item.unit >= 0:
        rec["unit"] = item.unit
    rec["smem_bytes"] = item.smem_bytes
    rec["pruned"] = item.kind == PRUNED
    if item.kind == INVALID:
        rec["error"] = item.reason
    return rec
