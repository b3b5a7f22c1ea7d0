"""The tile heatmap of one problem, as data: what the PNG plots and the HTML page both draw.

The axes are the two tiles that decide most of the time: block_q x block_k for fwd,
bwd_outer x bwd_inner for fwd_bwd (an implementation with its own config fields: its first
two, block_q x block_kv for jax's Mosaic GPU kernel, each cell naming its best config). Each
cell is the best median over the remaining axes (stages, warps; for fwd_bwd also the forward
blocks when they vary), with the winning stages/warps as its detail, and counts configs (a
config timed once is not failed, however often it failed before). A cell where every config
failed is ``failed``, or ``pruned`` when every one of them was refused before running by the
shared-memory model (that is a prediction, not a measured failure, and the page says which); a
cell with no record is ``absent``. A halving sweep's screens (``"screened": true``: one short sample) are never a
measurement: a cell is timed by its configs timed in full, and a cell whose configs were only
screened is ``screened``, showing its best screen, marked as such in the page and the plots and
never the best cell (the report's best is never a screen either). Nothing here needs matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from kernels import impls
from orchestrator.analysis.report import ProblemKey, config_label
from orchestrator.analysis.scan import is_success
from orchestrator.spec.records import DEFAULT_IMPL, config_fields, config_of

AXES = {"fwd": ("block_q", "block_k"), "fwd_bwd": ("bwd_outer", "bwd_inner")}
_SHORT_DTYPE = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


@dataclass(frozen=True)
class Cell:
    status: str  # "ok", "screened" (only screens), "failed", "pruned" (every config here pruned) or "absent"
    median_ms: float | None = None
    detail: str = ""  # the winning config's other axes, e.g. "s2 w4"
    n_failed: int = 0  # configs in this cell that never produced a timing (pruned ones included)
    n_total: int = 0  # configs in this cell
    n_pruned: int = 0  # of the failed, how many were pruned
    n_screened: int = 0  # configs in this cell timed by a screening sample only


@dataclass(frozen=True)
class HeatmapData:
    key: ProblemKey
    row_axis: str
    col_axis: str
    rows: list[int]
    cols: list[int]
    cells: list[list[Cell]]  # [row][col]
    auto_ms: float | None
    folded: str  # what each cell takes the best over, for the title

    def best(self) -> tuple[int, int] | None:
        """(row, col) of the fastest cell timed in full, the first one on a tie; None when no cell
        has such a time."""
        found, best_ms = None, float("inf")
        for i, line in enumerate(self.cells):
            for j, c in enumerate(line):
                if c.status == "ok" and c.median_ms is not None and c.median_ms < best_ms:
                    found, best_ms = (i, j), c.median_ms
        return found

    def best_ms(self) -> float | None:
        """The median of the fastest cell timed in full (``best``), None when none has one."""
        found = self.best()
        return None if found is None else self.cells[found[0]][found[1]].median_ms


@dataclass(frozen=True)
class Configs:
    """One pass over a problem's records: auto's best time and, per forced config (its config
    field values), the fastest successful record timed in full (``None``: it never produced
    such a timing), its first failed record, and the fastest screen of a config with no other
    timing. The heatmap and the page's list of failed configs both use it."""

    fields: tuple[str, ...]
    auto_ms: float | None
    best: dict[tuple, dict[str, Any] | None]
    first_failure: dict[tuple, dict[str, Any]]
    screened: dict[tuple, dict[str, Any]] = field(default_factory=dict)

    def label(self, cid: tuple, mode: str) -> str:
        return config_label(dict(zip(self.fields, cid, strict=True)), mode)


def configs_of(mode: str, records: list[dict[str, Any]], max_rel_err: float | None = None) -> Configs:
    """One problem's records by config (``max_rel_err``: the document's, ``scan.is_success``)."""
    fields = config_fields(mode, impl=records[0].get("impl", DEFAULT_IMPL) if records else DEFAULT_IMPL)
    get = itemgetter(*fields)
    auto_ms = None
    best: dict[tuple, dict[str, Any] | None] = {}
    first_failure: dict[tuple, dict[str, Any]] = {}
    screened: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        ok = is_success(rec, max_rel_err)
        if rec["config"] == "auto":
            if ok and (auto_ms is None or rec["median_ms"] < auto_ms):
                auto_ms = float(rec["median_ms"])
            continue
        try:
            cid = get(rec)
        except KeyError:  # a forced record without some config field: still one config
            cid = tuple(map(rec.get, fields))
        if ok and rec.get("screened") is True:  # a screen: kept apart, never a measurement
            prev = screened.get(cid)
            if prev is None or rec["median_ms"] < prev["median_ms"]:
                screened[cid] = rec
        elif ok:
            prev = best.get(cid)
            if prev is None or rec["median_ms"] < prev["median_ms"]:
                best[cid] = rec
        else:
            best.setdefault(cid, None)
            first_failure.setdefault(cid, rec)
    only_screened = {cid: rec for cid, rec in screened.items() if cid not in best}
    return Configs(fields, auto_ms, best, first_failure, only_screened)


