"""Sharding: work items packed into units so that the slowest unit ends as early as possible.

Units are packed by cost (``orchestrator.planning.costs``: a model, or an earlier sweep's
measurements), splitting a shape across units where balance needs it and keeping it together
where that costs little (a unit pays a shape's setup, inputs and references, once).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kernels.spelling import as_json, one_of
from orchestrator.errors import PlanError
from orchestrator.planning.classify import RUN
from orchestrator.planning.costs import item_costs, setup_estimate
from orchestrator.planning.items import WorkItem
from orchestrator.spec.identity import canonical_hash
from orchestrator.spec.model import SweepSpec


def unit_id(sweep: str, item_ids: Iterable[str], tag: str | None = None) -> str:
    """A unit's id: a hash of the sweep's fingerprint (two sweeps of the same items, timed
    differently, never share a unit id, so a record's ``unit`` says which sweep measured it),
    of ``tag`` (what else sets the unit apart: its round after the first, a resume or a retry,
    whose units hold items an earlier unit held) and of its item ids. Ids are computed once,
    when a unit is planned, and read from the sweep's unit index ever after, so a sweep
    directory keeps the ids it was planned with whatever this rule becomes."""
    return canonical_hash([sweep, *([tag] if tag else []), *item_ids], length=12)


@dataclass(slots=True)
class Unit:
    """A group of items run by one task; ``id`` is ``unit_id`` of its sweep, its round after
    the first (a round-2 unit may hold the very items of a round-1 unit) and its items."""

    index: int
    items: list[WorkItem] = field(default_factory=list)
    id: str = ""
    round: int = 1
    share: float | None = None  # of its task's work, where a whole-node task's units are tapered

    def finalize(self, sweep: str = "", tag: str | None = None) -> None:
        """Set the id (``unit_id``; ``tag`` defaults to the round after the first) and number the items."""
        tag = tag or (f"round{self.round}" if self.round != 1 else None)
        self.id = unit_id(sweep, (it.id for it in self.items), tag)
        for it in self.items:
            it.unit = self.index


def default_units(spec: SweepSpec, n_shapes: int) -> int:
    """``sharding.units``, else one per shape (at most 4), rounded up to fill whole SLURM
    tasks (a task with G GPUs runs G units)."""
    if spec.sharding.units is not None:
        return spec.sharding.units
    return spec.executor.fill_tasks(max(1, min(n_shapes, 4)))


def shard(
    items: list[WorkItem],
    n_units: int,
    *,
    costs: list[float] | None = None,
    setups: dict[tuple, float] | None = None,
    strategy: str = "shape",
    round_: int = 1,
    sweep: str = "",
    shares: Sequence[float] | None = None,
) -> list[Unit]:
    """Group items into at most ``n_units`` units so that the slowest unit is as short as
    the costs allow. Items keep plan order inside a unit.

    ``costs`` are seconds per item (default: ``orchestrator.planning.costs``'s model with default
    timing), ``setups`` seconds per shape for each unit that holds any of its items
    (inputs and references are made once per shape per unit), ``sweep`` the sweep's
    fingerprint the unit ids hash (``unit_id``). See ``pack`` for the two strategies.

    ``shares`` (``ExecutorSettings.unit_shares``: a whole-node task's units, largest first, as
    shares of the task's work) tapers the units where ``n_units`` fills whole tasks: each block
    of ``len(shares)`` consecutive units (a task, ``dispatch.slurm.tasks_of``) is cut to them."""
    if n_units < 1:
        raise PlanError(f"units must be at least 1, got {n_units}")
    if not items:
        raise PlanError("the spec expands to no items; check its axes")
    if strategy not in ("shape", "balanced"):
        raise PlanError(f"unknown sharding strategy {as_json(strategy)}; allowed: {one_of(('shape', 'balanced'))}")
    n_units = min(n_units, max(1, sum(it.kind == RUN for it in items)))  # a unit measures something
    if costs is None:
        costs = item_costs(items, SweepSpec())[0]
    groups = _by_shape(items)
    shapes = list(groups)
    if setups is None:
        setups = {sh: setup_estimate(sh, {items[p].mode for p in groups[sh]}) for sh in shapes}
    per_task = len(shares) if shares and n_units % len(shares) == 0 else 0
    weights = [shares[u % per_task] for u in range(n_units)] if shares and per_task else None
    packing = [groups[sh] for sh in shapes], costs, [setups[sh] for sh in shapes], n_units, strategy
    assignment = pack(*packing, weights)
    busy = _busy(assignment, items)
    if weights is not None and len(busy) < n_units:  # too few items for a unit of each share: equal units
        weights, assignment = None, pack(*packing)
        busy = _busy(assignment, items)
    if weights is not None:  # each task's block of units holds every share
        units = [
            Unit(i, [items[p] for p in positions], round=round_, share=w)
            for i, (positions, w) in enumerate(_blocks(assignment, weights, per_task))
        ]
    else:
        units = [Unit(i, [items[p] for p in positions], round=round_) for i, positions in enumerate(busy)]
        units.sort(key=lambda u: u.items[0].index)
    for i, u in enumerate(units):
        u.index = i
        u.finalize(sweep)
    return units


def _by_shape(items: list[WorkItem]) -> dict[tuple, list[int]]:
    """The positions of ``items`` per shape, shapes in plan order."""
    groups: dict[tuple, list[int]] = {}
    last: WorkItem | None = None
    members: list[int] = []
    for pos, it in enumerate(items):
        # Items come in runs of one shape: look the group up only where a run starts.
        if (
            last is None
            or it.seq != last.seq
            or it.head_dim != last.head_dim
            or it.dtype != last.dtype
            or it.batch != last.batch
            or it.heads != last.heads
        ):
            members = groups.setdefault(it.shape, [])
            last = it
        members.append(pos)
    return groups


def _blocks(assignment: list[list[int]], weights: list[float], per_task: int) -> list[tuple[list[int], float]]:
    """Packed units and their shares in blocks of ``per_task`` (``assignment``'s order: one
    task's shares), each unit in plan order, the units of a block in plan order of their first
    item, and the blocks in plan order of theirs."""
    blocks = [
        sorted((sorted(assignment[u]), weights[u]) for u in range(t, t + per_task))
        for t in range(0, len(assignment), per_task)
    ]
    return [unit for block in sorted(blocks, key=lambda b: b[0][0][0]) for unit in block]


def _busy(assignment: list[list[int]], items: list[WorkItem]) -> list[list[int]]:
    """The packed units, each in plan order, where a unit that would measure nothing (pruned or
    invalid items only, recorded without a compile: its worker would start for nothing) joins
    the unit before it in plan order (the first such, the unit after it)."""
    groups = sorted((sorted(g) for g in assignment if g), key=lambda g: g[0])
    out: list[list[int]] = []
    waiting: list[int] = []
    for g in groups:
        if not any(items[p].kind == RUN for p in g):
            (out[-1] if out else waiting).extend(g)
        else:
            out.append(waiting + g)
            waiting = []
    if waiting:  # nothing to measure anywhere: one unit records it all
        out.append(waiting)
    return [sorted(g) for g in out]


# Largest piece of a shape, as a fraction of a unit's fair share. "shape" splits a shape
# only where it is larger than that; "balanced" deals every shape out in small pieces,
# so each unit holds a similar mix of item classes and a class the cost model gets wrong
# shifts every unit alike (at the price of more per-shape setups).
PIECE_OF_UNIT = {"shape": 0.5, "balanced": 0.1}
# "shape" puts a piece beside its shape's other pieces while that unit stays within this
# fraction of the fair share (local search then evens out the rest).
KEEP_TOGETHER_SLACK = 0.02


def pack(
    groups: list[list[int]],
    costs: list[float],
    setups: list[float],
    n_units: int,
    strategy: str = "shape",
    weights: list[float] | None = None,
) -> list[list[int]]:
    """Positions (into ``costs``) per unit, minimising the slowest unit's cost, or with
    ``weights`` (one per unit, mean 1) its cost over its weight: a unit of weight 0.5 gets half
    the work of one of weight 1.

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
    state = _Units(n_units, costs, setups, weights)
    pieces.sort(key=lambda x: (-x[0], x[1]))
    cap = share * (1 + KEEP_TOGETHER_SLACK) if strategy == "shape" else None
    for cost, g, part in pieces:
        state.place(g, part, cost, cap)
    state.improve()
    return state.positions()


class _Units:
    """Loads and contents of units while packing: per unit, per group, costs kept sorted."""

    def __init__(self, n: int, costs: list[float], setups: list[float], weights: list[float] | None = None) -> None:
        self.n, self.costs, self.setups = n, costs, setups
        self.weight = list(weights) if weights is not None else [1.0] * n
        self.load = [0.0] * n
        self.members: list[dict[int, list[tuple[float, int]]]] = [{} for _ in range(n)]
        self.holders: dict[int, set[int]] = {}
        self.heap = [(0.0, u) for u in range(n)]

    def norm(self, u: int) -> float:
        """Unit ``u``'s load over its weight: what packing evens out."""
        return self.load[u] / self.weight[u]

    def _least(self) -> int:
        while True:
            load, u = self.heap[0]
            if load == self.norm(u):
                return u
            heapq.heappop(self.heap)

    def _add_load(self, u: int, delta: float) -> None:
        self.load[u] += delta
        heapq.heappush(self.heap, (self.norm(u), u))

    def place(self, g: int, part: list[int], cost: float, cap: float | None = None) -> None:
        """Put a piece where it ends earliest; with ``cap``, first onto the fullest unit that
        already holds its group and stays under ``cap`` (keeping a shape together)."""
        holders = self.holders.get(g, set())
        fits = [v for v in holders if self.load[v] + cost <= cap * self.weight[v]] if cap is not None else []
        if fits:
            u = max(fits, key=lambda v: (self.norm(v), -v))
        else:
            w = self.weight
            u = min(
                holders | {self._least()},
                key=lambda v: ((self.load[v] + cost + (0.0 if g in self.members[v] else self.setups[g])) / w[v], v),
            )
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
        """(new slower weighted load of the pair, position, group) of the best single move u -> v."""
        lu, lv, wu, wv = self.load[u], self.load[v], self.weight[u], self.weight[v]
        best = None
        for g, bucket in self.members[u].items():
            save = self.setups[g] if len(bucket) == 1 else 0.0
            add = 0.0 if g in self.members[v] else self.setups[g]
            want = (wv * lu - wu * lv - wv * save - wu * add) / (wu + wv)  # the cost that evens the pair
            k = bisect.bisect_left(bucket, (want, -1))
            for c, p in bucket[max(0, k - 1) : k + 1]:
                new = max((lu - c - save) / wu, (lv + c + add) / wv)
                if best is None or new < best[0]:
                    best = (new, p, g)
        return best

    def _best_swap(self, u: int, v: int) -> tuple[float, int, int, int, int] | None:
        """Best exchange of an item of u with a cheaper one of v, among groups both hold
        (so no setup changes hands)."""
        lu, lv, wu, wv = self.load[u], self.load[v], self.weight[u], self.weight[v]
        shared = [g for g in self.members[u] if g in self.members[v]]
        if not shared:
            return None
        theirs = sorted((c, p, g) for g in shared for c, p in self.members[v][g])
        keys = [c for c, _, _ in theirs]
        best = None
        for g in shared:
            for c, p in self.members[u][g]:
                k = bisect.bisect_left(keys, c - (wv * lu - wu * lv) / (wu + wv))
                for c2, p2, g2 in theirs[max(0, k - 1) : k + 1]:
                    d = c - c2
                    if d <= 0:
                        continue
                    new = max((lu - d) / wu, (lv + d) / wv)
                    if best is None or new < best[0]:
                        best = (new, p, g, p2, g2)
        return best

    def improve(self, max_rounds: int | None = None, swap_items: int = 5000) -> None:
        norm = self.norm
        eps = 1e-9 * max(map(norm, range(self.n)))
        rounds = max_rounds if max_rounds is not None else 50 * self.n + 100
        for _ in range(rounds):
            u = max(range(self.n), key=lambda x: (norm(x), -x))
            others = sorted((v for v in range(self.n) if v != u), key=norm)[:16]
            done = False
            for v in others:
                if norm(u) - norm(v) <= eps:
                    break
                move = self._best_move(u, v)
                if move is not None and move[0] < norm(u) - eps:
                    self._move(move[1], move[2], u, v)
                    done = True
                    break
            if done:
                continue
            for v in others:
                if norm(u) - norm(v) <= eps:
                    break
                if sum(map(len, self.members[u].values())) > swap_items:
                    break
                swap = self._best_swap(u, v)
                if swap is not None and swap[0] < norm(u) - eps:
                    _, p, g, p2, g2 = swap
                    self._move(p, g, u, v)
                    self._move(p2, g2, v, u)
                    done = True
                    break
            if not done:
                return

    def positions(self) -> list[list[int]]:
        return [[p for bucket in m.values() for _, p in bucket] for m in self.members]
