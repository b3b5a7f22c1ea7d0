"""One prepared GPU check: the real sweep path on a GPU, side by side with the reference run.

Runs the problems of the reference excerpt (``tests/data/attention_tiles.sample.json``)
through ``tilesweep run`` (plan -> local executor -> worker -> merge) on this machine's GPU,
with shared-memory pruning OFF so every config is really compiled, in up to three passes
that share one compilation cache (so only the first compiles cold):

- ``wall`` (the default measurement: strategy full, wall-clock timer), compared per record
  with the reference: ``smem_model_exact`` (configs the compiler refused for shared memory vs
  the model's prediction, same byte counts: the check the CPU cannot do),
  ``median_vs_reference`` (median over configs of our median_ms / the reference's),
  ``compile_s`` totals, ``rel_err`` maxima per dtype, and whether the L2 was flushed;
- ``device`` (strategy full, ``timing.timer: device``) against ``wall``:
  ``device_vs_wall_pass_median`` (median over configs of the device pass's median / the wall
  pass's), ``device_below_wall_pass_share`` (share of configs whose device median is below
  the wall pass's: dispatch is left out, so on a GPU it should be near 1; these are two runs,
  so profiler overhead and drift count too: the tests check device <= wall on the very same
  calls), ``device_wall_same_best`` (share of problems whose best config is the same);
- ``halving`` (``timing.strategy: halving``, wall timer) against ``wall``:
  ``halving_same_winner`` (share of problems whose best is the full sweep's, or inside its
  q1-q3) and ``halving_timed_ratio`` (seconds spent timing, halving / full, from the workers'
  summaries; the sweeps' wall times are printed too, but the halving pass loads every compile
  from the cache the wall pass filled, so they are not comparable);
- ``processes`` (``compile.mode: processes``, wall timer, its own cold compilation cache, as
  the wall pass's was when it ran) against ``wall`` (compile threads): ``modes_same_records``
  (records equal apart from timings and compile_cached), ``procs_vs_threads_wall`` and
  ``procs_vs_threads_compile_wall`` (threads seconds / processes seconds: above 1, processes
  are faster; the figure that decides the default of ``compile.mode``),
  ``procs_vs_threads_median`` (median of per-config median_ms ratios: the timings must not
  move), and the GPU memory each process held (``processes_gpu_mem_max_mib_per_process``,
  ``processes_gpu_processes_max``: nvidia-smi once a second; compile processes should hold a
  CUDA context and no arrays).
- ``mosaic`` (``bench/gpu_mosaic.py``): jax's Mosaic GPU attention on the excerpt's problems in
  float16 (the one dtype it takes), against our kernel at float16 (``mosaic_vs_triton_*``, best
  median over best median), ``rel_err`` of every Mosaic config, and pre-flight lowering's verdicts
  on this machine's CPUs against what the GPU compile did (``mosaic_lowering_agree``). It is
  written for the jax of the GPU machine too (0.11.2: attention_mgpu's API is the same there as
  in 0.12.0.1 by a diff of the two sources; ``kernels.mosaic`` passes only the ``TuningConfig``
  fields the installed jax has) and reports ``mosaic_available=0`` with the reason, leaving the
  other passes alone, where it cannot run.
- ``tokamax`` (``bench/gpu_tokamax.py``; asked for by name): tokamax's kernels on the excerpt's
  problems, ``rel_err`` of every config, and the best config against what tokamax runs untuned
  (``tokamax_best_vs_own_*``, with whether that is its shipped table's winner).

Prints ``name=value`` lines. ``--smoke`` runs a tiny version in interpret mode on a CPU, so
the script itself is tested where there is no GPU. Typical use on a lent GPU machine::

    PYTHONUNBUFFERED=1 python3 -m bench.gpu_check --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.spec.records import EXTRA_RECORD_FIELDS

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "tests" / "data" / "attention_tiles.sample.json"
RESULT_KEYS = ("rel_err", "compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "error")
EXTRA_KEYS = EXTRA_RECORD_FIELDS  # the record extras (spec.records): not part of what identifies a config
# pass -> its timing settings; the processes pass asks for the wall timer, which a GPU with compile
# processes would not default to, so that its medians compare with the wall pass's
PASSES = {"wall": {}, "device": {"timer": "device"}, "halving": {"strategy": "halving"}, "processes": {"timer": "wall"}}
COMPILE_MODES = {"processes": "processes"}  # pass -> compile.mode (threads otherwise)
# passes with their own sweeps (bench/gpu_mosaic.py, bench/gpu_tokamax.py), run after the others
OWN_PASSES = ("mosaic", "tokamax")


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
        spec = {
            **base,
            "dtypes": [dtype],
            "head_dims": [d],
            "seq_lens": [s],
            "modes": modes,
            "append": False,
            "kernel": {"interpret": "auto", "prune_smem": "off"},
            "sharding": {"units": 1},
        }
        if smoke:  # tiny and interpreted: checks the script, not the GPU
            spec.update(
                head_dims=[16],
                seq_lens=[64],
                batch=1,
                heads=1,
                repeats=2,
                fwd_block_q=[32],
                fwd_block_k=[16, 32, 64],
                fwd_stages=[2],
                fwd_warps=[4],
                bwd_outer=[32],
                bwd_inner=[16, 32],
                bwd_stages=[2],
                bwd_warps=[4],
                timing={"target_ms": 1, "max_inner": 2, "warmup": 0},
            )
        out.append(spec)
    return out


def key(rec: dict[str, Any]) -> tuple:
    return tuple((k, v) for k, v in rec.items() if k not in RESULT_KEYS + EXTRA_KEYS)


def run_pass(name: str, doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Every spec of the excerpt through ``tilesweep run`` with the pass's timing settings:
    its records, the workers' summaries, the documents' measurement blocks, its wall time."""
    out: dict[str, Any] = {"records": [], "markers": [], "measurement": [], "wall_s": 0.0}
    t0 = time.perf_counter()
    mode = COMPILE_MODES.get(name, "threads")
    cache = args.out / ("compile-cache" if mode == "threads" else f"compile-cache-{name}")  # cold, like wall's
    for i, spec in enumerate(specs_for(doc, args.smoke)):
        spec["timing"] = {**spec.get("timing", {}), **PASSES[name]}
        spec["compile"] = {"mode": mode, "cache_dir": str(cache.resolve())}
        spec["output"] = str(args.out / f"{name}-results-{i}.json")
        path = args.out / f"{name}-spec-{i}.json"
        path.write_text(json.dumps(spec, indent=1))
        sweep = args.out / f"{name}-sweep-{i}"
        cmd = [sys.executable, "-m", "orchestrator", "run", str(path), "--sweep-dir", str(sweep)]
        print("running:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True)
        print(proc.stdout[-4000:], proc.stderr[-2000:], flush=True)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"gpu_check: {name} sweep {i} failed with exit code {proc.returncode}")
        merged = json.loads(Path(spec["output"]).read_text())
        out["records"] += merged["results"]
        out["measurement"].append(merged["tilesweep"].get("measurement"))
        out["markers"] += [json.loads(p.read_text()) for p in (sweep / "done").glob("*.json")]
    out["wall_s"] = time.perf_counter() - t0
    return out


