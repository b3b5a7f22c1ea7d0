"""The ``mosaic`` pass of ``bench/gpu_check.py``: jax's Mosaic GPU attention on the excerpt's
problems, against our Triton kernel, and pre-flight lowering against the GPU's compile.

jax's attention_mgpu takes float16 only, the excerpt's problems are bfloat16 and float32: so
each problem (head_dim, seq, modes) is run in **float16**, by both kernels, each through the
real ``tilesweep run`` (shared-memory pruning off for ours, so nothing is skipped):

- Mosaic: ``MOSAIC_GRID`` (18 fwd, 16 fwd_bwd configs, plus auto), target ``kernel.device_kind``
  = the GPU's own kind where ``kernels.devices`` knows it, else "NVIDIA H200" (printed);
- ours: ``TRITON_GRID`` (16 fwd and 16 fwd_bwd configs around the reference's winners);
- before the Mosaic run, ``tilesweep plan --lower --dry-run --json`` on this machine's CPUs.

Figures: ``mosaic_rel_err_max_{fwd,fwd_bwd}`` and ``mosaic_timed`` (configs with a timing);
``mosaic_vs_triton_{problem}`` (best Mosaic median / best of ours: below 1, Mosaic is faster);
``mosaic_lowering_agree=N/M`` (configs where lowering's verdict, lowered or refused, is what the
GPU compile did: a timing, or an error), with the disagreements listed, and
``mosaic_lowering_bytes_same`` (shared-memory refusals with the same byte count on both sides);
``mosaic_gpu_max_smem_bytes`` (the limit the GPU's refusals name). ``mosaic_available=0``
and the reason where this machine cannot run it (another jax's attention_mgpu, no absl-py):
the other passes are not affected. ``--smoke`` replays a synthetic Mosaic document instead of
the GPU run (nothing of it is a GPU figure) and runs ours in interpret mode on a tiny shape.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MOSAIC_GRID = {
    "fwd": {"block_q": [64, 128], "block_kv": [64, 128, 256], "max_concurrent_steps": [2, 3, 4]},
    "fwd_bwd": {
        "block_q": [64],
        "block_kv": [64, 128],
        "max_concurrent_steps": [2],
        "compute_wgs_bwd": [1, 2],
        "block_q_dkv": [64],
        "block_kv_dkv": [64, 128],
        "block_q_dq": [64, 128],
        "block_kv_dq": [64],
    },
}
TRITON_GRID = {
    "fwd": {"block_q": [64, 128], "block_k": [64, 128], "num_stages": [2, 3], "num_warps": [4, 8]},
    "fwd_bwd": {"bwd_outer": [64, 128], "bwd_inner": [32, 64], "num_stages": [1, 2], "num_warps": [4, 8]},
}
FALLBACK_KIND = "NVIDIA H200"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True, capture_output=True)


def available() -> str | None:
    """Why this machine cannot trace jax's Mosaic GPU attention, or None."""
    r = _python(
        "from kernels import mosaic; mosaic.check_available(); import jax.experimental.pallas.ops.gpu.attention_mgpu"
    )
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["unknown"])[-1]


def target_kind(smoke: bool) -> str:
    """The device kind to lower for: this GPU's where ``kernels.devices`` knows it."""
    if smoke:
        return FALLBACK_KIND
    r = _python("import jax; print(jax.devices()[0].device_kind)")
    seen = r.stdout.strip() or "unknown"
    r2 = _python(f"from kernels import devices; devices.get({seen!r})")
    print(f"mosaic_device_kind_seen={seen!r} known={r2.returncode == 0}", flush=True)
    return seen if r2.returncode == 0 else FALLBACK_KIND


def problems(doc: dict[str, Any], smoke: bool) -> list[tuple[int, int, list[str]]]:
    """(head_dim, seq, modes) of the excerpt's problems, in its order."""
    if smoke:
        return [(64, 256, ["fwd", "fwd_bwd"])]
    groups: dict[tuple[int, int], list[str]] = {}
    for r in doc["results"]:
        modes = groups.setdefault((r["head_dim"], r["seq"]), [])
        if r["mode"] not in modes:
            modes.append(r["mode"])
    return [(d, s, modes) for (d, s), modes in groups.items()]


def _spec(doc: dict[str, Any], d: int, s: int, modes: list[str], smoke: bool) -> dict[str, Any]:
    base = {k: doc["config"][k] for k in ("batch", "heads", "repeats", "tag")}
    spec = {**base, "dtypes": ["float16"], "head_dims": [d], "seq_lens": [s], "modes": modes, "sharding": {"units": 1}}
    if smoke:
        spec.update(batch=1, heads=1, repeats=2, timing={"target_ms": 1, "max_inner": 2, "warmup": 0})
    return spec


def _cli(args: list[str], *, show: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "orchestrator", *args]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True)
    print(proc.stdout[-3000:] if show else "", proc.stderr[-1500:], flush=True)
    return proc


def _run(spec: dict[str, Any], name: str, out: Path) -> list[dict[str, Any]]:
    """``tilesweep run`` of a spec here: its records (none where it failed)."""
    spec["output"] = str(out / f"{name}-results.json")
    path = out / f"{name}-spec.json"
    path.write_text(json.dumps(spec, indent=1))
    proc = _cli(["run", str(path), "--sweep-dir", str(out / f"{name}-sweep")])
    if proc.returncode not in (0, 1) or not Path(spec["output"]).exists():
        print(f"{name}_failed=exit {proc.returncode}", flush=True)
        return []
    results: list[dict[str, Any]] = json.loads(Path(spec["output"]).read_text())["results"]
    return results


