"""The ``tokamax`` pass of ``bench/gpu_check.py``: tokamax's flash-attention kernels on the excerpt's
problems, each config checked (``rel_err``) and timed by the real ``tilesweep run``, and the best
against what tokamax itself runs untuned (its ``auto``: its shipped table's winner where the table
has the shape, else its heuristics).

Per problem of the excerpt (dtype, head_dim, seq, modes), target ``kernel.device_kind`` = the
GPU's own kind where ``kernels.devices`` knows it, else "NVIDIA H200" (printed):

- ``tokamax-mosaic`` with ``"grid": "tokamax"`` (tokamax's own search: 31 fwd and 46 fwd_bwd
  configs at head_dim 64), for the bfloat16/float16 problems only (it takes no float32 at default
  precision);
- ``tokamax-triton`` with ``TRITON_GRID``: the four forward winners most often in tokamax's
  shipped H100 table and two of its backward winners (its own search is 256 forward and 457
  forward+backward configs a shape, more than a 10-minute check holds).

Figures: ``tokamax_rel_err_max_{impl}_{mode}``; ``tokamax_timed_{impl}``;
``tokamax_best_vs_own_{impl}_{problem}`` = best forced median / the auto record's median (below 1:
tilesweep found a faster config than tokamax runs untuned) and ``..._own_from_table`` (1 where
tokamax's shipped table has the shape, so the auto record is its table's winner; 0: heuristics).
``tokamax_available=0`` and the reason where tokamax is not installed: the other passes are not
affected. ``--smoke`` replays a synthetic document instead of the GPU run (no GPU figure).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.gpu_mosaic import _cli, _python, target_kind

TRITON_GRID = {
    "fwd": {"block_q": [64, 128], "block_k": [32, 64, 128], "num_stages": [3, 4], "num_warps": [4, 8]},
    "fwd_bwd": {
        "block_q": [64],
        "block_k": [64],
        "num_stages": [3],
        "num_warps": [4],
        "vjp_block_m1": [64],
        "vjp_block_n1": [32, 64],
        "vjp_block_m2": [64],
        "vjp_block_n2": [32, 64],
        "vjp_num_stages": [2, 3],
        "vjp_num_warps": [4],
    },
}
IMPLS = ("tokamax-mosaic", "tokamax-triton")


def available() -> str | None:
    """Why this machine cannot run tokamax's kernels, or None."""
    r = _python("import tokamax; from kernels import tokamax_ops")
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["unknown"])[-1]


def problems(doc: dict[str, Any], smoke: bool) -> list[tuple[str, int, int, list[str]]]:
    """(dtype, head_dim, seq, modes) of the excerpt's problems, in its order."""
    if smoke:
        return [("bfloat16", 64, 256, ["fwd", "fwd_bwd"])]
    groups: dict[tuple[str, int, int], list[str]] = {}
    for r in doc["results"]:
        modes = groups.setdefault((r["dtype"], r["head_dim"], r["seq"]), [])
        if r["mode"] not in modes:
            modes.append(r["mode"])
    return [(t, d, s, modes) for (t, d, s), modes in groups.items()]


def _spec(doc: dict[str, Any], problem: tuple[str, int, int, list[str]], impl: str, kind: str) -> dict[str, Any]:
    dtype, d, s, modes = problem
    base = {k: doc["config"][k] for k in ("batch", "heads", "repeats", "tag")}
    spec: dict[str, Any] = {**base, "dtypes": [dtype], "head_dims": [d], "seq_lens": [s], "modes": modes}
    spec.update(sharding={"units": 1}, kernel={"impl": impl, "device_kind": kind})
    spec["grid"] = "tokamax" if impl == "tokamax-mosaic" else {m: TRITON_GRID[m] for m in modes}
    return spec


def _run(spec: dict[str, Any], name: str, out: Path, smoke: bool) -> list[dict[str, Any]]:
    """``tilesweep run`` of a spec (``smoke``: a replay of a synthetic document of it): its records."""
    spec["output"] = str(out / f"{name}-results.json")
    if smoke:
        from orchestrator.store.synthetic import document

        source = out / f"{name}-source.json"
        source.write_text(json.dumps(document({**spec, "output": "measured.json"})))
        spec = {**spec, "kernel": {"impl": "replay"}, "replay": {"source": str(source), "impl": spec["kernel"]["impl"]}}
    path = out / f"{name}-spec.json"
    path.write_text(json.dumps(spec, indent=1))
    proc = _cli(["run", str(path), "--sweep-dir", str(out / f"{name}-sweep")])
    if proc.returncode not in (0, 1) or not Path(spec["output"]).exists():
        print(f"{name}_failed=exit {proc.returncode}", flush=True)
        return []
    results: list[dict[str, Any]] = json.loads(Path(spec["output"]).read_text())["results"]
    return results


def own_from_table(
    impl: str, problem: tuple[str, int, int, list[str]], mode: str, kind: str, doc: dict[str, Any]
) -> int:
    """1 where tokamax's own table has this shape for ``kind`` (its auto is the table's winner)."""
    dtype, d, s, _ = problem
    b, h = doc["config"]["batch"], doc["config"]["heads"]
    code = (
        "import sys; from kernels import devices, tokamax_ops as o, tokamax_meta as m\n"
        f"p = m.Problem(batch={b}, seq={s}, heads={h}, head_dim={d}, dtype={dtype!r})\n"
        f"ba = o.bound({impl!r}, 'fwd', p, devices.get({kind!r}), residuals={mode == 'fwd_bwd'})\n"
        "sys.exit(0 if ba.cached_autotuning_data else 3)"
    )
    return int(_python(code).returncode == 0)


def run_pass(doc: dict[str, Any], out_root: Path, smoke: bool) -> None:
    """The pass (module docstring): print its figures."""
    why = available()
    print(f"tokamax_available={int(why is None)}" + (f" reason={why!r}" if why else ""), flush=True)
    if why:
        return
    kind = target_kind(smoke)
    out = out_root / "tokamax"
    out.mkdir(parents=True, exist_ok=True)
    for i, problem in enumerate(problems(doc, smoke)):
        for impl in IMPLS:
            if impl == "tokamax-mosaic" and problem[0] == "float32":
                continue
            recs = _run(_spec(doc, problem, impl, kind), f"{impl}-{i}", out, smoke)
            report(impl, problem, recs, kind, doc)


def report(
    impl: str, problem: tuple[str, int, int, list[str]], recs: list[dict[str, Any]], kind: str, doc: dict[str, Any]
) -> None:
    """One problem's figures for one implementation (module docstring)."""
    dtype, d, s, modes = problem
    timed = [r for r in recs if "error" not in r]
    print(f"tokamax_timed_{impl}_{dtype}_d{d}_s{s}={len(timed)}/{len(recs)}")
    for mode in modes:
        errs = [r["rel_err"] for r in timed if r["mode"] == mode]
        if errs:
            print(f"tokamax_rel_err_max_{impl}_{mode}_{dtype}_d{d}_s{s}={max(errs):.3g}")
        auto = [r["median_ms"] for r in timed if r["mode"] == mode and r["config"] == "auto"]
        forced = [r["median_ms"] for r in timed if r["mode"] == mode and r["config"] == "forced"]
        if auto and forced:
            name = f"tokamax_best_vs_own_{impl}_{mode}_{dtype}_d{d}_s{s}"
            table = own_from_table(impl, problem, mode, kind, doc)
            print(f"{name}={min(forced) / auto[0]:.3g} {name}_own_from_table={table}")
