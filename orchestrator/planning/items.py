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
(``check_supported``), and a tunable it ignores is swept at the one value it runs, with a note
that says so (``notes``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from kernels import impls
from orchestrator.errors import PlanError
from orchestrator.planning.classify import INVALID, PRUNED, RUN, Clamped, Classifier
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
    params: tuple[int, ...]  # values of the mode's config fields (records.config_fields); () for auto
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
        return config_fields(self.mode, self.config)

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
        """Keyword arguments of the kernel's AttentionConfig, or None for auto."""
        if self.config == "auto":
            return None
        return kernel_kwargs(self.mode, self.params)


# The spec's grid axis of each AttentionConfig field a mode sweeps.
GRID_AXES: dict[str, dict[str, str]] = {
    "fwd": {"block_q": "fwd_block_q", "block_k": "fwd_block_k", "num_stages": "fwd_stages", "num_warps": "fwd_warps"},
    "fwd_bwd": {
        "bwd_outer": "bwd_outer",
        "bwd_inner": "bwd_inner",
        "num_stages": "bwd_stages",
        "num_warps": "bwd_warps",
    },
}


def _axis(spec: SweepSpec, mode: str, field: str) -> list[int]:
    """A grid axis's values, or the one value the implementation runs for a tunable it ignores."""
    pinned = impls.get(spec.measured_impl).pinned.get(mode, {})
    return [pinned[field]] if field in pinned else list(getattr(spec, GRID_AXES[mode][field]))


def _grid(spec: SweepSpec, mode: str) -> list[tuple[int, ...]]:
    axis = functools.partial(_axis, spec, mode)
    if mode == "fwd":
        return list(itertools.product(axis("block_q"), axis("block_k"), axis("num_stages"), axis("num_warps")))
    fb = spec.forward_blocks
    return list(
        itertools.product(
            [fb.block_q], [fb.block_k], axis("bwd_outer"), axis("bwd_inner"), axis("num_stages"), axis("num_warps")
        )
    )


def check_supported(spec: SweepSpec) -> None:
    """Refuse, in one line, an axis the spec's kernel implementation cannot do."""
    impl = impls.get(spec.measured_impl)
    gqa = [v for v in spec.kv_heads if v not in (None, spec.heads)]
    why = impl.unsupported(grouped_query=bool(gqa))
    if why:
        allowed = [n for n in impls.IMPL_NAMES if impls.IMPLS[n].grouped_query]
        raise PlanError(
            f"kernel.impl {impl.name!r}: {why}, so kv_heads {gqa} cannot be planned; allowed with it: "
            f"kv_heads [null] (or [{spec.heads}]); for grouped-query attention use kernel.impl "
            f"{' or '.join(map(repr, allowed))}"
        )


def notes(spec: SweepSpec) -> list[str]:
    """What the plan output says once about the spec's implementation: each tunable it
    ignores, swept at the one value it runs instead of the spec's list."""
    impl = impls.get(spec.measured_impl)
    out: list[str] = []
    if spec.auto_only:
        return out
    for mode in spec.modes:
        for field, value in impl.pinned.get(mode, {}).items():
            axis = GRID_AXES[mode][field]
            out.append(
                f"kernel.impl {impl.name!r}: {impl.pinned_why}, so {mode} configs are planned with "
                f"{field}={value} only ({axis} {getattr(spec, axis)} is not swept)"
            )
    return out


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


def _expand(spec: SweepSpec) -> list[WorkItem]:
    check_supported(spec)
    items: list[WorkItem] = []
    append = items.append
    batch, heads, tag, impl = spec.batch, spec.heads, spec.tag, spec.measured_impl
    shown = (spec.sweeps_causal, spec.sweeps_kv_heads)
    grids = {}
    for mode in spec.modes:
        params = _grid(spec, mode)
        names = config_fields(mode)
        grids[mode] = (params, [id_suffix(names, p) for p in params])
    classes = Classifier(spec, {mode: grids[mode][0] for mode in spec.modes})
    clamped = Clamped(grids)
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
            params, suffixes = clamped(mode, seq)
            prefix = id_prefix(dtype, head_dim, seq, batch, heads, tag, mode, "forced", **variant)
            start = len(items)
            items.extend(
                [  # positional arguments: a fifth of the cost of keywords, on a million items
                    WorkItem(
                        start + j,
                        dtype,
                        head_dim,
                        seq,
                        batch,
                        heads,
                        tag,
                        mode,
                        "forced",
                        p,
                        iid,
                        kind,
                        reason,
                        nbytes,
                        -1,
                        causal,
                        kv_heads,
                        impl,
                        shown,
                    )
                    for j, (p, iid, (kind, reason, nbytes)) in enumerate(
                        zip(params, ids_of(prefix, suffixes), classes(mode, dtype, head_dim, seq, params), strict=True)
                    )
                ]
            )
    return items


@dataclass
class PlannedConfigs:
    """The forced configs a spec plans per problem, without expanding it: the grid of a mode
    depends on the problem only through seq (blocks clamped to it), so one list per (mode,
    seq) serves every dtype, head_dim and tag. What a report of an incomplete sweep compares
    its records with, to say how many configs are missing."""

    # records.problem_key: (dtype, head_dim, seq, batch, heads, mode, tag, causal, kv_heads, impl)
    problems: set[tuple[Any, ...]]
    grids: dict[tuple[str, int], list[tuple[int, ...]]]

    def of(self, problem: tuple[Any, ...]) -> list[tuple[int, ...]] | None:
        """The planned configs (values of ``records.config_fields(mode)``), or None if the
        spec does not plan this problem."""
        if problem not in self.problems:
            return None
        return self.grids[(problem[5], problem[2])]


def planned_configs(spec: SweepSpec) -> PlannedConfigs:
    full = {}
    for mode in spec.modes:
        params = [] if spec.auto_only else _grid(spec, mode)
        full[mode] = (params, [b""] * len(params))  # id suffixes are not needed here
    clamped = Clamped(full)
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


def plan_line(item: WorkItem) -> dict[str, Any]:
    """What ``tilesweep plan --dry-run --json`` prints for an item."""
    rec = item.record_fields()
    rec["unit"] = item.unit
    rec["smem_bytes"] = item.smem_bytes
    rec["pruned"] = item.kind == PRUNED
    if item.kind == INVALID:
        rec["error"] = item.reason
    return rec
