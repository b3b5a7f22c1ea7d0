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

The excerpt's shapes (batch 4, 8 heads) are not in tokamax's shipped H100 tables, so one shape
that is (``SHIPPED``: bfloat16, head_dim 64, seq 2048, batch 8, 32 heads, a key of both ops'
forward, forward-with-residuals and vjp tables) is swept too, each kernel as above, and its best
config is set against tokamax's shipped H100 choice for it (``tokamax_ops.chosen`` for "NVIDIA
H100 80GB HBM3": the table's winner of each op), timed in the same sweep where its grid holds it,
else by a one-config sweep of it run next (``..._same_sweep=0``: two runs, drift counts).

Figures: ``tokamax_rel_err_max_{impl}_{mode}``; ``tokamax_timed_{impl}``;
``tokamax_best_vs_own_{impl}_{problem}`` = best forced median / the auto record's median (below 1:
tilesweep found a faster config than tokamax runs untuned) and ``..._own_from_table`` (1 where
tokamax's shipped table has the shape, so the auto record is its table's winner; 0: heuristics);
``tokamax_best_vs_shipped_h100_{impl}_{mode}_{problem}`` = best forced median / the median of
tokamax's shipped H100 choice (on an H100 the auto record runs that choice too; on another GPU
it is the H100's winner run there), with ``..._same_sweep``. ``tokamax_available=0`` and the
reason where tokamax is not installed: the other passes are not affected. ``--smoke`` replays a
synthetic document instead of the GPU run (no GPU figure).

On the H200 test machine (jax 0.11.2; no tokamax, pydantic, submitit there) the pass runs once
the wheels ``bench/gpu_wheels.sh`` downloads here (into ``wheels/``, carried with the tree, about
32 MB) are installed beside its jax, in one prepared call::

    python3 -m pip install -q --no-index --no-deps --find-links wheels -r wheels/requirements.txt tokamax && \
      PYTHONUNBUFFERED=1 python3 -m bench.gpu_check --passes wall,tokamax --out "$OUT"

Not yet run on a GPU: whether tokamax 0.0.17 runs on that jax 0.11.2 (its metadata asks for
jax >= 0.11.1) is what the first call will say (``tokamax_available`` and its reason).
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
H100_TABLE = "NVIDIA H100 80GB HBM3"  # the device kind of tokamax's shipped H100 tables
SHIPPED = ("bfloat16", 64, 2048, ["fwd", "fwd_bwd"])  # a shape tokamax's H100 tables hold, at:
SHIPPED_BATCH_HEADS = (8, 32)


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


def _spec(
    doc: dict[str, Any], problem: tuple[str, int, int, list[str]], impl: str, kind: str, **over: Any
) -> dict[str, Any]:
    dtype, d, s, modes = problem
    base = {**{k: doc["config"][k] for k in ("batch", "heads", "repeats", "tag")}, **over}
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