def _lowered(spec: dict[str, Any], name: str, out: Path) -> dict[str, dict[str, Any]]:
    """``plan --lower --dry-run --json``: each config's verdict, by item id."""
    path = out / f"{name}-spec.json"
    path.write_text(json.dumps(spec, indent=1))
    proc = _cli(["plan", str(path), "--lower", "--dry-run", "--json"], show=False)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {line["lowering"]["id"]: line["lowering"] for line in lines}


def _smoke_source(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """The Mosaic spec replayed from a synthetic document of it (``--smoke``: no GPU)."""
    from orchestrator.store.synthetic import document

    source = out / "mosaic-smoke-source.json"
    source.write_text(json.dumps(document({**spec, "output": "measured.json"})))
    return {**spec, "kernel": {"impl": "replay"}, "replay": {"source": str(source), "impl": "mosaic"}}


def run_pass(doc: dict[str, Any], out_root: Path, smoke: bool) -> None:
    """The pass (module docstring): print its figures."""
    why = available()
    print(f"mosaic_available={int(why is None)}" + (f" reason={why!r}" if why else ""), flush=True)
    if why:
        return
    kind = target_kind(smoke)
    out = out_root / "mosaic"
    out.mkdir(parents=True, exist_ok=True)
    mosaic: list[dict[str, Any]] = []
    triton: list[dict[str, Any]] = []
    verdicts: dict[str, dict[str, Any]] = {}
    for i, (d, s, modes) in enumerate(problems(doc, smoke)):
        base = _spec(doc, d, s, modes, smoke)
        m = {**base, "kernel": {"impl": "mosaic", "device_kind": kind}, "grid": {x: MOSAIC_GRID[x] for x in modes}}
        verdicts.update(_lowered(m, f"mosaic-lower-{i}", out))
        mosaic += _run(_smoke_source(m, out) if smoke else m, f"mosaic-{i}", out)
        grid = SMOKE_TRITON_GRID if smoke else TRITON_GRID
        t = {**base, "kernel": {"prune_smem": "off"}, "grid": {x: grid[x] for x in modes}}
        triton += _run(t, f"triton-f16-{i}", out)
    report(mosaic, triton, verdicts)


SMOKE_TRITON_GRID = {
    "fwd": {"block_q": [32], "block_k": [32, 64], "num_stages": [2], "num_warps": [4]},
    "fwd_bwd": {"bwd_outer": [32], "bwd_inner": [32], "num_stages": [2], "num_warps": [4]},
}


def _best(records: list[dict[str, Any]]) -> dict[tuple[int, int, str], float]:
    out: dict[tuple[int, int, str], float] = {}
    for r in records:
        if r["config"] == "forced" and "error" not in r:
            k = (r["head_dim"], r["seq"], r["mode"])
            out[k] = min(out.get(k, float("inf")), r["median_ms"])
    return out


def report(mosaic: list[dict[str, Any]], triton: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> None:
    """The pass's figures (module docstring)."""
    timed = [r for r in mosaic if "error" not in r]
    print(f"mosaic_records={len(mosaic)} mosaic_timed={len(timed)} triton_f16_records={len(triton)}")
    for mode in ("fwd", "fwd_bwd"):
        errs = [r["rel_err"] for r in timed if r["mode"] == mode]
        if errs:
            print(f"mosaic_rel_err_max_{mode}={max(errs):.3g}")
    ours = _best(triton)
    for k, ms in _best(mosaic).items():
        if k in ours:
            print(f"mosaic_vs_triton_d{k[0]}_s{k[1]}_{k[2]}={ms / ours[k]:.3g}")
    agreement(mosaic, verdicts)


def agreement(mosaic: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> None:
    """Pre-flight lowering's verdict of each Mosaic config against what the GPU compile did."""
    from kernels.preflight import smem_refusal
    from orchestrator.analysis.report import config_label
    from orchestrator.spec.records import config_of, item_id

    agree = compared = same_bytes = both_refused = 0
    limits: set[int] = set()
    odd: list[str] = []
    for r in mosaic:
        v = verdicts.get(item_id(r))
        gpu = smem_refusal(str(r.get("error", "")))
        if gpu:
            limits.add(gpu[1])
        if v is None:
            continue
        compared += 1
        ok = ("error" not in r) == (v["verdict"] == "lowered")
        agree += ok
        if v["verdict"] == "refused" and gpu and v.get("smem_bytes") is not None:
            both_refused += 1
            same_bytes += v["smem_bytes"] == gpu[0]
        if not ok and len(odd) < 5:
            label = "auto" if r["config"] == "auto" else config_label(config_of(r), r["mode"])
            odd.append(f"{r['mode']} {label}: lowering {v['verdict']}, GPU {str(r.get('error', 'timed'))[:120]!r}")
    print(f"mosaic_lowering_agree={agree}/{compared}")
    print(f"mosaic_lowering_bytes_same={same_bytes}/{both_refused}")
    print(f"mosaic_gpu_max_smem_bytes={sorted(limits) or None}")
    for line in odd:
        print(f"mosaic_lowering_disagrees: {line}")
