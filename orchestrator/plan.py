"""Expanding a spec into work items and sharding them into units. Pure: no I/O, no submitit.

Item order is the reference run's record order (checked against all 832 of its records):
shapes nested dtype -> head_dim -> seq in the order the spec lists them; inside a shape the
``auto`` record of each mode first, then each mode's forced grid, axes nested in the order the
spec lists them, last axis fastest. An item's id is a hash of its identity and config
fields, so the same measurement has the same id in every sweep (resume and append key on it).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import PlanError
from .schema import FWD_BWD_CONFIG_FIELDS, FWD_CONFIG_FIELDS, SweepSpec, canonical_hash

# Item kinds: how the worker treats an item.
RUN, INVALID, PRUNED = "run", "invalid", "pruned"


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
    params: tuple[int, ...]  # values of FWD_CONFIG_FIELDS or FWD_BWD_CONFIG_FIELDS; () for auto
    id: str = ""
    kind: str = RUN
    reason: str | None = None  # why an item is invalid or pruned
    smem_bytes: int | None = None
    unit: int = -1

    @property
    def shape(self) -> tuple[str, int, int, int, int]:
        return (self.dtype, self.head_dim, self.seq, self.batch, self.heads)

    @property
    def param_names(self) -> tuple[str, ...]:
        if self.config == "auto":
            return ()
        return FWD_CONFIG_FIELDS if self.mode == "fwd" else FWD_BWD_CONFIG_FIELDS

    def record_fields(self) -> dict[str, Any]:
        """Identity and config fields exactly as a reference record has them."""
        rec: dict[str, Any] = {
            "dtype": self.dtype, "head_dim": self.head_dim, "seq": self.seq, "batch": self.batch,
            "heads": self.heads, "tag": self.tag, "mode": self.mode, "config": self.config,
        }
        rec.update(zip(self.param_names, self.params))
        return rec

    def kernel_config(self) -> dict[str, int] | None:
        """Keyword arguments of the kernel's AttentionConfig, or None for auto."""
        if self.config == "auto":
            return None
        if self.mode == "fwd":
            bq, bk, stages, warps = self.params
            return {"block_q": bq, "block_k": bk, "num_stages": stages, "num_warps": warps}
        fbq, fbk, outer, inner, stages, warps = self.params
        return {"block_q": fbq, "block_k": fbk, "bwd_outer": outer, "bwd_inner": inner,
                "num_stages": stages, "num_warps": warps}


def item_id(rec: dict[str, Any]) -> str:
    """Stable id of a record's identity (also computable from any merged record)."""
    key = "|".join(f"{k}={rec[k]}" for k in _id_keys(rec))
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def _id_keys(rec: dict[str, Any]) -> tuple[str, ...]:
    base = ("dtype", "head_dim", "seq", "batch", "heads", "tag", "mode", "config")
    if rec.get("config") == "auto":
        return base
    return base + (FWD_CONFIG_FIELDS if rec.get("mode") == "fwd" else FWD_BWD_CONFIG_FIELDS)


def _grid(spec: SweepSpec, mode: str) -> Iterator[tuple[int, ...]]:
    if mode == "fwd":
        return itertools.product(spec.fwd_block_q, spec.fwd_block_k, spec.fwd_stages, spec.fwd_warps)
    fb = spec.forward_blocks
    return itertools.product([fb.block_q], [fb.block_k], spec.bwd_outer, spec.bwd_inner, spec.bwd_stages, spec.bwd_warps)


def expand(spec: SweepSpec) -> list[WorkItem]:
    """All work items of a spec in reference record order, each classified."""
    items: list[WorkItem] = []
    predict = _smem_predictor(spec)
    for dtype, head_dim, seq in itertools.product(spec.dtypes, spec.head_dims, spec.seq_lens):
        common = (dtype, head_dim, seq, spec.batch, spec.heads, spec.tag)
        for mode in spec.modes:
            items.append(WorkItem(len(items), *common, mode, "auto", ()))
        if spec.auto_only:
            continue
        for mode in spec.modes:
            for params in _grid(spec, mode):
                items.append(WorkItem(len(items), *common, mode, "forced", params))
    for it in items:
        it.id = item_id(it.record_fields())
        _classify(it, spec, predict)
    return items


def _blocks(item: WorkItem) -> dict[str, int]:
    names = item.param_names
    wanted = ("block_q", "block_k") if item.mode == "fwd" else ("fwd_block_q", "fwd_block_k", "bwd_outer", "bwd_inner")
    return {n: v for n, v in zip(names, item.params) if n in wanted}


