"""Planner figures: pruning and cost model on the reference run, unit balance, planning at scale.

Balance is slowest unit / mean unit, judged with the reference run's own measurements
(cost of a record = compile_s + (warmup + probe + check + repeats * inner) * median_ms)
plus the modelled per-shape setup of each unit. Only an excerpt of the reference run ships
with the repo (``tests/data``: 159 of its 832 records, three problems: bfloat16 d64 s2048 fwd
and fwd_bwd, float32 d128 s2048 fwd), and the cost model's constants (compile: base, per-MMA,
spill threshold; throughput per dtype) were set on that same excerpt, so judging the shipped
model on it is judging it on what it was fitted to. Hence:

- the excerpt is split in two halves, deterministically: each problem's items sorted by item
  id (a hash of the identity, blind to cost) and dealt alternately, the 1st, 3rd, ... to half
  A, the 2nd, 4th, ... to half B; the failed records (no cost) are dealt like the others;
- the model's excerpt constants are set again on half A alone (compile constants by least
  squares of log compile_s over a grid, throughput per dtype as the median TFLOP/s of half A's
  records) and ``heldout`` judges the plans made with that model on half B, whose measurements
  the fit never saw. That is honest because the planner's figure on half B is then what it
  would be on a new sweep of configs the model was not tuned on; ``heldout_swapped`` fits on
  B and judges on A, to show how much the figure depends on the deal, and ``insample`` judges
  the shipped model on half B, to show how much fitting on the judged data flatters it.
  What it leaves out: both halves hold every problem, so this is the model's error on unseen
  configs of seen problems, not on unseen problems (``perturbed`` stands in for that), and
  half B is small (78 items, 5-10 per unit);
- ``full``: the whole reference plan; truth is the measurement where the excerpt has one
  and the shipped model elsewhere (so for 80% of items the model judges itself, and for the
  rest it is in-sample): a figure about many items per unit, not about the model's accuracy;
- ``perturbed``: the whole plan judged against the model times a random error per class
  (dtype x head_dim x mode, log-sd 0.15, about the model's leave-one-class-out error on the
  excerpt) and per item (log-sd 0.15); the median and 90th percentile of 40 draws.

Each view is printed beside contiguous chunks in plan order. ``model`` plans with the cost
model alone; ``costs`` plans with the judged costs themselves (what ``--costs RESULTS.json``
gives when the document covers the plan: an oracle's best). Then a 1,000,000-item spec is
expanded and sharded (median of 3) and its memory measured.

Run: ``.venv/bin/python -m bench.plan [--seed-doc PATH]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

from orchestrator.planning import RUN, WorkItem, costs, expand, plan, shard
from orchestrator.spec import records
from orchestrator.spec.model import SweepSpec
from orchestrator.store import document

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DOC = REPO / "tests" / "data" / "attention_tiles.sample.json"  # the excerpt, as shipped
REFERENCE_COMPILE_S = 427.0  # the full reference run's compile_s, summed (facts file)
STRATEGIES = ("shape", "balanced")


def ratio(loads: list[float]) -> float:
    return max(loads) / statistics.mean(loads)


def loads(groups: list[list[WorkItem]], truth: dict[int, float], setups: dict[tuple, float]) -> list[float]:
    return [sum(truth[it.index] for it in g) + sum(setups[sh] for sh in {it.shape for it in g}) for g in groups]


def contiguous(items: list[WorkItem], n: int) -> list[list[WorkItem]]:
    return [items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)]


def units_of(
    items: list[WorkItem], n: int, plan_costs: list[float], setups: dict[tuple, float], strategy: str
) -> list[list[WorkItem]]:
    return [u.items for u in shard(items, n, costs=plan_costs, setups=setups, strategy=strategy)]


def balance(
    label: str, items: list[WorkItem], model: dict[int, float], truth: dict[int, float], setups: dict[tuple, float]
) -> None:
    for n in (8, 16):
        figures = {}
        for strategy in STRATEGIES:
            units = units_of(items, n, [model[it.index] for it in items], setups, strategy)
            figures[f"model_{strategy}"] = ratio(loads(units, truth, setups))
        oracle = units_of(items, n, [truth[it.index] for it in items], setups, "shape")
        figures["costs"] = ratio(loads(oracle, truth, setups))
        figures["contiguous"] = ratio(loads(contiguous(items, n), truth, setups))
        print(f"balance_{label}_units{n}: " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()))


# ---------------------------------------------------------------------------- held-out judgement


def halves(items: list[WorkItem]) -> tuple[list[WorkItem], list[WorkItem]]:
    """Each problem's items sorted by item id, dealt alternately to half A and half B."""
    problems: dict[tuple, list[WorkItem]] = {}
    for it in items:
        problems.setdefault(records.problem_key(it.record_fields()), []).append(it)
    a: list[WorkItem] = []
    b: list[WorkItem] = []
    for group in problems.values():
        for k, it in enumerate(sorted(group, key=lambda it: it.id)):
            (a if k % 2 == 0 else b).append(it)
    return sorted(a, key=lambda it: it.index), sorted(b, key=lambda it: it.index)