class GpuMemory:
    """Samples the GPU memory of every compute process (nvidia-smi) once a second."""

    def __init__(self) -> None:
        self.max_mib: dict[str, int] = {}
        self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if shutil.which("nvidia-smi") else None

    def __enter__(self) -> GpuMemory:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        cmd = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        while not self._stop.wait(1.0):
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
            rows = [line.split(",") for line in out.splitlines() if line.strip()]
            self.max_processes = max(self.max_processes, len(rows))
            for pid, mib in rows:
                if mib.strip().isdigit():
                    self.max_mib[pid.strip()] = max(self.max_mib.get(pid.strip(), 0), int(mib))


def bests(records: list[dict[str, Any]]) -> dict[Any, Any]:
    from orchestrator.analysis.report import best_table
    from orchestrator.store.document import from_obj

    return {s.key: s for s in best_table(from_obj({"device": {}, "config": {}, "results": records}))}


def report_wall(ours: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    """The wall pass against the reference run."""
    from kernels import smem

    ref = {key(r): r for r in doc["results"]}
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
                over is not None and failed_smem and f"requested {over[1]}," in r["error"]
            )
        if "error" not in r:
            err_max[r["dtype"]] = max(err_max.get(r["dtype"], 0.0), r["rel_err"])
        other = ref.get(key(r))
        if other is None or "error" in r or "error" in other:
            continue
        ratios.append(r["median_ms"] / other["median_ms"])
        ours_compile += r["compile_s"]
        ref_compile += other["compile_s"]
    print(f"smem_model_exact={smem_agree}/{smem_total}")
    for dtype, e in sorted(err_max.items()):
        print(f"rel_err_max_{dtype}={e:.3g}")
    if ratios:
        print(f"compared_with_reference={len(ratios)}")
        print(f"compile_s_vs_reference={ours_compile / ref_compile:.3f}")
        print(f"median_vs_reference={statistics.median(ratios):.3f}")


