"""Planner figures: pruning and cost model on the reference run, unit balance, planning at scale.

Balance is slowest unit / mean unit, judged with the reference run's own measurements
(cost of a record = compile_s + (warmup + probe + check + repeats * inner) * median_ms)
plus the modelled per-shape setup of each unit. Only an excerpt of the reference run ships
with the repo (159 of its 832 records: bfloat16 d64 s2048 fwd + fwd_bwd, float32 d128
s2048 fwd), so three views are printed, each beside contiguous chunks in plan order:

- ``excerpt``: only the excerpt's items are planned and judged (every cost measured; the 8
  failed records are pruned and cost a record line). This is the honest one, but small:
  10-20 items per unit.
- ``full``: the whole reference plan; truth is the measurement where the excerpt has one
  and the model elsewhere (so for 80% of items the model judges itself).
- ``perturbed``: the whole plan judged against the model times a random error per class
  (dtype x head_dim x mode, log-sd 0.15, about the model's leave-one-class-out error on the
  excerpt) and per item (log-sd 0.15); the median and 90th percentile of 40 draws.

``model`` plans with the cost model alone; ``costs`` plans with the judged costs
themselves (what ``--costs RESULTS.json`` gives when the document covers the plan).
Then a 1,000,000-item spec is expanded and sharded (median of 3) and its memory measured.

Run: ``.venv/bin/python -m bench.plan [--seed-doc PATH]``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path

from orchestrator.spec import records
from orchestrator.store import document
from orchestrator.planning import costs
from orchestrator.planning import RUN, WorkItem, expand, plan, shard
from orchestrator.spec.model import SweepSpec

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DOC = REPO.parent / "shared" / "seed" / "attention_tiles.sample.json"
REFERENCE_COMPILE_S = 427.0  # the full reference run's compile_s, summed (facts file)
STRATEGIES = ("shape", "balanced")


def ratio(loads: list[float]) -> float:
    return max(loads) / statistics.mean(loads)


def loads(groups: list[list[WorkItem]], truth: dict[int, float], setups: dict[tuple, float]) -> list[float]:
    return [sum(truth[it.index] for it in g) + sum(setups[sh] for sh in {it.shape for it in g}) for g in groups]


def contiguous(items: list[WorkItem], n: int) -> list[list[WorkItem]]:
    return [items[i * len(items) // n:(i + 1) * len(items) // n] for i in range(n)]


def units_of(items: list[WorkItem], n: int, plan_costs: list[float], setups: dict, strategy: str) -> list[list[WorkItem]]:
    return [u.items for u in shard(items, n, costs=plan_costs, setups=setups, strategy=strategy)]


def balance(label: str, items: list[WorkItem], model: dict[int, float], truth: dict[int, float],
            setups: dict[tuple, float]) -> None:
    for n in (8, 16):
        figures = {}
        for strategy in STRATEGIES:
            figures[f"model_{strategy}"] = ratio(loads(units_of(items, n, [model[it.index] for it in items], setups, strategy), truth, setups))
        figures["costs"] = ratio(loads(units_of(items, n, [truth[it.index] for it in items], setups, "shape"), truth, setups))
        figures["contiguous"] = ratio(loads(contiguous(items, n), truth, setups))
        print(f"balance_{label}_units{n}: " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()))


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
        print(f"balance_perturbed_units{n}: " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                          for k, v in figures.items()))


def reference_figures(doc_path: Path) -> None:
    import json

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
            cfg = costs.auto_estimate(it.mode, it.dtype, it.head_dim, it.seq, spec.smem_limit_bytes) \
                if it.config == "auto" else it.kernel_config()
            compile_total += costs.compile_estimate(it.mode, it.dtype, it.head_dim, it.seq, cfg)
    print(f"model_compile_total_s={compile_total:.0f} reference_compile_total_s={REFERENCE_COMPILE_S:.0f}")

    keys = {records.record_key(r) for r in doc["results"]}
    excerpt = [it for it in items if records.record_key(it.record_fields()) in keys]
    measured = {it.index: table.get(it.record_fields()) for it in items}
    floor = costs.DEFAULT.item_floor_s
    truth_excerpt = {it.index: measured[it.index] if measured[it.index] is not None else floor for it in excerpt}
    print(f"excerpt_items={len(excerpt)} measured={sum(measured[it.index] is not None for it in excerpt)}")
    balance("excerpt", excerpt, model, truth_excerpt, setups)
    truth_full = {it.index: measured[it.index] if measured[it.index] is not None else model[it.index] for it in items}
    balance("full", items, model, truth_full, setups)
    perturbed(items, model, setups)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def scale_figures(repeat: int) -> None:
    spec = SweepSpec(dtypes=["bfloat16", "float32"], head_dims=[16, 32, 48, 64, 80, 96, 112, 128],
                     seq_lens=[128 * k for k in range(1, 602)], batch=2, heads=4)
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
