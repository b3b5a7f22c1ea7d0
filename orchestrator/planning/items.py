"""Expanding a spec into work items, each classified. Pure: no I/O, no submitit.

Item order is the reference run's record order (checked against all 832 of its records):
shapes nested dtype -> head_dim -> seq in the order the spec lists them; inside a shape the
``auto`` record of each mode first, then each mode's forced grid, axes nested in the order the
spec lists them, last axis fastest. An item's id is a hash of its identity and config
fields (``orchestrator.spec.records.item_id``), so the same measurement has the same id in
every sweep (resume and append key on it).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import config_fields, id_of, id_prefix, id_suffix, kernel_kwargs

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
    params: tuple[int, ...]  # values of the mode's config fields (records.config_fields); () for auto
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
        return config_fields(self.mode, self.config)

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
        return kernel_kwargs(self.mode, self.params)


def _grid(spec: SweepSpec, mode: str) -> list[tuple[int, ...]]:
    if mode == "fwd":
        return list(itertools.product(spec.fwd_block_q, spec.fwd_block_k, spec.fwd_stages, spec.fwd_warps))
    fb = spec.forward_blocks
    return list(itertools.product([fb.block_q], [fb.block_k], spec.bwd_outer, spec.bwd_inner, spec.bwd_stages, spec.bwd_warps))


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
    items: list[WorkItem] = []
    append = items.append
    batch, heads, tag = spec.batch, spec.heads, spec.tag
    grids = {}
    for mode in spec.modes:
        params = _grid(spec, mode)
        names = config_fields(mode)
        grids[mode] = (params, [id_suffix(names, p) for p in params])
    classes = _Classifier(spec)
    for dtype, head_dim, seq in itertools.product(spec.dtypes, spec.head_dims, spec.seq_lens):
        for mode in spec.modes:
            auto_id = id_of(id_prefix(dtype, head_dim, seq, batch, heads, tag, mode, "auto"), b"")
            append(WorkItem(len(items), dtype, head_dim, seq, batch, heads, tag, mode, "auto", (), auto_id))
        if spec.auto_only:
            continue
        for mode in spec.modes:
            params, suffixes = grids[mode]
            prefix = id_prefix(dtype, head_dim, seq, batch, heads, tag, mode, "forced")
            start = len(items)
            items.extend([
                WorkItem(start + j, dtype, head_dim, seq, batch, heads, tag, mode, "forced", p,
                         id_of(prefix, suffix), kind, reason, nbytes)
                for j, (p, suffix, (kind, reason, nbytes))
                in enumerate(zip(params, suffixes, classes(mode, dtype, head_dim, seq, params)))
            ])
    return items


_BLOCK_POSITIONS = {"fwd": (("block_q", 0), ("block_k", 1)),
                    "fwd_bwd": (("fwd_block_q", 0), ("fwd_block_k", 1), ("bwd_outer", 2), ("bwd_inner", 3))}


class _Classifier:
    """(kind, reason, smem_bytes) of each config of a grid at one shape.

    Whether a config runs depends on seq only through divisibility and the clamping of
    blocks to seq, so a grid's classification is computed once per (mode, dtype,
    head_dim) and reused for every seq at which no block is clamped or invalid."""

    def __init__(self, spec: SweepSpec) -> None:
        from kernels import smem  # pure arithmetic, no jax import

        self.smem = smem
        self.limit = spec.smem_limit_bytes
        self.enabled = spec.kernel.prune_smem == "predict" and self.limit is not None
        self.cache: dict[tuple, list[tuple[str, str | None, int | None]]] = {}
        self.blocks: dict[str, list[int]] = {}  # distinct block sizes of each mode's grid

    def __call__(self, mode: str, dtype: str, head_dim: int, seq: int,
                 grid: list[tuple[int, ...]]) -> list[tuple[str, str | None, int | None]]:
        positions = _BLOCK_POSITIONS[mode]
        blocks = self.blocks.get(mode)
        if blocks is None:
            blocks = self.blocks[mode] = sorted({p[i] for p in grid for _, i in positions})
        plain = all(b <= seq and seq % b == 0 for b in blocks)
        key = (mode, dtype, head_dim, None if plain else seq)
        out = self.cache.get(key)
        if out is None:
            out = self.cache[key] = [self._one(mode, dtype, head_dim, seq, p, positions) for p in grid]
        return out

    def _one(self, mode: str, dtype: str, head_dim: int, seq: int, params: tuple[int, ...],
             positions: tuple[tuple[str, int], ...]) -> tuple[str, str | None, int | None]:
        for name, i in positions:
            block = params[i]
            if seq % min(block, seq):  # the kernel clamps a block larger than seq
                return INVALID, f"ValueError: seq={seq} must be a multiple of {name}={block} (not compiled)", None
        cfg = kernel_kwargs(mode, params)
        preds = self.smem.predict_bytes(mode, dtype, head_dim, seq=seq, **cfg)
        over = self.smem.first_over(preds, self.limit)
        if over is None:
            return RUN, None, max(b for _, b in preds)
        kernel, nbytes = over
        if not self.enabled:
            return RUN, None, nbytes
        return PRUNED, (
            f"SharedMemoryPredicted: {kernel} kernel needs {nbytes} bytes of shared memory "
            f"(predicted by the model, not compiled); smem_limit_bytes allows {self.limit}"
        ), nbytes


def plan_line(item: WorkItem) -> dict[str, Any]:
    """What ``tilesweep plan --dry-run --json`` prints for an item."""
    rec = item.record_fields()
    rec["unit"] = item.unit
    rec["smem_bytes"] = item.smem_bytes
    rec["pruned"] = item.kind == PRUNED
    if item.kind == INVALID:
        rec["error"] = item.reason
    return rec
