"""The worker against the naive loop, on this machine's CPUs (Pallas interpret mode).

The unit: 28 configs of the reference fwd grid (auto + block_q x block_k x stages 1-3, 4 warps)
at float32, head_dim 64, seq 256, batch 1, heads 2, repeats 5, 50 ms samples, with
``smem_limit_bytes`` 100000 so the shared-memory model prunes 7 of them (25%).

Variants, each in a fresh process (no jax state carried over), interleaved per round:

- ``naive``: the loop a competent user writes with the same libraries: inputs and the jitted
  reference made once per shape, then one config after another: build, compile, check against
  the reference, time with the same timer and settings. No pruning (a config the model would
  prune is compiled, then given up, as on a GPU where it fails on shared memory), no
  compilation cache, serial compile.
- ``nocache``: ``jobs.worker.run_unit`` with ``compile.cache_dir: "off"``: pruning, inputs and
  references once per shape, a compile pool of all CPUs. The headline: on a GPU every config
  is its own program, so a cold persistent cache saves nothing within one unit.
- ``full``: the same with the default persistent cache (cold). In interpret mode stages and
  warps do not change the program, so this run loads 2 of 3 stage variants from its own
  cache, a sharing a GPU would not have: its figure flatters the worker.
- ``warm``: ``full`` again in a new sweep directory using the cold run's cache.
- ``ahead``: ``nocache`` with ``compile.mode: processes``, one compile process per CPU, so the
  worker compiles windows of configs ahead of the one it times.

Also measured: the share of a compile's wall time in which another Python thread is never
kept waiting for more than 20 ms (``python_runs_during_compile``: jax releases the GIL
while XLA compiles, and Python code hands it over every 5 ms), and how much
a compile running beside the timing loop perturbs the timed median
(``timing_overlap_ratio``, median with two compile threads busy / alone), the reason the
worker never overlaps them.

Fairness: the unit's ``auto`` (the first config it times) runs the same program as one of its
forced configs (128/128, one stage, 4 warps: what ``kernels.config.auto_config`` resolves to
at this limit), timed later. ``auto_vs_forced_same`` is auto's median over that config's in the
``ahead`` unit (``auto_vs_forced_same_serial``: in ``nocache``, one compile at a time); near 1
says no compile ahead landed on the config timed first (``jobs.compile_pool``: why timing never
overlaps a compile).

Prints medians over rounds: first the headline ``worker_nocache_vs_naive`` (nocache / naive wall
time), then ``worker_cached_vs_naive`` (full / naive, flattered as said above) and
``warm_cache_compile_ratio`` (summed compile_s, warm / cold).

What the figures leave out: everything is Pallas interpret mode on this machine's CPUs, so a
"compile" is XLA compiling the interpreted kernel and a "call" runs it on the CPU; on a GPU,
compiles (Triton, ptxas) and calls have other costs and proportions, and the share the compile
pool saves depends on the node's cores. The unit is small (one shape), so the once-per-unit
costs (jax start-up, inputs and reference) weigh more than in a unit of many shapes. Both
clocks start with jax and the kernels imported; the worker's span also holds its bookkeeping
(a fsynced partial line per config, header, marker), which the naive loop does not do.

Run: ``.venv/bin/python -m bench.worker [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.children import add_child_arguments, report, run_child

REPO = Path(__file__).resolve().parent.parent

SPEC: dict[str, Any] = {
    "dtypes": ["float32"],
    "head_dims": [64],
    "seq_lens": [256],
    "modes": ["fwd"],
    "batch": 1,
    "heads": 2,
    "repeats": 5,
    "tag": "bench",
    "fwd_block_q": [32, 64, 128],
    "fwd_block_k": [32, 64, 128],
    "fwd_stages": [1, 2, 3],
    "fwd_warps": [4],
    "smem_limit_bytes": 100000,
    "timing": {"target_ms": 50, "max_inner": 200, "warmup": 1},
    "sharding": {"units": 1},
}


# ---------------------------------------------------------------------------- variants (child side)


def run_worker(work: Path, name: str, compile_settings: dict[str, Any]) -> dict[str, Any]:
    from jobs.worker import run_unit
    from orchestrator.control.sweeps import prepare_sweep

    spec_path = work / f"{name}.json"
    spec_data = {**SPEC, "output": str(work / f"{name}-results.json"), "compile": compile_settings}
    spec_path.write_text(json.dumps(spec_data))
    sd, unit_ids, _ = prepare_sweep(str(spec_path), str(work / name), None, None)
    import jax  # noqa: F401 - imported before the clock starts, as in the naive loop

    from kernels import attention  # noqa: F401

    start = time.perf_counter()
    summary = run_unit(str(sd.root), unit_ids[0])
    wall = time.perf_counter() - start
    recs = [
        json.loads(line)["record"]
        for line in sd.partial_path(unit_ids[0]).read_text().splitlines()
        if '"record"' in line
    ]
    auto_ms, same_ms = auto_and_same(recs)
    return {
        "wall_s": wall,
        "compile_s": sum(r.get("compile_s", 0.0) for r in recs),
        "cache_hits": sum(bool(r.get("compile_cached")) for r in recs),
        "records": len(recs),
        "pruned": sum(bool(r.get("pruned")) for r in recs),
        "workers": summary["compile_workers"],
        "auto_ms": auto_ms,
        "same_ms": same_ms,
    }


def auto_and_same(recs: list[dict[str, Any]]) -> tuple[float, float]:
    """The medians of the unit's ``auto`` record and of the forced record of the config auto
    resolves to (``kernels.config.auto_config``; its warps the library default): one program,
    timed first and later in the same unit."""
    from kernels.config import auto_config, default_num_warps

    cfg = auto_config(
        mode="fwd",
        dtype=SPEC["dtypes"][0],
        head_dim=SPEC["head_dims"][0],
        seq=SPEC["seq_lens"][0],
        smem_limit_bytes=SPEC["smem_limit_bytes"],
    )
    same = {
        "block_q": cfg.block_q,
        "block_k": cfg.block_k,
        "num_stages": cfg.num_stages,
        "num_warps": cfg.num_warps or default_num_warps(SPEC["head_dims"][0]),
    }
    auto = next(r for r in recs if r["config"] == "auto")
    forced = next(r for r in recs if r["config"] != "auto" and all(r[k] == v for k, v in same.items()))
    return auto["median_ms"], forced["median_ms"]


def run_naive(work: Path) -> dict[str, Any]:
    import jax

    from jobs import compile_cache, measure
    from kernels import attention, timing
    from orchestrator.planning import RUN, expand
    from orchestrator.spec.model import SweepSpec

    spec = SweepSpec(**SPEC)
    compile_total = 0.0
    inputs: dict[tuple, tuple] = {}  # shape -> inputs, made once per shape
    refs: dict[tuple, Any] = {}  # (shape, mode) -> reference outputs, computed once each
    with compile_cache.persistent_cache(None):
        start = time.perf_counter()
        for it in expand(spec):
            if it.shape not in inputs:
                inputs[it.shape] = attention.make_inputs(
                    batch=it.batch,
                    seq=it.seq,
                    heads=it.heads,
                    head_dim=it.head_dim,
                    dtype=it.dtype,
                    seed=spec.timing.seed,
                )
            args = inputs[it.shape]
            if (it.shape, it.mode) not in refs:
                refs[it.shape, it.mode] = jax.block_until_ready(jax.jit(attention.build_reference(it.mode))(*args))
            fn = attention.build(it.mode, measure.kernel_config(it, spec), interpret=measure.interpret_flag(spec))
            compiled, compile_s = timing.compile_fn(fn, args)
            compile_total += compile_s
            if it.kind != RUN:
                continue  # on a GPU this compile fails on shared memory: nothing to time
            attention.rel_err(jax.block_until_ready(compiled(*args)), refs[it.shape, it.mode])
            timing.measure(
                compiled,
                args,
                repeats=spec.repeats,
                target_ms=spec.timing.target_ms,
                max_inner=spec.timing.max_inner,
                warmup=spec.timing.warmup,
            )
        wall = time.perf_counter() - start
    return {"wall_s": wall, "compile_s": compile_total}


def run_overlap(work: Path) -> dict[str, Any]:
    """Median of a timed config alone, then while two threads keep compiling others."""
    from jobs import compile_cache, measure
    from kernels import timing
    from orchestrator.planning import RUN, expand
    from orchestrator.spec.model import SweepSpec

    spec = SweepSpec(**SPEC)
    items = [it for it in expand(spec) if it.kind == RUN]
    ctx = measure.ShapeContext.make(items[0], spec)
    exe = measure.compile_item(items[0], spec).executable

    def median() -> float:
        return timing.measure(
            exe,
            ctx.args,
            repeats=spec.repeats,
            target_ms=spec.timing.target_ms,
            max_inner=spec.timing.max_inner,
            warmup=1,
        ).median_ms

    alone = [median() for _ in range(3)]
    stop = threading.Event()

    def compile_forever() -> None:
        k = 1
        while not stop.is_set():
            measure.compile_item(items[k % len(items)], spec)
            k += 1

    with compile_cache.persistent_cache(None):
        py_runs = _python_runs_while(lambda: [measure.compile_item(it, spec) for it in items[1:4]])
        threads = [threading.Thread(target=compile_forever) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        beside = [median() for _ in range(3)]
        stop.set()
        for t in threads:
            t.join()
    return {"alone_ms": statistics.median(alone), "beside_ms": statistics.median(beside), "py_runs": py_runs}


def _python_runs_while(work: Callable[[], object]) -> float:
    """Share of ``work``'s wall time in which a pure-Python thread could run (it counts as
    blocked whenever it saw a gap of more than 20 ms between two of its loop turns)."""
    stop = threading.Event()
    blocked = [0.0]

    def spin() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if now - last > 0.02:
                blocked[0] += now - last
            last = now

    spinner = threading.Thread(target=spin)
    spinner.start()
    start = time.perf_counter()
    work()
    wall = time.perf_counter() - start
    stop.set()
    spinner.join()
    return 1.0 - blocked[0] / wall


def child(variant: str, work: Path, extra: str | None) -> None:
    if variant == "naive":
        out = run_naive(work)
    elif variant == "overlap":
        out = run_overlap(work)
    elif variant == "full":
        out = run_worker(work, "full", {})
    elif variant == "nocache":
        out = run_worker(work, "nocache", {"cache_dir": "off"})
    elif variant == "ahead":
        out = run_worker(work, "ahead", {"mode": "processes", "cache_dir": "off"})
    elif variant == "warm":
        out = run_worker(work, "warm", {"cache_dir": extra})
    else:
        raise SystemExit(f"unknown variant {variant}")
    report(out)


# ---------------------------------------------------------------------------- driver


def ratio(rows: dict[str, list[dict[str, Any]]], a: str, b: str, key: str, key_b: str | None = None) -> float:
    """Median over rounds of variant ``a``'s ``key`` over variant ``b``'s ``key_b`` (default:
    ``key``) in the same round."""
    return statistics.median(x[key] / y[key_b or key] for x, y in zip(rows[a], rows[b], strict=True))


def spawn(variant: str, work: Path, extra: str | None = None) -> dict[str, Any]:
    return run_child("bench.worker", variant, work, extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    add_child_arguments(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.work, args.extra)
        return
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in ("naive", "full", "nocache", "warm", "ahead", "overlap")}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="tilesweep-bench-") as tmp:
            work = Path(tmp)
            rows["naive"].append(spawn("naive", work))
            rows["full"].append(spawn("full", work))
            rows["nocache"].append(spawn("nocache", work))
            rows["warm"].append(spawn("warm", work, str(work / "full" / "compile-cache")))
            rows["ahead"].append(spawn("ahead", work))
            rows["overlap"].append(spawn("overlap", work))
        walls = " ".join(f"{v}={rows[v][-1]['wall_s']:.1f}s" for v in ("naive", "nocache", "full", "warm"))
        print(f"# round {r + 1}: {walls}", flush=True)

    def med(variant: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[variant])

    print(f"worker_nocache_vs_naive={ratio(rows, 'nocache', 'naive', 'wall_s'):.2f}")
    full = rows["full"][0]
    print(
        f"unit_configs={full['records']} pruned={full['pruned']} compile_workers={full['workers']} "
        f"rounds={args.rounds} cpus={len(os.sched_getaffinity(0))}"
    )
    print(
        f"naive_s={med('naive', 'wall_s'):.1f} full_s={med('full', 'wall_s'):.1f} "
        f"nocache_s={med('nocache', 'wall_s'):.1f} warm_s={med('warm', 'wall_s'):.1f}"
    )
    print(
        f"compile_s naive={med('naive', 'compile_s'):.1f} full_cold={med('full', 'compile_s'):.1f} "
        f"nocache={med('nocache', 'compile_s'):.1f} warm={med('warm', 'compile_s'):.1f} "
        f"cold_cache_hits={med('full', 'cache_hits'):.0f} warm_cache_hits={med('warm', 'cache_hits'):.0f}"
    )
    overlap = statistics.median(row["beside_ms"] / row["alone_ms"] for row in rows["overlap"])
    py_runs = statistics.median(row["py_runs"] for row in rows["overlap"])
    print(f"python_runs_during_compile={py_runs:.2f} timing_overlap_ratio={overlap:.2f}")
    print(f"worker_cached_vs_naive={ratio(rows, 'full', 'naive', 'wall_s'):.2f}")
    print(f"warm_cache_compile_ratio={ratio(rows, 'warm', 'full', 'compile_s'):.2f}")
    print(
        f"auto_vs_forced_same={ratio(rows, 'ahead', 'ahead', 'auto_ms', 'same_ms'):.2f} "
        f"auto_vs_forced_same_serial={ratio(rows, 'nocache', 'nocache', 'auto_ms', 'same_ms'):.2f} "
        f"ahead_compile_workers={rows['ahead'][0]['workers']} ahead_s={med('ahead', 'wall_s'):.1f}"
    )


if __name__ == "__main__":
    main()