def _geometric(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (k / (n - 1)) for k in range(n)]


def _mma_part(it: WorkItem, spec: SweepSpec, spill_regs: float) -> float:
    """The compile model's per-MMA term of ``it`` with a per-MMA cost of 1 s."""
    cfg = (
        costs.auto_estimate(it.mode, it.dtype, it.head_dim, it.seq, spec.smem_limit_bytes)
        if it.config == "auto"
        else it.kernel_config()
    )
    unit = dataclasses.replace(costs.DEFAULT, compile_base_s=0.0, compile_per_mma_s=1.0, spill_regs=spill_regs)
    return costs.compile_estimate(it.mode, it.dtype, it.head_dim, it.seq, cfg or {}, unit)


def _log_rms(model: list[float], truth: list[float]) -> float:
    return math.sqrt(statistics.mean((math.log(m) - math.log(t)) ** 2 for m, t in zip(model, truth, strict=True)))


def fit(items: list[WorkItem], recs: dict[int, dict[str, Any]], spec: SweepSpec) -> costs.Assumptions:
    """The model's excerpt constants set again on ``items`` only: the three compile constants
    by least squares of log compile_s over a grid, TFLOP/s per dtype as the median of records."""
    runs = [it for it in items if it.kind == RUN and "compile_s" in recs.get(it.index, {})]
    truth = [recs[it.index]["compile_s"] for it in runs]
    best = (math.inf, 0.0, 0.0, 0.0)
    for spill in (64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024):
        mma = [_mma_part(it, spec, spill) for it in runs]
        for base in _geometric(0.02, 1.0, 40):
            for per in _geometric(1e-5, 1e-2, 60):
                err = _log_rms([base + per * m for m in mma], truth)
                if err < best[0]:
                    best = (err, base, per, float(spill))
    tflops = dict(costs.DEFAULT.tflops)
    for dtype in {it.dtype for it in runs}:
        tflops[dtype] = statistics.median(
            costs.flops(it.mode, it.batch, it.heads, it.seq, it.head_dim) / recs[it.index]["median_ms"] / 1e9
            for it in runs
            if it.dtype == dtype
        )
    return dataclasses.replace(
        costs.DEFAULT,
        compile_base_s=best[1],
        compile_per_mma_s=best[2],
        spill_regs=best[3],
        tflops=tuple(sorted(tflops.items())),
    )


def compile_error(
    items: list[WorkItem], recs: dict[int, dict[str, Any]], spec: SweepSpec, a: costs.Assumptions
) -> float:
    """Log rms error of the compile model with ``a`` on the measured items of ``items``."""
    runs = [it for it in items if it.kind == RUN and "compile_s" in recs.get(it.index, {})]
    model = [a.compile_base_s + a.compile_per_mma_s * _mma_part(it, spec, a.spill_regs) for it in runs]
    return _log_rms(model, [recs[it.index]["compile_s"] for it in runs])


def heldout(
    excerpt: list[WorkItem],
    recs: dict[int, dict[str, Any]],
    truth: dict[int, float],
    spec: SweepSpec,
    setups: dict[tuple, float],
) -> None:
    """Fit on one half, judge balance on the other (see the module docstring)."""
    half_a, half_b = halves(excerpt)
    print(f"halves: A={len(half_a)} items B={len(half_b)} items (each problem's items by id, alternately)")
    shipped = costs.DEFAULT
    for label, fitted_on, judged in (("heldout", half_a, half_b), ("heldout_swapped", half_b, half_a)):
        a = fit(fitted_on, recs, spec)
        tflops = " ".join(f"tflops_{k}={v:.0f}" for k, v in a.tflops)
        print(
            f"model_fit_{label}: base_s={a.compile_base_s:.3f} per_mma_s={a.compile_per_mma_s:.2e} "
            f"spill_regs={a.spill_regs:.0f} {tflops} "
            f"compile_log_rms_fitted={compile_error(fitted_on, recs, spec, a):.3f} "
            f"compile_log_rms_judged={compile_error(judged, recs, spec, a):.3f} "
            f"shipped_compile_log_rms_judged={compile_error(judged, recs, spec, shipped):.3f}"
        )
        model_list, _ = costs.item_costs(judged, spec, a=a)
        balance(label, judged, {it.index: c for it, c in zip(judged, model_list, strict=True)}, truth, setups)
    model_list, _ = costs.item_costs(half_b, spec)
    balance("insample", half_b, {it.index: c for it, c in zip(half_b, model_list, strict=True)}, truth, setups)


