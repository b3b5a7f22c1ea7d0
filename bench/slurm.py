"""What SLURM dispatch costs and gains on the local cluster: 1 unit vs 2 units of the same work.

Each run plans the same sweep (one shape, ``--configs`` fwd configs whose timing takes ~0.5 s
each, in interpret mode) into 1 or 2 units, and times, as a user would run them, each a new
process: ``tilesweep submit`` then ``tilesweep wait`` (which merges when every unit has
settled). The clock runs from the start of ``submit`` to the end of ``wait``: a merged
document. Runs alternate 1 and 2 units, ``--runs`` of each, each in a fresh sweep directory
(fresh compilation cache). Prints medians, one figure a line::

    slurm_makespan_2_vs_1=X     wall time of 2 units over that of 1 unit (1.0 = no gain)
    slurm_overhead_s=X          wall time minus the slowest unit's own time (its marker's
                                wall_s): sbatch, scheduling, interpreter and jax start in the
                                task, wait's polling, the merge; median over every run

and the per-case figures as ``#`` comments. The machine has 2 real cores for 8 declared CPUs:
two units run side by side, each compiling and timing on one core.

Run: ``.venv/bin/python -m bench.slurm [--runs 3] [--configs 32] [--dir DIR]`` (needs the local
cluster: ``bash slurm/start-local-slurm.sh``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spec_data(configs: int, output: Path) -> dict:
    """One fwd shape with ``configs`` forced configs (plus auto): block_q x block_k x stages x warps."""
    grid = {"fwd_block_q": [16, 32, 64, 128], "fwd_block_k": [16, 32, 64, 128], "fwd_stages": [1, 2, 3, 4],
            "fwd_warps": [4, 8, 16, 32]}
    need, axes = configs, {}
    for name in ("fwd_block_q", "fwd_block_k", "fwd_stages", "fwd_warps"):
        total = 1
        for v in axes.values():
            total *= len(v)
        k = min(len(grid[name]), max(1, -(-need // total)))
        axes[name] = grid[name][:k]
    return {
        "output": str(output), "dtypes": ["float32"], "head_dims": [16], "seq_lens": [256], "modes": ["fwd"],
        "batch": 1, "heads": 1, "repeats": 5, "tag": "bench", **axes,
        "timing": {"target_ms": 100, "max_inner": 100000, "warmup": 0}, "kernel": {"interpret": True},
        "compile": {"workers": 1},
        "executor": {"kind": "slurm", "slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min": 10,
                     "slurm_array_parallelism": 4, "merge_partition": "cpu"},
    }


def cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"tilesweep {' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
    return out


def one_run(base: Path, configs: int, units: int, k: int) -> tuple[float, float]:
    """(seconds from submit to a merged document, slowest unit's own wall time)."""
    folder = base / f"u{units}-{k}"
    folder.mkdir(parents=True)
    spec = folder / "spec.json"
    spec.write_text(json.dumps(spec_data(configs, folder / "results.json")))
    sweep = folder / "sweep"
    t0 = time.perf_counter()
    cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", str(units))
    cli("wait", str(sweep), "--interval", "0.5", "--slurm-interval", "2")
    wall = time.perf_counter() - t0
    markers = [json.loads(p.read_text()) for p in (sweep / "done").glob("*.json")]
    if len(markers) != units or not (folder / "results.json").exists():
        raise SystemExit(f"{sweep}: {len(markers)} of {units} units finished; see its logs")
    return wall, max(m["wall_s"] for m in markers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--configs", type=int, default=32)
    p.add_argument("--dir", help="keep the sweeps here; default: a temp dir, removed")
    args = p.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tilesweep-bench-slurm-"))
    walls: dict[int, list[float]] = {1: [], 2: []}
    overheads: dict[int, list[float]] = {1: [], 2: []}
    try:
        for k in range(args.runs):
            for units in (1, 2):
                wall, slowest = one_run(base, args.configs, units, k)
                walls[units].append(wall)
                overheads[units].append(wall - slowest)
                print(f"# run {k} units={units}: {wall:.1f} s to a merged document, slowest unit {slowest:.1f} s",
                      file=sys.stderr)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    m1, m2 = statistics.median(walls[1]), statistics.median(walls[2])
    print(f"# 1 unit: median {m1:.1f} s, overhead {statistics.median(overheads[1]):.1f} s; "
          f"2 units: median {m2:.1f} s, overhead {statistics.median(overheads[2]):.1f} s")
    print(f"slurm_makespan_2_vs_1={m2 / m1:.3f}")
    print(f"slurm_overhead_s={statistics.median(overheads[1] + overheads[2]):.2f}")


if __name__ == "__main__":
    main()
