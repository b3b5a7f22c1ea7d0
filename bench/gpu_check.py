"""One prepared GPU check: the real sweep path on a GPU, side by side with the reference run.

Runs the problems of the reference excerpt (``shared/seed/attention_tiles.sample.json``)
through ``tilesweep run`` (plan -> local executor -> worker -> merge) on this machine's GPU,
with shared-memory pruning OFF so every config is really compiled, then compares per record:

- ``smem_model_exact``: configs the compiler refused for shared memory vs the model's
  prediction (same configs, same byte counts) — the check the CPU cannot do;
- ``median_vs_reference``: median over configs of our median_ms / the reference's;
- ``compile_s`` totals, ``rel_err`` maxima per dtype.

Prints ``name=value`` lines. ``--smoke`` runs a tiny version in interpret mode on a CPU, so
the script itself is tested where there is no GPU. Typical use on a lent GPU machine::

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO.parent / "shared" / "seed" / "attention_tiles.sample.json"
RESULT_KEYS = ("rel_err", "compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "error")
EXTRA_KEYS = ("timer", "pruned", "smem_bytes", "compile_cached", "unit", "attempt", "device")


def problems(doc: dict[str, Any]) -> list[tuple[str, int, int, str]]:
    seen: dict[tuple[str, int, int, str], None] = {}
    for r in doc["results"]:
        seen[(r["dtype"], r["head_dim"], r["seq"], r["mode"])] = None
    return list(seen)


def specs_for(doc: dict[str, Any], smoke: bool) -> list[dict[str, Any]]:
    """One spec per (dtype, head_dim, seq) of the excerpt, with the modes it has."""
    base = {k: v for k, v in doc["config"].items() if k != "output"}
    groups: dict[tuple[str, int, int], list[str]] = {}
    for dtype, d, s, mode in problems(doc):
        groups.setdefault((dtype, d, s), []).append(mode)
    out = []
    for (dtype, d, s), modes in groups.items():
        spec = {**base, "dtypes": [dtype], "head_dims": [d], "seq_lens": [s], "modes": modes, "append": False,
                "kernel": {"interpret": "auto", "prune_smem": "off"}, "sharding": {"units": 1}}
        if smoke:  # tiny and interpreted: checks the script, not the GPU
            spec.update(head_dims=[16], seq_lens=[64], batch=1, heads=1, repeats=2,
                        fwd_block_q=[32], fwd_block_k=[32, 64], fwd_stages=[2], fwd_warps=[4],
                        bwd_outer=[32], bwd_inner=[16], bwd_stages=[2], bwd_warps=[4],
                        timing={"target_ms": 1, "max_inner": 2, "warmup": 0})
        out.append(spec)
    return out


def key(rec: dict[str, Any]) -> tuple:
    return tuple((k, v) for k, v in rec.items() if k not in RESULT_KEYS + EXTRA_KEYS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check"))
    ap.add_argument("--sample", type=Path, default=SAMPLE)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode (no GPU needed)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    doc = json.loads(args.sample.read_text())
    ref = {key(r): r for r in doc["results"]}
    ours: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, spec in enumerate(specs_for(doc, args.smoke)):
        spec["output"] = str(args.out / f"results-{i}.json")
        path = args.out / f"spec-{i}.json"
        path.write_text(json.dumps(spec, indent=1))
        cmd = [sys.executable, "-m", "orchestrator", "run", str(path), "--sweep-dir", str(args.out / f"sweep-{i}")]
        print("running:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True)
        print(proc.stdout[-4000:], proc.stderr[-2000:], flush=True)
        if proc.returncode not in (0, 1):
            print(f"gpu_check: sweep {i} failed with exit code {proc.returncode}", file=sys.stderr)
            return 1
        ours += json.loads(Path(spec["output"]).read_text())["results"]
    wall = time.perf_counter() - t0

    from kernels import smem

    limit = doc["config"]["smem_limit_bytes"]
    smem_agree = smem_total = 0
    ratios, ours_compile, ref_compile = [], 0.0, 0.0
    err_max: dict[str, float] = {}
    for r in ours:
        cfg = {k: v for k, v in r.items() if k in ("block_q", "block_k", "bwd_outer", "bwd_inner", "num_stages")}
        if r["mode"] == "fwd_bwd" and r["config"] == "forced":
            cfg["block_q"], cfg["block_k"] = r["fwd_block_q"], r["fwd_block_k"]
        if r["config"] == "forced":
            over = smem.first_over(smem.predict_bytes(r["mode"], r["dtype"], r["head_dim"], seq=r["seq"], **cfg), limit)
            failed_smem = "error" in r and "Shared memory" in r["error"]
            smem_total += 1
            smem_agree += (over is None and not failed_smem) or (
                over is not None and failed_smem and f"requested {over[1]}," in r["error"])
        if "error" not in r:
            err_max[r["dtype"]] = max(err_max.get(r["dtype"], 0.0), r["rel_err"])
        other = ref.get(key(r))
        if other is None or "error" in r or "error" in other:
            continue
        ratios.append(r["median_ms"] / other["median_ms"])
        ours_compile += r["compile_s"]
        ref_compile += other["compile_s"]
    print(f"gpu_check_records={len(ours)}")
    print(f"gpu_check_wall_s={wall:.1f}")
    print(f"smem_model_exact={smem_agree}/{smem_total}")
    for dtype, e in sorted(err_max.items()):
        print(f"rel_err_max_{dtype}={e:.3g}")
    if ratios:
        print(f"compared_with_reference={len(ratios)}")
        print(f"compile_s_vs_reference={ours_compile / ref_compile:.3f}")
        print(f"median_vs_reference={statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