def _classify(item: WorkItem, spec: SweepSpec, predict: Any) -> None:
    if item.config == "auto":
        return
    for name, block in _blocks(item).items():
        eff = min(block, item.seq)  # the kernel clamps a block larger than seq
        if item.seq % eff:
            item.kind = INVALID
            item.reason = f"ValueError: seq={item.seq} must be a multiple of {name}={block} (not compiled)"
            return
    if predict is None:
        return
    kernel, nbytes, over = predict(item)
    item.smem_bytes = nbytes
    if over:
        item.kind = PRUNED
        item.reason = (
            f"SharedMemoryPredicted: {kernel} kernel needs {nbytes} bytes of shared memory "
            f"(predicted by the model, not compiled); smem_limit_bytes allows {spec.smem_limit_bytes}"
        )


def _smem_predictor(spec: SweepSpec) -> Any:
    """A function item -> (kernel, bytes, over_limit) or None when pruning is off."""
    from kernels import smem  # pure arithmetic, no jax import

    limit = spec.smem_limit_bytes
    enabled = spec.kernel.prune_smem == "predict" and limit is not None

    def predict(item: WorkItem) -> tuple[str, int, bool]:
        cfg = item.kernel_config() or {}
        preds = smem.predict_bytes(item.mode, item.dtype, item.head_dim, seq=item.seq, **cfg)
        over = next(((k, b) for k, b in preds if limit is not None and b > limit), None)
        if over is not None:
            return over[0], over[1], enabled
        kernel, nbytes = max(preds, key=lambda kb: kb[1])
        return kernel, nbytes, False

    return predict


# ---------------------------------------------------------------------------- sharding


@dataclass(slots=True)
class Unit:
    """A group of items run by one task. ``id`` hashes the item ids, so the same work has
    the same unit id across plans."""

    index: int
    items: list[WorkItem] = field(default_factory=list)
    id: str = ""

    def finalize(self) -> None:
        self.id = canonical_hash([it.id for it in self.items], length=12)
        for it in self.items:
            it.unit = self.index


def default_units(spec: SweepSpec, n_shapes: int) -> int:
    if spec.sharding.units is not None:
        return spec.sharding.units
    return max(1, min(n_shapes, 4))


def shard(items: list[WorkItem], n_units: int) -> list[Unit]:
    """Group items into at most ``n_units`` units, keeping a shape's items together where
    the count allows (inputs and the reference are computed once per shape per unit) and
    balancing the number of items that need a compile. Items keep plan order in a unit."""
    if n_units < 1:
        raise PlanError(f"units must be at least 1, got {n_units}")
    if not items:
        raise PlanError("the spec expands to no items; check its axes")
    n_units = min(n_units, len(items))
    groups: dict[tuple, list[WorkItem]] = {}
    for it in items:
        groups.setdefault(it.shape, []).append(it)
    pieces = list(groups.values())
    # Split the heaviest groups until there are at least as many pieces as units.
    while len(pieces) < n_units:
        pieces.sort(key=_cost, reverse=True)
        big = pieces.pop(0)
        half = len(big) // 2
        pieces += [big[:half], big[half:]]
    # Longest-processing-time-first packing of pieces into units.
    units = [Unit(i) for i in range(n_units)]
    loads = [0.0] * n_units
    for piece in sorted(pieces, key=_cost, reverse=True):
        j = min(range(n_units), key=lambda u: (loads[u], u))
        units[j].items.extend(piece)
        loads[j] += _cost(piece)
    units = [u for u in units if u.items]
    units.sort(key=lambda u: u.items and min(it.index for it in u.items))
    for i, u in enumerate(units):
        u.index = i
        u.items.sort(key=lambda it: it.index)
        u.finalize()
    return units


def _cost(piece: list[WorkItem]) -> float:
    """Relative cost of a run of items: a compile plus timed work growing with seq^2."""
    return sum(1.0 + (it.seq / 4096) ** 2 for it in piece if it.kind == RUN) + 0.01 * len(piece)


def plan(spec: SweepSpec, units: int | None = None) -> tuple[list[WorkItem], list[Unit]]:
    items = expand(spec)
    n_shapes = len({it.shape for it in items})
    return items, shard(items, units if units is not None else default_units(spec, n_shapes))


def plan_line(item: WorkItem) -> dict[str, Any]:
    """What ``tilesweep plan --dry-run --json`` prints for an item."""
    rec = item.record_fields()
    rec["unit"] = item.unit
    rec["smem_bytes"] = item.smem_bytes
    rec["pruned"] = item.kind == PRUNED
    if item.kind == INVALID:
        rec["error"] = item.reason
    return rec