def report_device(wall: dict[str, Any], device: dict[str, Any]) -> None:
    by_key = {key(r): r for r in wall["records"] if "error" not in r}
    pairs = [
        (r["median_ms"], by_key[key(r)]["median_ms"])
        for r in device["records"]
        if "error" not in r and key(r) in by_key
    ]
    print(f"device_timers={sorted({r.get('timer') for r in device['records'] if 'error' not in r})}")
    if pairs:
        print(f"device_vs_wall_pass_median={statistics.median(d / w for d, w in pairs):.3f}")
        print(f"device_below_wall_pass_share={sum(d <= w for d, w in pairs) / len(pairs):.3f}")
    bw, bd = bests(wall["records"]), bests(device["records"])
    same = [bw[k].best_label == bd[k].best_label for k in bw if k in bd and bw[k].best_ms is not None]
    if same:
        print(f"device_wall_same_best={sum(same) / len(same):.3f}")


def report_halving(full: dict[str, Any], halving: dict[str, Any]) -> None:
    bf, bh = bests(full["records"]), bests(halving["records"])
    agree = []
    for k, f in bf.items():
        h = bh.get(k)
        if f.best_ms is None or h is None:
            continue
        inside = h.best_ms is not None and f.best_q1_ms <= h.best_ms <= f.best_q3_ms
        agree.append(h.best_label == f.best_label or inside)
    if agree:
        print(f"halving_same_winner={sum(agree) / len(agree):.3f}")
    timed_h, timed_f = (sum(m.get("timed_s", 0.0) for m in p["markers"]) for p in (halving, full))
    if timed_f > 0:
        print(f"halving_timed_ratio={timed_h / timed_f:.3f}")
    print(f"halving_screened_out={sum(1 for r in halving['records'] if r.get('screened'))}")


def report_processes(threads: dict[str, Any], procs: dict[str, Any]) -> None:
    """Compile processes against compile threads: the same records apart from timings, and
    which is faster."""
    strip = ("compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "compile_cached", "unit", "attempt")
    by_key = {key(r): r for r in threads["records"]}
    same = sum(
        {k: v for k, v in r.items() if k not in strip}
        == {k: v for k, v in by_key.get(key(r), {}).items() if k not in strip}
        for r in procs["records"]
    )
    medians = [
        r["median_ms"] / by_key[key(r)]["median_ms"]
        for r in procs["records"]
        if "median_ms" in r and "median_ms" in by_key.get(key(r), {})
    ]
    print(f"modes_same_records={same}/{len(procs['records'])}")
    t, p = threads["wall_s"], procs["wall_s"]
    print(f"procs_vs_threads_wall={t / p:.2f}")
    t, p = (sum(m["compile_wall_s"] for m in x["markers"]) for x in (threads, procs))
    print(
        f"threads_compile_wall_s={t:.1f} processes_compile_wall_s={p:.1f} "
        f"procs_vs_threads_compile_wall={t / p if p else float('nan'):.2f}"
    )
    if medians:
        print(f"procs_vs_threads_median={statistics.median(medians):.3f}")
    print(
        f"processes_load_sum_s={sum(m.get('load_sum_s', 0.0) for m in procs['markers']):.2f} "
        f"processes_compile_deaths={sum(m.get('compile_deaths', 0) for m in procs['markers'])}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check"))
    ap.add_argument("--sample", type=Path, default=SAMPLE)
    ap.add_argument(
        "--passes",
        default="wall,device,halving,processes,mosaic",
        help="comma-separated: wall, device, halving, processes, mosaic, tokamax (not by default: its sweeps "
        "take most of a 10-minute check)",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode (no GPU needed)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    doc = json.loads(args.sample.read_text())
    wanted = [p for p in args.passes.split(",") if p]
    unknown = [p for p in wanted if p not in PASSES and p not in OWN_PASSES]
    if unknown or "wall" not in wanted:
        ap.error(f"--passes must include wall and name only {', '.join((*PASSES, *OWN_PASSES))}; got {args.passes!r}")
    done = {}
    for name in (p for p in wanted if p in PASSES):
        with GpuMemory() as mem:
            done[name] = run_pass(name, doc, args)
        if mem.max_mib:
            print(
                f"{name}_gpu_processes_max={mem.max_processes} "
                f"{name}_gpu_mem_max_mib_per_process={sorted(mem.max_mib.values(), reverse=True)}"
            )
    for name, p in done.items():
        print(f"{name}_records={len(p['records'])}")
        print(f"{name}_wall_s={p['wall_s']:.1f}")
        print(f"{name}_flush_l2={sorted({str((m or {}).get('flush_l2')) for m in p['measurement']})}")
    report_wall(done["wall"]["records"], doc)
    if "device" in done:
        report_device(done["wall"], done["device"])
    if "halving" in done:
        report_halving(done["wall"], done["halving"])
    if "processes" in done:
        report_processes(done["wall"], done["processes"])
    if "mosaic" in wanted:
        from bench import gpu_mosaic

        gpu_mosaic.run_pass(doc, args.out, args.smoke)
    if "tokamax" in wanted:
        from bench import gpu_tokamax

        gpu_tokamax.run_pass(doc, args.out, args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