def own_from_table(impl: str, problem: tuple[str, int, int, list[str]], mode: str, kind: str, b: int, h: int) -> int:
    """1 where tokamax's own tables hold this shape for ``kind`` (its auto is the table's winner)."""
    dtype, d, s, _ = problem
    code = (
        "import sys; from kernels import devices, tokamax_ops as o, tokamax_meta as m\n"
        f"p = m.Problem(batch={b}, seq={s}, heads={h}, head_dim={d}, dtype={dtype!r})\n"
        f"sys.exit(0 if o.in_tables({impl!r}, {mode!r}, p, devices.get({kind!r})) else 3)"
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
    for impl in IMPLS:
        shipped_pass(doc, impl, kind, out, smoke)


def shipped_choice(impl: str, mode: str) -> dict[str, Any] | None:
    """tokamax's shipped H100 choice for ``SHIPPED`` (record config fields), or None where its
    H100 tables lack the shape (either op of a fwd_bwd)."""
    dtype, d, s, _ = SHIPPED
    b, h = SHIPPED_BATCH_HEADS
    code = (
        "import json, sys; from kernels import devices, tokamax_ops as o, tokamax_meta as m\n"
        f"p, k = m.Problem(batch={b}, seq={s}, heads={h}, head_dim={d}, dtype={dtype!r}), devices.get({H100_TABLE!r})\n"
        f"sys.exit(3) if not o.in_tables({impl!r}, {mode!r}, p, k) else None\n"
        f"print(json.dumps(o.chosen({impl!r}, {mode!r}, p, k)))"
    )
    r = _python(code)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None


def shipped_pass(doc: dict[str, Any], impl: str, kind: str, out: Path, smoke: bool) -> None:
    """``SHIPPED`` swept as the excerpt's problems are, its best against tokamax's shipped H100 choice."""
    dtype, d, s, modes = SHIPPED
    b, h = SHIPPED_BATCH_HEADS
    recs = _run(_spec(doc, SHIPPED, impl, kind, batch=b, heads=h), f"{impl}-shipped", out, smoke)
    report(impl, SHIPPED, recs, kind, doc, (b, h))
    for mode in modes:
        name = f"tokamax_best_vs_shipped_h100_{impl}_{mode}_{dtype}_d{d}_s{s}_b{b}_h{h}"
        choice = shipped_choice(impl, mode)
        forced = [r for r in recs if r["mode"] == mode and r["config"] == "forced" and "error" not in r]
        if choice is None or not forced:
            print(f"{name}_has_shipped={int(choice is not None)} {name}_timed={len(forced)}")
            continue
        same = [r for r in forced if all(r.get(f) == v for f, v in choice.items())]
        if not same:  # not in the sweep's grid: a sweep of that one config
            one = _spec(doc, (dtype, d, s, [mode]), impl, kind, batch=b, heads=h)
            one["grid"] = {mode: {f: [v] for f, v in choice.items()}}
            same = [r for r in _run(one, f"{impl}-shipped-{mode}", out, smoke) if r["config"] == "forced"]
            same = [r for r in same if "error" not in r]
        if same:
            best = min(r["median_ms"] for r in forced)
            print(f"{name}={best / same[0]['median_ms']:.3g} {name}_same_sweep={int(same[0] in forced)}", flush=True)
        else:
            print(f"{name}_shipped_failed=1", flush=True)


def report(
    impl: str,
    problem: tuple[str, int, int, list[str]],
    recs: list[dict[str, Any]],
    kind: str,
    doc: dict[str, Any],
    batch_heads: tuple[int, int] | None = None,
) -> None:
    """One problem's figures for one implementation (module docstring); ``batch_heads``: the
    problem's where they are not the excerpt's (named in its figures then)."""
    dtype, d, s, modes = problem
    b, h = batch_heads or (doc["config"]["batch"], doc["config"]["heads"])
    s_ = f"{s}_b{b}_h{h}" if batch_heads else s
    timed = [r for r in recs if "error" not in r]
    print(f"tokamax_timed_{impl}_{dtype}_d{d}_s{s_}={len(timed)}/{len(recs)}")
    for mode in modes:
        errs = [r["rel_err"] for r in timed if r["mode"] == mode]
        if errs:
            print(f"tokamax_rel_err_max_{impl}_{mode}_{dtype}_d{d}_s{s_}={max(errs):.3g}")
        auto = [r["median_ms"] for r in timed if r["mode"] == mode and r["config"] == "auto"]
        forced = [r["median_ms"] for r in timed if r["mode"] == mode and r["config"] == "forced"]
        if auto and forced:
            name = f"tokamax_best_vs_own_{impl}_{mode}_{dtype}_d{d}_s{s_}"
            table = own_from_table(impl, problem, mode, kind, b, h)
            print(f"{name}={min(forced) / auto[0]:.3g} {name}_own_from_table={table}")
