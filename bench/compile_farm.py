"""Compile processes against compile threads, on this machine's CPUs (no GPU needed).

Figures (``name=value`` lines; medians over interleaved rounds):

- ``lower_procs_vs_threads``: configs lowered per second on the CUDA lowering path
  (``kernels.lowering.lower_for_cuda``: the Pallas -> Triton lowering for an abstract H100,
  the part of a GPU compile that is Python and holds the GIL), 2 processes / 2 threads, the
  reference shape B4 H8 S2048 D128 bfloat16, 12 fwd configs per round: the median of the
  per-round ratios over ``--lower-rounds`` rounds (threads and processes back to back, which
  goes first alternating), with their min and max: on a shared 2-core machine a round in
  which others take a core cannot show 2 processes' gain. The baseline is what
  ``compile.mode: threads`` does: a 2-thread pool in one process. Also
  ``lower_threads_vs_serial`` (2 threads / 1).
- ``lower_fwd_s``, ``lower_fwd_bwd_s``: CPU seconds of one lowering (thread CPU time, so
  other users of this shared machine do not inflate it), and ``lower_share``: their share of
  the reference run's compile seconds per config (fwd median 0.23 s, fwd_bwd 0.64 s,
  weighted by the reference's 440 fwd and 392 fwd_bwd records).
- ``handoff_serialized_s`` and ``handoff_cache_s``: what the timing process pays per config
  to get an executable a compile process made: loading it serialized
  (``jax.experimental.serialize_executable``, what ``compile.mode: processes`` does), or
  through the persistent cache (lowering again to compute the cache key, then loading),
  on interpret-mode executables of the small shape below. ``handoff_cache_vs_serialized``.
- ``worker_procs_vs_threads`` (``--rounds``): wall time of ``jobs.worker.run_unit`` on an interpret-mode
  unit (13 fwd configs: auto + block_q x block_k x stages 1-2, float32 d64 seq 256, cache
  off, 2 compile workers), threads / processes: above 1, processes are faster. Each run in a
  fresh process; the processes' wall time includes starting the compile processes.
- ``seed_projected_s_*``: a PROJECTION, not a measurement: the reference sweep (427 s of
  compile, 174 s of timed runs, 760 compiled configs) on one GPU with 16 cores. Serial:
  compile + timed. Threads: the lowering cannot overlap itself (GIL), the rest spreads over
  16 threads: max(lowering, compile / 16) + timed. Processes: compile / 16 + timed + the
  serialized hand-over per config. ``processes_overlap``: if compiling could go on while a
  device timer times (not done today: timing never overlaps a compile):
  max(compile / 15, timed + hand-over).

What the figures leave out: the GPU part of a compile (ptxas, XLA's GPU passes) is taken
from the reference's compile_s, not measured; this CPU's lowering speed stands for the GPU
node's; the hand-over of a GPU executable (cubins) may cost more or less than that of an
interpret-mode one; a shared 2-core machine gives 2 processes less than 2 free cores (the
load average is printed). Run: ``.venv/bin/python -m bench.compile_farm [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from bench.children import add_child_arguments, report, run_child

if TYPE_CHECKING:
    from kernels.config import AttentionConfig

REPO = Path(__file__).resolve().parent.parent


class CudaShape(TypedDict):
    """The problem every config here is lowered for (``lower_for_cuda``'s shape keywords)."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    dtype: str


CUDA_SHAPE: CudaShape = {"batch": 4, "seq": 2048, "heads": 8, "head_dim": 128, "dtype": "bfloat16"}
# the reference run (facts: 832 records, 16 problems of 55 fwd or 49 fwd_bwd records)
REF = {
    "compile_s": 427.0,
    "timed_s": 174.0,
    "compiled": 760,
    "fwd": 440,
    "fwd_bwd": 392,
    "fwd_compile_s": 0.23,
    "fwd_bwd_compile_s": 0.64,
}
NODE_CORES = 16
UNIT_SPEC: dict[str, Any] = {
    "dtypes": ["float32"],
    "head_dims": [64],
    "seq_lens": [256],
    "modes": ["fwd"],
    "batch": 1,
    "heads": 2,
    "repeats": 5,
    "tag": "bench",
    "fwd_block_q": [32, 64, 128],
    "fwd_block_k": [32, 64],
    "fwd_stages": [1, 2],
    "fwd_warps": [4],
    "smem_limit_bytes": None,
    "timing": {"target_ms": 20, "max_inner": 50, "warmup": 1},
    "sharding": {"units": 1},
    "kernel": {"interpret": True},
}


# ---------------------------------------------------------------------------- lowering (child side)


def _configs(mode: str, n: int) -> list[AttentionConfig]:
    from kernels.config import AttentionConfig

    if mode == "fwd":
        grid = [(bq, bk, w) for bq in (32, 64, 128) for bk in (32, 64) for w in (4, 8)]
        return [AttentionConfig(block_q=bq, block_k=bk, num_warps=w, num_stages=2) for bq, bk, w in grid][:n]
    grid = [(o, i, w) for o in (32, 64, 128) for i in (16, 32) for w in (4, 8)]
    return [AttentionConfig(bwd_outer=o, bwd_inner=i, num_warps=w, num_stages=2) for o, i, w in grid][:n]


def _lower(args: tuple[str, AttentionConfig]) -> float:
    """Lower one config for CUDA; returns the thread CPU seconds it took."""
    from kernels.lowering import lower_for_cuda

    start = time.thread_time()
    lower_for_cuda(args[0], args[1], **CUDA_SHAPE)
    return time.thread_time() - start


def _warm() -> None:
    _lower(("fwd", _configs("fwd", 1)[0]))


def _rate(pool: Executor, work: list[tuple[str, AttentionConfig]]) -> float:
    start = time.perf_counter()
    list(pool.map(_lower, work))
    return len(work) / (time.perf_counter() - start)


def child_lowering(rounds: int) -> dict[str, Any]:
    _warm()
    fwd = [("fwd", c) for c in _configs("fwd", 12)]
    cpu = {m: statistics.median(_lower((m, c)) for c in _configs(m, 6)) for m in ("fwd", "fwd_bwd")}
    rows: dict[str, list[float]] = {"serial": [], "threads": [], "procs": []}
    with ThreadPoolExecutor(2) as threads, ProcessPoolExecutor(2, get_context("spawn"), initializer=_warm) as procs:
        list(procs.map(_lower, fwd[:2]))  # both processes up and warm
        for r in range(rounds):
            start = time.perf_counter()
            for w in fwd:
                _lower(w)
            rows["serial"].append(len(fwd) / (time.perf_counter() - start))
            for name, pool in sorted({"threads": threads, "procs": procs}.items(), reverse=r % 2 == 1):
                rows[name].append(_rate(pool, fwd))  # which goes first alternates
    ratios = [p / t for p, t in zip(rows["procs"], rows["threads"], strict=True)]
    return {"cpu_s": cpu, **{k: statistics.median(v) for k, v in rows.items()}, "procs_vs_threads": ratios}


# ---------------------------------------------------------------------------- hand-over (child side)


def child_handoff(work: Path) -> dict[str, Any]:
    """Per config: serialized load vs persistent-cache load (lower again + load)."""
    import jax
    from jax.experimental import serialize_executable

    from jobs import compile_cache, measure
    from orchestrator.planning import RUN, expand
    from orchestrator.spec.model import SweepSpec

    work.mkdir(parents=True, exist_ok=True)
    spec = SweepSpec(**{**UNIT_SPEC, "fwd_stages": [2]})
    items = [it for it in expand(spec) if it.kind == RUN][:6]
    with compile_cache.persistent_cache(work / "cache"):
        blobs = [serialize_executable.serialize(measure.compile_item(it, spec).executable) for it in items]
        jax.clear_caches()
        serialized, cache = [], []
        for it, blob in zip(items, blobs, strict=True):
            start = time.perf_counter()
            serialize_executable.deserialize_and_load(*blob)
            serialized.append(time.perf_counter() - start)
            comp = measure.compile_item(it, spec)  # lowers again, then the cache supplies it
            assert comp.cached, "the persistent cache did not supply the executable"
            cache.append(comp.compile_s)
    return {"serialized_s": statistics.median(serialized), "cache_s": statistics.median(cache)}


# ---------------------------------------------------------------------------- the worker (child side)


def child_worker(work: Path, mode: str) -> dict[str, Any]:
    from jobs.worker import run_unit
    from orchestrator.control.sweeps import prepare_sweep

    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / f"{mode}.json"
    compile_settings = {"mode": mode, "workers": 2, "cache_dir": "off"}
    spec_path.write_text(
        json.dumps({**UNIT_SPEC, "output": str(work / f"{mode}.out.json"), "compile": compile_settings})
    )
    sd, (unit,), _ = prepare_sweep(str(spec_path), str(work / mode), None, None)
    start = time.perf_counter()
    summary = run_unit(str(sd.root), unit)
    return {"wall_s": time.perf_counter() - start, **summary}


def child(kind: str, work: Path, arg: str | None) -> None:
    if kind == "lowering":
        out = child_lowering(int(arg or 3))
    elif kind == "handoff":
        out = child_handoff(work)
    else:
        out = child_worker(work, kind)
    report(out)


# ---------------------------------------------------------------------------- driver


def spawn(kind: str, work: Path, arg: str | None = None) -> dict[str, Any]:
    return run_child("bench.compile_farm", kind, work, arg)


def projection(lower_share: float, handoff_s: float) -> dict[str, float]:
    """The reference sweep on one GPU with NODE_CORES cores, threads vs processes (seconds)."""
    compile_s, timed_s, n = REF["compile_s"], REF["timed_s"], REF["compiled"]
    lowering = lower_share * compile_s
    return {
        "serial": compile_s + timed_s,
        "threads": max(lowering, compile_s / NODE_CORES) + timed_s,
        "processes": compile_s / NODE_CORES + timed_s + n * handoff_s,
        "processes_overlap": max(compile_s / (NODE_CORES - 1), timed_s + n * handoff_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="worker rounds (a unit per mode each)")
    parser.add_argument("--lower-rounds", type=int, default=15, help="lowering rounds (12 configs per pool each)")
    add_child_arguments(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.work, args.extra)
        return
    print(
        f"# cpus={len(os.sched_getaffinity(0))} load_average={os.getloadavg()[0]:.1f} rounds={args.rounds} "
        f"lower_rounds={args.lower_rounds}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="tilesweep-bench-farm-") as tmp:
        low = spawn("lowering", Path(tmp), str(args.lower_rounds))
        hand = spawn("handoff", Path(tmp) / "h")
        runs: dict[str, list[dict[str, Any]]] = {"threads": [], "processes": []}
        for r in range(args.rounds):
            for mode in ("threads", "processes"):
                runs[mode].append(spawn(mode, Path(tmp) / f"{mode}{r}"))
            print(
                f"# round {r + 1}: threads={runs['threads'][-1]['wall_s']:.1f}s "
                f"processes={runs['processes'][-1]['wall_s']:.1f}s",
                flush=True,
            )
    cpu = low["cpu_s"]
    share = (REF["fwd"] * cpu["fwd"] + REF["fwd_bwd"] * cpu["fwd_bwd"]) / (
        REF["fwd"] * REF["fwd_compile_s"] + REF["fwd_bwd"] * REF["fwd_bwd_compile_s"]
    )
    print(
        f"lower_serial_per_s={low['serial']:.2f} lower_threads2_per_s={low['threads']:.2f} "
        f"lower_procs2_per_s={low['procs']:.2f}"
    )
    print(f"lower_threads_vs_serial={low['threads'] / low['serial']:.2f}")
    ratios = low["procs_vs_threads"]
    print(f"lower_procs_vs_threads={statistics.median(ratios):.2f}")
    print(f"lower_procs_vs_threads_min={min(ratios):.2f} lower_procs_vs_threads_max={max(ratios):.2f}")
    print(f"lower_fwd_s={cpu['fwd']:.3f} lower_fwd_bwd_s={cpu['fwd_bwd']:.3f} lower_share={share:.2f}")
    print(
        f"handoff_serialized_s={hand['serialized_s']:.3f} handoff_cache_s={hand['cache_s']:.3f} "
        f"handoff_cache_vs_serialized={hand['cache_s'] / hand['serialized_s']:.1f}"
    )
    walls = {m: statistics.median(r["wall_s"] for r in runs[m]) for m in runs}
    compile_walls = {m: statistics.median(r["compile_wall_s"] for r in runs[m]) for m in runs}
    print(
        f"worker_threads_s={walls['threads']:.1f} worker_processes_s={walls['processes']:.1f} "
        f"compile_wall_threads_s={compile_walls['threads']:.1f} "
        f"compile_wall_processes_s={compile_walls['processes']:.1f} "
        f"load_sum_processes_s={statistics.median(r['load_sum_s'] for r in runs['processes']):.2f} "
        f"unit_configs={runs['threads'][0]['done']}"
    )
    pairs = zip(runs["threads"], runs["processes"], strict=True)
    print(f"worker_procs_vs_threads={statistics.median(t['wall_s'] / p['wall_s'] for t, p in pairs):.2f}")
    proj = projection(share, hand["serialized_s"])
    print("# PROJECTION (a model, not a measurement): the reference sweep on one GPU with 16 cores")
    print(" ".join(f"seed_projected_s_{k}={v:.0f}" for k, v in proj.items()))
    print(f"seed_projected_threads_vs_processes={proj['threads'] / proj['processes']:.2f}")


if __name__ == "__main__":
    main()
