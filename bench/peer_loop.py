"""A small local sweep, ``tilesweep run`` with a fresh sweep directory, against the serial loop a
user writes over the same configs of the same kernel, whole process against whole process.

The sweep: jax's stock Pallas attention (``kernel.impl: jax``) in interpret mode, batch 1, 2
heads, seq 256, head_dim 64, ``repeats`` 5 with one call per sample (``timing.max_inner: 1``):
9 fwd configs at bfloat16 (block_q x block_k in 32/64/128), 4 fwd_bwd configs at float32
(bwd_outer x bwd_inner in 32/64). tilesweep also measures ``auto`` (the stock kernel's own
defaults, what an untuned call runs) and checks every config against the reference.

The loop (``user_loop``) is what a competent user writes with the same libraries, and the
fastest way they offer: inputs drawn once by numpy (``jax.random`` would compile its generator
first, over a CPU second), then for each config ``jax.jit``, ``lower``,
``compile``, one warm-up call, 5 timed calls, the median kept; results written to a JSON file.
It imports jax's ``mha`` itself, nothing of tilesweep. ``auto`` is counted on both sides: the
loop times the untuned call (``mha`` without block sizes or warps) as its last config, so both
measure the same 10 (fwd) or 5 (fwd_bwd) kernels. The loop checks nothing; tilesweep's check
against the reference (one jitted reference per shape, one checked call per config) stays on
its side of the ratio, as does its bookkeeping (partials, marker, merge, report).

Each run is a fresh process (``python -m orchestrator run`` as the user types it, or the loop
as ``python -m bench.peer_loop --child loop``) in a fresh directory; its CPU seconds are its
whole process tree's (user + system, ``RUSAGE_CHILDREN``: every worker and compile process it
started and reaped). Pairs alternate which side goes first (a shared machine's load drifts);
each figure is the median of the per-pair ratios::

    run_vs_loop_cpu_fwd=X        tilesweep's CPU seconds over the loop's, fwd
    run_vs_loop_cpu_fwd_bwd=X    the same, fwd_bwd
    run_vs_loop_wall_fwd=X       wall seconds, fwd (moves with the machine's load)
    run_vs_loop_wall_fwd_bwd=X

and, as ``#`` comments, each pair's seconds, the load average, and the ratio against a loop that
skips ``auto`` (the loop reports the CPU seconds its ``auto`` took).

What the figures leave out: interpret mode on this machine's CPUs, where a compile is XLA
compiling the interpreted kernel (most of both sides' time) and a call runs on the CPU; on a
GPU the compiles (Triton, ptxas) and the calls have other costs. One shape only, so the
once-per-sweep costs (interpreter and jax start-up, the reference, the merge) weigh the most.

Run: ``.venv/bin/python -m bench.peer_loop [--runs 5] [--only fwd,fwd_bwd] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SHAPE: dict[str, Any] = {"batch": 1, "heads": 2, "seq_lens": [256], "head_dims": [64], "repeats": 5}
CASES: dict[str, dict[str, Any]] = {
    "fwd": {
        "dtypes": ["bfloat16"],
        "modes": ["fwd"],
        "fwd_block_q": [32, 64, 128],
        "fwd_block_k": [32, 64, 128],
        "fwd_stages": [2],
        "fwd_warps": [4],
    },
    "fwd_bwd": {
        "dtypes": ["float32"],
        "modes": ["fwd_bwd"],
        "bwd_outer": [32, 64],
        "bwd_inner": [32, 64],
        "bwd_stages": [2],
        "bwd_warps": [4],
    },
}


def spec_data(case: str, output: Path) -> dict[str, Any]:
    """The sweep of ``case`` as a user writes its spec."""
    return {
        "output": str(output),
        **SHAPE,
        **CASES[case],
        "timing": {"max_inner": 1},
        "kernel": {"impl": "jax", "interpret": True},
    }


# ---------------------------------------------------------------------------- the loop (child side)


def loop_configs(case: str) -> list[dict[str, Any] | None]:
    """The configs the loop times, as ``mha`` keyword arguments (None: the untuned call)."""
    c = CASES[case]
    if case == "fwd":
        tuned: list[dict[str, Any] | None] = [
            {"block_q": bq, "block_k": bk, "num_stages": s, "num_warps": w}
            for bq in c["fwd_block_q"]
            for bk in c["fwd_block_k"]
            for s in c["fwd_stages"]
            for w in c["fwd_warps"]
        ]
    else:
        tuned = [
            {
                "block_q": 128,  # the forward's tiles of a fwd_bwd config (the spec's bwd_fwd_config: null)
                "block_k": 128,
                "block_q_dkv": i,
                "block_kv_dkv": o,
                "block_q_dq": o,
                "block_kv_dq": i,
                "num_stages": s,
                "num_warps": w,
            }
            for o in c["bwd_outer"]
            for i in c["bwd_inner"]
            for s in c["bwd_stages"]
            for w in c["bwd_warps"]
        ]
    return [*tuned, None]


def user_loop(case: str, out: Path) -> dict[str, Any]:
    """The serial loop (module docstring); returns the CPU seconds its ``auto`` config took."""
    import functools
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

    dtype = jnp.dtype(CASES[case]["dtypes"][0])
    shape = (SHAPE["batch"], SHAPE["seq_lens"][0], SHAPE["heads"], SHAPE["head_dims"][0])
    rng = np.random.default_rng(0)
    q, k, v, do = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32).astype(dtype)) for _ in range(4))
    scale = 1.0 / SHAPE["head_dims"][0] ** 0.5
    results, auto_cpu = [], 0.0
    for cfg in loop_configs(case):
        cpu0 = time.process_time()
        kwargs: dict[str, Any] = {"sm_scale": scale, "interpret": True}
        if cfg is not None:
            tiles = {key: val for key, val in cfg.items() if key.startswith("block_")}
            kwargs.update(block_sizes=BlockSizes(**tiles), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        attend = functools.partial(mha, segment_ids=None, **kwargs)
        fn: Callable[..., Any] = attend
        args: tuple[Any, ...] = (q, k, v)
        if case == "fwd_bwd":

            def fn(q: Any, k: Any, v: Any, do: Any, attend: Any = attend) -> Any:
                o, vjp = jax.vjp(attend, q, k, v)
                return (o, *vjp(do))

            args = (q, k, v, do)
        compiled = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(compiled(*args))
        times = []
        for _ in range(SHAPE["repeats"]):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times.append((time.perf_counter() - t0) * 1e3)
        results.append({"config": cfg, "median_ms": statistics.median(times)})
        if cfg is None:
            auto_cpu = time.process_time() - cpu0
    out.write_text(json.dumps(results, indent=1))
    return {"auto_cpu_s": auto_cpu}


# ---------------------------------------------------------------------------- driver


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(CPU seconds of the whole process tree, wall seconds, stdout) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stdout


def run_side(case: str, work: Path, code: Path | None = None) -> tuple[float, float]:
    """``tilesweep run`` of ``case``; ``code``: another checkout of tilesweep to run instead."""
    work.mkdir(parents=True)
    spec = work / "spec.json"
    spec.write_text(json.dumps(spec_data(case, work / "results.json")))
    cmd = [sys.executable, "-m", "orchestrator", "run", str(spec), "--sweep-dir", "sweep"]
    cpu, wall, _ = timed(cmd, work, {"PYTHONPATH": str(code)} if code else None)
    if not (work / "results.json").exists():
        raise SystemExit(f"{work}: tilesweep run wrote no document")
    return cpu, wall


def loop_side(case: str, work: Path) -> tuple[float, float, float]:
    work.mkdir(parents=True)
    cmd = [sys.executable, "-m", "bench.peer_loop", "--child", case, "--work", str(work)]
    cpu, wall, out = timed(cmd, ROOT)
    auto = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])["auto_cpu_s"]
    return cpu, wall, auto


def pair(case: str, base: Path, k: int, before: Path | None) -> dict[str, float]:
    """One pair of runs of ``case`` (a triple with ``before``), in the order ``k`` says."""
    row: dict[str, float] = {}
    sides = ["loop", "run", *(["before"] if before else [])]
    for side in sides if k % 2 == 0 else sides[::-1]:
        if side == "run":
            row["run_cpu"], row["run_wall"] = run_side(case, base / f"{case}-{k}-run")
        elif side == "before":
            row["before_cpu"], row["before_wall"] = run_side(case, base / f"{case}-{k}-before", before)
        else:
            row["loop_cpu"], row["loop_wall"], row["auto_cpu"] = loop_side(case, base / f"{case}-{k}-loop")
    was = f"before cpu {row['before_cpu']:.1f} s wall {row['before_wall']:.1f} s; " if before else ""
    print(
        f"# {case} pair {k}: run cpu {row['run_cpu']:.1f} s wall {row['run_wall']:.1f} s; {was}"
        f"loop cpu {row['loop_cpu']:.1f} s wall {row['loop_wall']:.1f} s (auto {row['auto_cpu']:.1f} s cpu); "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--only", default="fwd,fwd_bwd", help="comma-separated: fwd, fwd_bwd")
    p.add_argument("--dir", help="keep the runs here; default: a temp dir, removed")
    p.add_argument("--before", type=Path, help="a checkout of tilesweep before a change: its run joins each pair")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(user_loop(args.child, args.work / "loop-results.json")))
        return
    cases = [c for c in CASES if c in args.only.split(",")]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tilesweep-bench-peer-"))
    print(f"# load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    try:
        rows = {case: [] for case in cases}  # type: dict[str, list[dict[str, float]]]
        for k in range(args.runs):
            for case in cases:
                rows[case].append(pair(case, base, k, args.before))
        for case in cases:
            r = rows[case]
            cpu = statistics.median(x["run_cpu"] / x["loop_cpu"] for x in r)
            no_auto = statistics.median(x["run_cpu"] / (x["loop_cpu"] - x["auto_cpu"]) for x in r)
            print(f"# {case}: against a loop that skips auto, CPU {no_auto:.3f}")
            print(f"run_vs_loop_cpu_{case}={cpu:.3f}")
            print(f"run_vs_loop_wall_{case}={statistics.median(x['run_wall'] / x['loop_wall'] for x in r):.3f}")
            if args.before:
                was_cpu = statistics.median(x["before_cpu"] / x["loop_cpu"] for x in r)
                was_wall = statistics.median(x["before_wall"] / x["loop_wall"] for x in r)
                print(f"# {case} before ({args.before}): CPU {was_cpu:.3f}, wall {was_wall:.3f} of the loop's")
        print(f"# load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
