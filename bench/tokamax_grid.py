"""tokamax's own search per shape of the reference config, on H100, H200 and B200, and what pre-flight
lowering prunes of it, on this machine's CPU (no GPU: tokamax sees a stand-in of the named GPU,
``kernels.standin``).

For each shape (dtypes bfloat16 and float32, head_dims 64 and 128, seqs 2048 and 8192, batch 4,
8 heads), device kind, tokamax kernel and mode it prints ``planned`` (the configs ``"grid":
"tokamax"`` plans: tokamax's autotuning configs, ``kernels.tokamax_ops.search_space``) and, for
what it lowers, ``pruned`` (configs whose lowering refused, each lowered as ``tilesweep plan
--lower`` lowers it: ``kernels.preflight``) with the seconds per lowering::

    tokamax-mosaic fwd_bwd bfloat16 d128 s2048 NVIDIA H200: planned=32 lowered=26 pruned=6 s_per_config=2.41

The implementation is named as the sweep's records name it: ``tokamax-mosaic`` runs as
``tokamax-mosaic-sm100`` on a B200 (tokamax's sm100 config classes).

A shape a kernel cannot run (tokamax's Mosaic kernel takes no float32 at default precision) is
one line saying so, ``planned=0``. Lowering every Triton config of every shape costs most of an
hour of CPU; ``--triton-lower`` limits it (``fwd``: the forward of every shape, the forward and
backward at seq 2048 only; ``none``), ``--lower-seqs`` the seqs lowered at all (tokamax's lists
are the same at 2048 and 8192; a seq left out is not lowered, so its pruned count is not known),
and ``--lower-kinds`` the device kinds lowered for. Triton sizes shared memory only when it
compiles PTX, so its lowering refuses nothing for shared memory: what it can catch is any other
refusal. What this leaves out: the PTX/SASS compile and everything that happens on a GPU.

    flock /tmp/tilesweep-bench.lock .venv/bin/python -m bench.tokamax_grid [--triton-lower fwd] [--lower-seqs 2048] \
        [--kinds KIND...] [--lower-kinds KIND...]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from kernels import devices, impls, preflight  # noqa: E402
from kernels import tokamax_meta as meta  # noqa: E402
from orchestrator.errors import PlanError  # noqa: E402
from orchestrator.planning import expand  # noqa: E402
from orchestrator.spec.files import spec_from_data  # noqa: E402

KINDS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200")
SHAPES = list(itertools.product(("bfloat16", "float32"), (64, 128), (2048, 8192)))


def planned(impl: str, mode: str, kind: str, dtype: str, d: int, seq: int) -> list[dict[str, Any]]:
    """The forced configs ``"grid": "tokamax"`` plans for one shape (raises the planner's PlanError)."""
    data = {"dtypes": [dtype], "head_dims": [d], "seq_lens": [seq], "modes": [mode], "batch": 4, "heads": 8}
    spec = spec_from_data({**data, "grid": "tokamax", "kernel": {"impl": impl, "device_kind": kind}})
    return [it.fields() or {} for it in expand(spec) if it.config == "forced"]


def lower_all(impl: str, mode: str, p: meta.Problem, device: devices.DeviceKind, configs: list[dict[str, Any]]) -> str:
    """``lowered=N pruned=M s_per_config=S`` over ``configs``, the refusals counted by kind
    (``smem``: the Mosaic GPU compiler's shared-memory refusal; ``tokamax``: tokamax's own
    NotImplementedError or config check; ``other``), and the first refusal's message."""
    refused: list[str] = []
    t0 = time.perf_counter()
    for fields in configs:
        try:
            preflight.lower(
                impl,
                mode,
                fields,
                batch=p.batch,
                seq=p.seq,
                heads=p.heads,
                head_dim=p.head_dim,
                dtype=p.dtype,
                device=device,
            )
        except Exception as exc:  # a refusal is a count here
            refused.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    per = (time.perf_counter() - t0) / max(1, len(configs))
    kinds = collections.Counter(_kind(r) for r in refused)
    line = f"lowered={len(configs) - len(refused)} pruned={len(refused)} s_per_config={per:.2f}"
    line += "".join(f" pruned_{k}={n}" for k, n in sorted(kinds.items()))
    return line + (f" first_refusal={refused[0]!r}" if refused else "")


def _kind(refusal: str) -> str:
    if preflight.smem_refusal(refusal) is not None:
        return "smem"
    if refusal.startswith(("NotImplementedError", "ValueError: (config)")):
        return "tokamax"
    return "other"


def lowers(impl: str, mode: str, seq: int, kind: str, args: argparse.Namespace) -> bool:
    if args.lower_seqs is not None and seq not in args.lower_seqs:
        return False
    if args.lower_kinds is not None and kind not in args.lower_kinds:
        return False
    if impl != meta.TRITON or args.triton_lower == "all":
        return True
    return args.triton_lower == "fwd" and (mode == "fwd" or seq == 2048)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--triton-lower", choices=("all", "fwd", "none"), default="fwd")
    ap.add_argument("--lower-seqs", type=int, nargs="+", default=None, help="lower at these seqs only (default: all)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    ap.add_argument("--lower-kinds", nargs="+", default=None, help="lower for these kinds only (default: all)")
    args = ap.parse_args()
    preflight.cpu_only()
    for kind, (dtype, d, seq), name, mode in itertools.product(args.kinds, SHAPES, meta.KERNELS, ("fwd", "fwd_bwd")):
        device = devices.get(kind)
        impl = impls.resolve(name, device)
        p = meta.Problem(batch=4, seq=seq, heads=8, head_dim=d, dtype=dtype)
        head = f"{impl} {mode} {dtype} d{d} s{seq} {kind}:"
        try:
            configs = planned(name, mode, kind, dtype, d, seq)
        except PlanError as exc:  # the planner refuses the problem (tokamax's Mosaic kernel: no float32)
            print(f"{head} planned=0 refused={exc.message[:200]!r}", flush=True)
            continue
        lowered = lower_all(impl, mode, p, device, configs) if lowers(impl, mode, seq, kind, args) else ""
        print(f"{head} planned={len(configs)} {lowered}".rstrip(), flush=True)


if __name__ == "__main__":
    main()
