"""Pre-flight lowering on this machine's CPUs: how fast it lowers, and how much of a Mosaic GPU
grid it prunes before any GPU time (no GPU needed).

Figures (``name=value`` lines):

- ``lowering_rate_processes``, ``lowering_rate_threads`` (configs lowered per second) and
  ``lowering_procs_vs_threads`` (their ratio): ``jobs.lowering.lower_items``, what
  ``tilesweep plan --lower`` runs, on ``--workers`` lowering processes against as many
  threads of one process (the baseline: jax's lowering is Python and holds the GIL), on the
  same ``--rate-configs`` Mosaic GPU forward configs (float16, B4 H8 S2048 D128, some over
  shared memory, so refusals count as they come), processes first. Process start-up (about
  3.5 s to import jax and attention_mgpu) is inside the processes' time: it is what a user waits for.
- ``mosaic_pruned_share_h100``, ``mosaic_pruned_share_h200``: of the runnable configs a Mosaic
  GPU grid of 100 configs per shape plans (36 fwd: block_q {64, 128, 256} x block_kv {64, 128,
  256} x max_concurrent_steps {2, 3, 4, 5}; 64 fwd_bwd: block_q, block_kv {64, 128},
  compute_wgs_bwd {1, 2}, block_q_dkv, block_kv_dkv, block_q_dq {64, 128}, block_kv_dq 64,
  2 steps), plus each mode's auto, the share pre-flight lowering refuses, for the reference
  shapes (head_dim 64 and 128, seq 2048 and 8192, batch 4, heads 8) in **float16**: the
  reference's dtypes (bfloat16, float32) are not ones jax's attention_mgpu takes, which the
  planner refuses. Per shape and mode the counts are printed too (``mosaic_shape_...``), and
  the shared-memory refusals among all refusals.

What the figures leave out: this is lowering on a CPU for an abstract GPU of that kind; H100
and H200 lower alike here (the same architecture, and jax's CPU verdict assumes the 227 KiB of
shared memory both have), so the two shares are two runs of the same lowering, not a difference
between the GPUs; whether what lowers also compiles and runs is for ``bench/gpu_check.py`` on a
GPU. The shared 2-core machine's load (printed) moves the rates a lot.
Run: ``flock /tmp/tilesweep-bench.lock .venv/bin/python -m bench.lowering [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Any

RATE_GRID = {"block_q": [64, 128], "block_kv": [64, 128, 256], "max_concurrent_steps": [2, 3, 4]}
FWD_GRID = {"block_q": [64, 128, 256], "block_kv": [64, 128, 256], "max_concurrent_steps": [2, 3, 4, 5]}
FWD_BWD_GRID = {
    "block_q": [64, 128],
    "block_kv": [64, 128],
    "max_concurrent_steps": [2],
    "compute_wgs_bwd": [1, 2],
    "block_q_dkv": [64, 128],
    "block_kv_dkv": [64, 128],
    "block_q_dq": [64, 128],
    "block_kv_dq": [64],
}
KINDS = {"h100": "NVIDIA H100", "h200": "NVIDIA H200"}


def spec(device_kind: str, **over: Any) -> Any:
    from orchestrator.spec.model import SweepSpec

    data: dict[str, Any] = {
        "dtypes": ["float16"],
        "head_dims": [64, 128],
        "seq_lens": [2048, 8192],
        "modes": ["fwd", "fwd_bwd"],
        "batch": 4,
        "heads": 8,
        "kernel": {"impl": "mosaic", "device_kind": device_kind},
        "grid": {"fwd": FWD_GRID, "fwd_bwd": FWD_BWD_GRID},
    }
    data.update(over)
    return SweepSpec.model_validate(data)


def lower(s: Any, items: list[Any], mode: str, workers: int) -> tuple[list[Any], float]:
    from jobs.lowering import lower_items

    verdicts: list[Any] = []
    t0 = time.perf_counter()
    lower_items(s, items, on_verdict=verdicts.append, mode=mode, workers=workers)
    return verdicts, time.perf_counter() - t0


def rate(args: argparse.Namespace) -> None:
    """Configs lowered per second: processes, then threads, on the same configs."""
    from orchestrator.planning import RUN, expand

    s = spec(KINDS["h100"], head_dims=[128], seq_lens=[2048], modes=["fwd"], grid={"fwd": RATE_GRID})
    items = [it for it in expand(s) if it.kind == RUN and it.config == "forced"][: args.rate_configs]
    rates = {}
    for mode in ("processes", "threads"):
        verdicts, wall = lower(s, items, mode, args.workers)
        rates[mode] = len(verdicts) / wall
        kinds = Counter(v.verdict for v in verdicts)
        print(f"lowering_{mode}_wall_s={wall:.1f} lowering_{mode}_verdicts={dict(kinds)}", flush=True)
    print(f"lowering_rate_processes={rates['processes']:.2f}")
    print(f"lowering_rate_threads={rates['threads']:.2f}")
    print(f"lowering_procs_vs_threads={rates['processes'] / rates['threads']:.2f}")


def pruned_share(name: str, kind: str, args: argparse.Namespace) -> None:
    """The share of a 100-configs-per-shape Mosaic grid that lowering refuses for one GPU."""
    from orchestrator.planning import INVALID, RUN, expand

    over = {"head_dims": [128], "seq_lens": [2048]} if args.quick else {}
    items = expand(spec(kind, **over))
    runnable = [it for it in items if it.kind == RUN]
    verdicts, wall = lower(spec(kind, **over), runnable, "processes", args.workers)
    by_id = {v.id: v for v in verdicts}
    per: dict[tuple[Any, ...], Counter[str]] = {}
    for it in runnable:
        v = by_id[it.id]
        c = per.setdefault((it.head_dim, it.seq, it.mode), Counter())
        c[v.verdict] += 1
        c["smem"] += v.verdict == "refused" and v.smem_bytes is not None
    for (d, s, mode), c in per.items():
        print(
            f"mosaic_shape_{name}_d{d}_s{s}_{mode}: lowered={c['lowered']} refused={c['refused']} "
            f"(shared memory {c['smem']}) crashed={c['crashed']}"
        )
    refused = sum(c["refused"] for c in per.values())
    smem = sum(c["smem"] for c in per.values())
    n_invalid = sum(it.kind == INVALID for it in items)
    print(f"mosaic_{name}_planned={len(items)} runnable={len(runnable)} invalid_at_plan={n_invalid}")
    print(f"mosaic_{name}_refused={refused} of which shared memory={smem} wall_s={wall:.0f}")
    print(f"mosaic_pruned_share_{name}={refused / len(runnable):.3f}", flush=True)


def main() -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="lowering processes / threads (default 2)")
    ap.add_argument("--rate-configs", type=int, default=12, help="configs of the rate figures (default 12)")
    ap.add_argument("--quick", action="store_true", help="one shape (D128 S2048) for the shares")
    ap.add_argument("--skip-rate", action="store_true")
    ap.add_argument("--skip-share", action="store_true")
    args = ap.parse_args()
    print(f"load_average={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}", flush=True)
    from kernels import mosaic

    try:
        mosaic.check_available()
    except mosaic.MosaicUnavailable as exc:
        print(f"bench.lowering: {exc}", file=sys.stderr)
        return 2
    if not args.skip_rate:
        rate(args)
    if not args.skip_share:
        for name, kind in KINDS.items():
            pruned_share(name, kind, args)
    print(f"load_average_end={os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
