"""Expanding a spec into work items and sharding them into units. Pure: no I/O, no submitit.

Item order is the reference run's record order (checked against all 832 of its records):
shapes nested dtype -> head_dim -> seq in the order the spec lists them; inside a shape the
``auto`` record of each mode first, then each mode's forced grid, axes nested in the order the
spec lists them, last axis fastest. An item's id is a hash of its identity and config
fields, so the same measurement has the same id in every sweep (resume and append key on it).

Sharding packs items into units by cost (``orchestrator.planning.costs``: a model, or an earlier
sweep's measurements) so that the slowest unit ends as early as possible, splitting a
shape across units where balance needs it and keeping it together where that costs little.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import hashlib
import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from orchestrator.planning.costs import CostTable, item_costs, setup_estimate
from orchestrator.errors import PlanError
from orchestrator.spec.model import FWD_BWD_CONFIG_FIELDS, FWD_CONFIG_FIELDS, SweepSpec, canonical_hash

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
        return _kernel_config(self.mode, self.params)


def item_id(rec: dict[str, Any]) -> str:
    """Stable id of a record's identity (also computable from any merged record)."""
    return _hash("|".join(f"{k}={rec[k]}" for k in _id_keys(rec)).encode())


def _id_keys(rec: dict[str, Any]) -> tuple[str, ...]:
    base = ("dtype", "head_dim", "seq", "batch", "heads", "tag", "mode", "config")
    if rec.get("config") == "auto":
        return base
    return base + (FWD_CONFIG_FIELDS if rec.get("mode") == "fwd" else FWD_BWD_CONFIG_FIELDS)


def _grid(spec: SweepSpec, mode: str) -> list[tuple[int, ...]]:
    if mode == "fwd":
        return list(itertools.product(spec.fwd_block_q, spec.fwd_block_k, spec.fwd_stages, spec.fwd_warps))
    fb = spec.forward_blocks
    return list(itertools.product([fb.block_q], [fb.block_k], spec.bwd_outer, spec.bwd_inner, spec.bwd_stages, spec.bwd_warps))


def _hash(key: bytes) -> str:
    return hashlib.blake2b(key, digest_size=8).hexdigest()


@contextlib.contextmanager
def _bulk() -> Iterator[None]:
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
    with _bulk():
        return _expand(spec)