def perturbed(items: list[WorkItem], model: dict[int, float], setups: dict[tuple, float], draws: int = 40) -> None:
    rng = random.Random(0)
    truths = []
    for _ in range(draws):
        cls: dict[tuple, float] = {}
        truth = {}
        for it in items:
            f = cls.setdefault((it.dtype, it.head_dim, it.mode), math.exp(rng.gauss(0, 0.15)))
            truth[it.index] = model[it.index] * f * math.exp(rng.gauss(0, 0.15))
        truths.append(truth)
    for n in (8, 16):
        figures = {}
        for strategy in STRATEGIES:
            units = units_of(items, n, [model[it.index] for it in items], setups, strategy)
            r = sorted(ratio(loads(units, t, setups)) for t in truths)
            figures[f"model_{strategy}_median"] = r[len(r) // 2]
            figures[f"model_{strategy}_p90"] = r[int(len(r) * 0.9)]
            figures[f"setups_per_unit_{strategy}"] = statistics.mean(len({it.shape for it in u}) for u in units)
        r = sorted(ratio(loads(contiguous(items, n), t, setups)) for t in truths)
        figures["contiguous_median"] = r[len(r) // 2]
        print(
            f"balance_perturbed_units{n}: "
            + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
        )


def reference_figures(doc_path: Path) -> None:
    doc = json.loads(doc_path.read_text())
    spec = SweepSpec(**doc["config"])
    table = document.load_costs(doc_path)
    items = expand(spec)
    model_list, _ = costs.item_costs(items, spec)
    model = {it.index: model_list[it.index] for it in items}
    setups = {it.shape: costs.setup_estimate(it.shape, spec.modes) for it in items}
    print(f"reference_items={len(items)} reference_pruned={sum(it.kind != RUN for it in items)} (the run failed 72)")
    compile_total = 0.0
    for it in items:
        if it.kind == RUN:
            # an item's own config; kernel_config is None for auto: then the one auto picks
            cfg = it.kernel_config() or costs.auto_estimate(
                it.mode, it.dtype, it.head_dim, it.seq, spec.smem_limit_bytes
            )
            compile_total += costs.compile_estimate(it.mode, it.dtype, it.head_dim, it.seq, cfg)
    print(f"model_compile_total_s={compile_total:.0f} reference_compile_total_s={REFERENCE_COMPILE_S:.0f}")

    by_key = {records.record_key(r): r for r in doc["results"]}
    excerpt = [it for it in items if records.record_key(it.record_fields()) in by_key]
    recs = {it.index: by_key[records.record_key(it.record_fields())] for it in excerpt}
    measured = {it.index: m for it in items if (m := table.get(it.record_fields())) is not None}
    floor = costs.DEFAULT.item_floor_s
    truth_excerpt = {it.index: measured.get(it.index, floor) for it in excerpt}
    print(f"excerpt_items={len(excerpt)} measured={sum(it.index in measured for it in excerpt)}")
    heldout(excerpt, recs, truth_excerpt, spec, setups)
    truth_full = {it.index: measured.get(it.index, model[it.index]) for it in items}
    balance("full", items, model, truth_full, setups)
    perturbed(items, model, setups)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def scale_figures(repeat: int) -> None:
    spec = SweepSpec(
        dtypes=["bfloat16", "float32"],
        head_dims=[16, 32, 48, 64, 80, 96, 112, 128],
        seq_lens=[128 * k for k in range(1, 602)],
        batch=2,
        heads=4,
    )
    times = []
    for k in range(repeat):
        before = rss_bytes()
        start = time.perf_counter()
        items, units = plan(spec, 64)
        times.append(time.perf_counter() - start)
        if k == 0:
            grown = rss_bytes() - before
            print(f"plan_1m_items={len(items)} units={len(units)} rss_bytes_per_item={grown / len(items):.0f}")
        del items, units
    print(f"plan_1m_items_s={statistics.median(times):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-doc", type=Path, default=DEFAULT_DOC, help="reference results (excerpt)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.seed_doc.exists():
        reference_figures(args.seed_doc)
    else:
        print(f"# {args.seed_doc} not found: reference figures skipped")
    scale_figures(args.repeat)


if __name__ == "__main__":
    main()
