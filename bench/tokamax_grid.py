"""tokamax's own search per shape of the reference config, on H100 and H200, and what pre-flight
lowering prunes of it, on this machine's CPU (no GPU: tokamax sees a stand-in of the named GPU,
``kernels.standin``).

For each shape (dtypes bfloat16 and float32, head_dims 64 and 128, seqs 2048 and 8192, batch 4,
8 heads), device kind, tokamax kernel and mode it prints ``planned`` (the configs ``"grid":
"tokamax"`` plans: tokamax's autotuning configs, ``kernels.tokamax_ops.search_space``) and, for
what it lowers, ``pruned`` (configs whose lowering refused) with the seconds per lowering::

    tokamax-mosaic fwd_bwd bfloat16 d128 s2048 NVIDIA H200: planned=32 lowered=26 pruned=6 s_per_config=2.41

A shape a kernel cannot run (tokamax's Mosaic kernel takes no float32 at default precision) is
one line saying so, ``planned=0``. Lowering every Triton config of every shape costs most of an
hour of CPU; ``--triton-lower`` limits it (``fwd``: the forward of every shape, the forward and
backward at seq 2048 only; ``none``). Triton sizes shared memory only when it compiles PTX, so its
lowering refuses nothing for shared memory: what it can catch is any other refusal. What this
leaves out: the PTX/SASS compile and everything that happens on a GPU.

    flock /tmp/tilesweep-bench.lock .venv/bin/python -m bench.tokamax_grid [--triton-lower fwd]
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from kernels import devices  # noqa: E402
from kernels import tokamax_meta as meta  # noqa: E402
from kernels import tokamax_ops as ops  # noqa: E402

KINDS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
SHAPES = list(itertools.product(("bfloat16", "float32"), (64, 128), (2048, 8192)))


def lower_all(impl: str, mode: str, p: meta.Problem, device: devices.DeviceKind, configs: list[dict]) -> str:
    """``lowered=N pruned=M s_per_config=S`` over ``configs``, plus the first refusal's message."""
    refused: list[str] = []
    t0 = time.perf_counter()
    for fields in configs:
        try:
            ops.lower(impl, mode, fields, p, device)
        except Exception as exc:  # a refusal is a count here
            refused.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    per = (time.perf_counter() - t0) / max(1, len(configs))
    line = f"lowered={len(configs) - len(refused)} pruned={len(refused)} s_per_config={per:.2f}"
    return line + (f" first_refusal={refused[0]!r}" if refused else "")


def lowers(impl: str, mode: str, seq: int, triton: str) -> bool:
    if impl == meta.MOSAIC or triton == "all":
        return True
    return triton == "fwd" and (mode == "fwd" or seq == 2048)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--triton-lower", choices=("all", "fwd", "none"), default="fwd")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    args = ap.parse_args()
    for kind, (dtype, d, seq), impl, mode in itertools.product(args.kinds, SHAPES, meta.IMPL_NAMES, ("fwd", "fwd_bwd")):
        device = devices.get(kind)
        p = meta.Problem(batch=4, seq=seq, heads=8, head_dim=d, dtype=dtype)
        head = f"{impl} {mode} {dtype} d{d} s{seq} {kind}:"
        try:
            configs = ops.search_space(impl, mode, p, device)
        except Exception as exc:  # tokamax refuses the problem itself
            print(f"{head} planned=0 refused={type(exc).__name__}: {str(exc).splitlines()[0][:160]!r}", flush=True)
            continue
        lowered = lower_all(impl, mode, p, device, configs) if lowers(impl, mode, seq, args.triton_lower) else ""
        print(f"{head} planned={len(configs)} {lowered}".rstrip(), flush=True)


if __name__ == "__main__":
    main()