def _expand(spec: SweepSpec) -> list[WorkItem]:
    items: list[WorkItem] = []
    append = items.append
    batch, heads, tag = spec.batch, spec.heads, spec.tag
    grids = {}
    for mode in spec.modes:
        params = _grid(spec, mode)
        names = FWD_CONFIG_FIELDS if mode == "fwd" else FWD_BWD_CONFIG_FIELDS
        suffixes = ["".join(f"|{n}={v}" for n, v in zip(names, p)).encode() for p in params]
        grids[mode] = (params, suffixes)
    classes = _Classifier(spec)
    blake2b = hashlib.blake2b
    for dtype, head_dim, seq in itertools.product(spec.dtypes, spec.head_dims, spec.seq_lens):
        base = f"dtype={dtype}|head_dim={head_dim}|seq={seq}|batch={batch}|heads={heads}|tag={tag}|mode="
        for mode in spec.modes:
            append(WorkItem(len(items), dtype, head_dim, seq, batch, heads, tag, mode, "auto", (),
                            _hash(f"{base}{mode}|config=auto".encode())))
        if spec.auto_only:
            continue
        for mode in spec.modes:
            params, suffixes = grids[mode]
            prefix = f"{base}{mode}|config=forced".encode()
            start = len(items)
            items.extend([
                WorkItem(start + j, dtype, head_dim, seq, batch, heads, tag, mode, "forced", p,
                         blake2b(prefix + suffix, digest_size=8).hexdigest(), kind, reason, nbytes)
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
        cfg = _kernel_config(mode, params)
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


def _kernel_config(mode: str, params: tuple[int, ...]) -> dict[str, int]:
    if mode == "fwd":
        bq, bk, stages, warps = params
        return {"block_q": bq, "block_k": bk, "num_stages": stages, "num_warps": warps}
    fbq, fbk, outer, inner, stages, warps = params
    return {"block_q": fbq, "block_k": fbk, "bwd_outer": outer, "bwd_inner": inner,
            "num_stages": stages, "num_warps": warps}


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


def shard(items: list[WorkItem], n_units: int, *, costs: list[float] | None = None,
          setups: dict[tuple, float] | None = None, strategy: str = "shape") -> list[Unit]:
    """Group items into at most ``n_units`` units so that the slowest unit is as short as
    the costs allow. Items keep plan order inside a unit.

    ``costs`` are seconds per item (default: ``orchestrator.planning.costs``'s model with default
    timing), ``setups`` seconds per shape for each unit that holds any of its items
    (inputs and references are made once per shape per unit). See ``pack`` for the two
    strategies."""
    if n_units < 1:
        raise PlanError(f"units must be at least 1, got {n_units}")
    if not items:
        raise PlanError("the spec expands to no items; check its axes")
    if strategy not in ("shape", "balanced"):
        raise PlanError(f"unknown sharding strategy {strategy!r}; allowed: shape, balanced")
    n_units = min(n_units, len(items))
    if costs is None:
        costs = item_costs(items, SweepSpec())[0]
    groups: dict[tuple, list[int]] = {}
    last: WorkItem | None = None
    members: list[int] = []
    for pos, it in enumerate(items):
        # Items come in runs of one shape: look the group up only where a run starts.
        if last is None or it.seq != last.seq or it.head_dim != last.head_dim or it.dtype != last.dtype \
                or it.batch != last.batch or it.heads != last.heads:
            members = groups.setdefault(it.shape, [])
            last = it
        members.append(pos)
    shapes = list(groups)
    if setups is None:
        setups = {sh: setup_estimate(sh, {items[p].mode for p in groups[sh]}) for sh in shapes}
    assignment = pack([groups[sh] for sh in shapes], costs, [setups[sh] for sh in shapes], n_units, strategy)
    units = [Unit(i, [items[p] for p in sorted(positions)]) for i, positions in enumerate(assignment) if positions]
    units.sort(key=lambda u: u.items[0].index)
    for i, u in enumerate(units):
        u.index = i
        u.finalize()
    return units


# Largest piece of a shape, as a fraction of a unit's fair share. "shape" splits a shape
# only where it is larger than that; "balanced" deals every shape out in small pieces,
# so each unit holds a similar mix of item classes and a class the cost model gets wrong
# shifts every unit alike (at the price of more per-shape setups).
PIECE_OF_UNIT = {"shape": 0.5, "balanced": 0.1}
# "shape" puts a piece beside its shape's other pieces while that unit stays within this
# fraction of the fair share (local search then evens out the rest).
KEEP_TOGETHER_SLACK = 0.02


def pack(groups: list[list[int]], costs: list[float], setups: list[float], n_units: int,
         strategy: str = "shape") -> list[list[int]]:
    """Positions (into ``costs``) per unit, minimising the slowest unit's cost.

    1. Split each group (a shape's items) into pieces of at most ``PIECE_OF_UNIT`` of the
       mean unit load; a group is dealt into its pieces in serpentine order of cost, so its
       pieces cost the same and hold the same mix of configs.
    2. Longest piece first, each onto the unit where it ends earliest, a unit that already
       holds the group paying no setup again; "shape" first tries the units that hold the
       group, while they stay within ``KEEP_TOGETHER_SLACK`` of the fair share.
    3. Local search on items: move an item (or swap two) from the slowest unit to another
       while that lowers the slowest of the pair.
    """
    total = sum(costs) + sum(setups)
    share = total / n_units
    pieces: list[tuple[float, int, list[int]]] = []  # (cost, group, positions)
    for g, positions in enumerate(groups):
        cost = sum(costs[p] for p in positions)
        k = min(len(positions), max(1, math.ceil(cost / (share * PIECE_OF_UNIT[strategy]))))
        if k == 1:
            pieces.append((cost, g, positions))
            continue
        order = sorted(positions, key=lambda p: -costs[p])
        parts: list[list[int]] = [[] for _ in range(k)]
        for j, p in enumerate(order):
            r, q = divmod(j, k)
            parts[q if r % 2 == 0 else k - 1 - q].append(p)
        pieces += [(sum(costs[p] for p in part), g, part) for part in parts]
    while len(pieces) < n_units:  # fewer pieces than units: halve the largest divisible one
        divisible = [k for k, piece in enumerate(pieces) if len(piece[2]) > 1]
        if not divisible:
            break
        cost, g, part = pieces.pop(max(divisible, key=lambda k: pieces[k][0]))
        order = sorted(part, key=lambda p: -costs[p])
        halves = (order[0::2], order[1::2])
        pieces += [(sum(costs[p] for p in h), g, h) for h in halves]
    state = _Units(n_units, costs, setups)
    pieces.sort(key=lambda x: (-x[0], x[1]))
    cap = share * (1 + KEEP_TOGETHER_SLACK) if strategy == "shape" else None
    for cost, g, part in pieces:
        state.place(g, part, cost, cap)
    state.improve()
    return state.positions()


class _Units:
    """Loads and contents of units while packing: per unit, per group, costs kept sorted."""

    def __init__(self, n: int, costs: list[float], setups: list[float]) -> None:
        self.n, self.costs, self.setups = n, costs, setups
        self.load = [0.0] * n
        self.members: list[dict[int, list[tuple[float, int]]]] = [{} for _ in range(n)]
        self.holders: dict[int, set[int]] = {}
        self.heap = [(0.0, u) for u in range(n)]

    def _least(self) -> int:
        while True:
            load, u = self.heap[0]
            if load == self.load[u]:
                return u
            heapq.heappop(self.heap)

    def _add_load(self, u: int, delta: float) -> None:
        self.load[u] += delta
        heapq.heappush(self.heap, (self.load[u], u))

    def place(self, g: int, part: list[int], cost: float, cap: float | None = None) -> None:
        """Put a piece where it ends earliest; with ``cap``, first onto the fullest unit that
        already holds its group and stays under ``cap`` (keeping a shape together)."""
        holders = self.holders.get(g, set())
        fits = [v for v in holders if self.load[v] + cost <= cap] if cap is not None else []
        if fits:
            u = max(fits, key=lambda v: (self.load[v], -v))
        else:
            u = min(holders | {self._least()},
                    key=lambda v: (self.load[v] + cost + (0.0 if g in self.members[v] else self.setups[g]), v))
        extra = 0.0 if g in self.members[u] else self.setups[g]
        bucket = self.members[u].setdefault(g, [])
        bucket.extend((self.costs[p], p) for p in part)
        bucket.sort()
        self.holders.setdefault(g, set()).add(u)
        self._add_load(u, cost + extra)

    def _move(self, p: int, g: int, src: int, dst: int) -> None:
        c = self.costs[p]
        bucket = self.members[src][g]
        bucket.pop(bisect.bisect_left(bucket, (c, p)))
        delta_src = -c
        if not bucket:
            del self.members[src][g]
            self.holders[g].discard(src)
            delta_src -= self.setups[g]
        delta_dst = c if g in self.members[dst] else c + self.setups[g]
        bisect.insort(self.members[dst].setdefault(g, []), (c, p))
        self.holders[g].add(dst)
        self._add_load(src, delta_src)
        self._add_load(dst, delta_dst)

    def _best_move(self, u: int, v: int) -> tuple[float, int, int] | None:
        """(new slower load of the pair, position, group) of the best single move u -> v."""
        lu, lv = self.load[u], self.load[v]
        best = None
        for g, bucket in self.members[u].items():
            save = self.setups[g] if len(bucket) == 1 else 0.0
            add = 0.0 if g in self.members[v] else self.setups[g]
            want = (lu - lv - save - add) / 2
            k = bisect.bisect_left(bucket, (want, -1))
            for c, p in bucket[max(0, k - 1):k + 1]:
                new = max(lu - c - save, lv + c + add)
                if best is None or new < best[0]:
                    best = (new, p, g)
        return best

    def _best_swap(self, u: int, v: int) -> tuple[float, int, int, int, int] | None:
        """Best exchange of an item of u with a cheaper one of v, among groups both hold
        (so no setup changes hands)."""
        lu, lv = self.load[u], self.load[v]
        shared = [g for g in self.members[u] if g in self.members[v]]
        if not shared:
            return None
        theirs = sorted((c, p, g) for g in shared for c, p in self.members[v][g])
        keys = [c for c, _, _ in theirs]
        best = None
        for g in shared:
            for c, p in self.members[u][g]:
                k = bisect.bisect_left(keys, c - (lu - lv) / 2)
                for c2, p2, g2 in theirs[max(0, k - 1):k + 1]:
                    d = c - c2
                    if d <= 0:
                        continue
                    new = max(lu - d, lv + d)
                    if best is None or new < best[0]:
                        best = (new, p, g, p2, g2)
        return best

    def improve(self, max_rounds: int | None = None, swap_items: int = 5000) -> None:
        eps = 1e-9 * max(self.load)
        rounds = max_rounds if max_rounds is not None else 50 * self.n + 100
        for _ in range(rounds):
            u = max(range(self.n), key=lambda x: (self.load[x], -x))
            others = sorted((v for v in range(self.n) if v != u), key=lambda v: self.load[v])[:16]
            done = False
            for v in others:
                if self.load[u] - self.load[v] <= eps:
                    break
                move = self._best_move(u, v)
                if move is not None and move[0] < self.load[u] - eps:
                    self._move(move[1], move[2], u, v)
                    done = True
                    break
            if done:
                continue
            for v in others:
                if self.load[u] - self.load[v] <= eps:
                    break
                if sum(map(len, self.members[u].values())) > swap_items:
                    break
                swap = self._best_swap(u, v)
                if swap is not None and swap[0] < self.load[u] - eps:
                    _, p, g, p2, g2 = swap
                    self._move(p, g, u, v)
                    self._move(p2, g2, v, u)
                    done = True
                    break
            if not done:
                return

    def positions(self) -> list[list[int]]:
        return [[p for bucket in m.values() for _, p in bucket] for m in self.members]


def plan(spec: SweepSpec, units: int | None = None, costs: CostTable | None = None) -> tuple[list[WorkItem], list[Unit]]:
    """Expand and shard a spec. ``costs`` (``costs.load_costs``) replaces the cost model
    with an earlier sweep's measurements where it has them."""
    with _bulk():
        items = _expand(spec)
        shapes = [(dtype, head_dim, seq, spec.batch, spec.heads)
                  for dtype, head_dim, seq in itertools.product(spec.dtypes, spec.head_dims, spec.seq_lens)]
        item_cost, scale = item_costs(items, spec, costs)
        setups = {sh: setup_estimate(sh, spec.modes) * scale for sh in shapes}
        n = units if units is not None else default_units(spec, len(shapes))
        return items, shard(items, n, costs=item_cost, setups=setups, strategy=spec.sharding.strategy)


def plan_line(item: WorkItem) -> dict[str, Any]:
    """What ``tilesweep plan --dry-run --json`` prints for an item."""
    rec = item.record_fields()
    rec["unit"] = item.unit
    rec["smem_bytes"] = item.smem_bytes
    rec["pruned"] = item.kind == PRUNED
    if item.kind == INVALID:
        rec["error"] = item.reason
    return rec