class _Tally:
    """What one cell has seen: its fastest successful record and its counts of configs."""

    __slots__ = ("best", "screen", "failed", "pruned", "screened", "total")

    def __init__(self) -> None:
        self.best: dict[str, Any] | None = None
        self.screen: dict[str, Any] | None = None  # the fastest screen of a config only screened
        self.failed = self.pruned = self.screened = self.total = 0


def heatmap_data(key: ProblemKey, records: list[dict[str, Any]], configs: Configs | None = None) -> HeatmapData | None:
    """The heatmap of one problem, or ``None`` for a mode without tile axes or no forced record.
    ``configs``: the problem's ``configs_of``, when the caller has it already."""
    axes = AXES.get(key.mode)
    if axes is None:
        return None
    cs = configs if configs is not None else configs_of(key.mode, records)
    if not set(axes) <= set(cs.fields):  # an implementation with its own fields: its first two
        if len(cs.fields) < 2:
            return None
        axes = (cs.fields[0], cs.fields[1])
    ri, ci = cs.fields.index(axes[0]), cs.fields.index(axes[1])
    tallies, fwd_blocks = _tallies(cs, ri, ci, key.mode)
    if not tallies:
        return None
    vary_fwd = len(fwd_blocks) > 1
    rows = sorted({r for r, _ in tallies})
    cols = sorted({c for _, c in tallies})
    cells = [[_cell(tallies.get((r, c)), vary_fwd) for c in cols] for r in rows]
    return HeatmapData(key, axes[0], axes[1], rows, cols, cells, cs.auto_ms, _folded(cs.fields, axes, vary_fwd))


_SHORT = {"num_stages": "stages", "num_warps": "warps"}  # the Triton kernels' axes as the page names them
_FWD_BLOCKS = ("fwd_block_q", "fwd_block_k")


def _folded(fields: tuple[str, ...], axes: tuple[str, str], vary_fwd: bool) -> str:
    """The config fields a cell's best is taken over: every field but the two axes (the Triton
    kernels' stages and warps; another implementation's own fields), and the forward blocks of
    a fwd_bwd problem where they vary."""
    rest = [_SHORT.get(f, f) for f in fields if f not in axes and f not in _FWD_BLOCKS]
    return ", ".join(rest + (["fwd blocks"] if vary_fwd else []))


def _tallies(cs: Configs, ri: int, ci: int, mode: str) -> tuple[dict[tuple[int, int], _Tally], set[tuple[Any, Any]]]:
    """Each cell's tally (by its row and column tile) and the forward blocks of fwd_bwd records
    timed in full: the configs timed in full or failed, then those only screened."""
    tallies: dict[tuple[int, int], _Tally] = {}
    fwd_blocks: set[tuple[Any, Any]] = set()

    def tally(cid: tuple) -> _Tally | None:
        r, c = cid[ri], cid[ci]
        if r.__class__ is not int or c.__class__ is not int:
            return None
        t = tallies.get((r, c))
        if t is None:
            t = tallies[(r, c)] = _Tally()
        t.total += 1
        return t

    for cid, rec in cs.best.items():
        if (t := tally(cid)) is None:
            continue
        if rec is None:
            t.failed += 1
            t.pruned += cs.first_failure[cid].get("pruned") is True
            continue
        if mode == "fwd_bwd":
            fwd_blocks.add((rec.get("fwd_block_q"), rec.get("fwd_block_k")))
        if t.best is None or rec["median_ms"] < t.best["median_ms"]:
            t.best = rec
    for cid, rec in cs.screened.items():
        if (t := tally(cid)) is None:
            continue
        t.screened += 1
        if t.screen is None or rec["median_ms"] < t.screen["median_ms"]:
            t.screen = rec
    return tallies, fwd_blocks


def _cell(t: _Tally | None, vary_fwd: bool) -> Cell:
    if t is None:
        return Cell("absent")
    rec = t.best if t.best is not None else t.screen
    if rec is None:
        status = "pruned" if t.pruned == t.failed else "failed"
        return Cell(status, n_failed=t.failed, n_total=t.total, n_pruned=t.pruned)
    own = impls.label(rec["mode"], config_of(rec)) if "impl" in rec else None  # its own fields' name
    detail = own or f"s{rec.get('num_stages')} w{rec.get('num_warps')}"
    if vary_fwd:
        detail = f"f{rec.get('fwd_block_q')}/{rec.get('fwd_block_k')} {detail}"
    status = "ok" if t.best is not None else "screened"
    return Cell(status, float(rec["median_ms"]), detail, t.failed, t.total, t.pruned, t.screened)


def problem_title(key: ProblemKey, with_tag: bool = False) -> str:
    """``bf16 D=64 S=2048 B=4 H=8 fwd``: a problem's name above its plot (``causal``, ``kv2``,
    ``[jax]`` appended where the problem has them: ``ProblemKey.variant``)."""
    text = (
        f"{_SHORT_DTYPE.get(key.dtype, key.dtype)} D={key.head_dim} S={key.seq} "
        f"B={key.batch} H={key.heads} {key.mode}{key.variant()}"
    )
    return f"{text} [{key.tag or 'no tag'}]" if with_tag else text
