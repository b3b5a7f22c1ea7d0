"""Causal and grouped-query attention against full multi-head attention, in Pallas interpret mode.

One problem, float32, batch 1, seq 1024, head_dim 64, one config for everything
(``block_q = block_k = bwd_outer = bwd_inner = 64``), each variant compiled once and then timed
call by call, each ratio's two sides back to back in alternating order, round by round
(``--rounds``; medians over rounds of the per-round ratio and of each time):

- ``causal_vs_full_fwd``, ``causal_vs_full_fwd_bwd``: our kernel, causal / non-causal, 2 heads.
  The causal kernel skips the tiles above the diagonal by its loop bounds; with 16 tiles a side
  it runs 136 of 256 tile steps (0.53), the 16 diagonal ones masked.
- ``gqa_vs_mha_fwd_bwd``: 8 query heads on 2 K/V heads / 8 query heads on 8 K/V heads.
- ``gqa_vs_repeat_kv_fwd_bwd``: the honest baseline for grouped-query attention without kernel
  support: what a user of a multi-head kernel does, ``jnp.repeat`` K/V to 8 heads and call it
  (the repeat's gradient sums dK/dV back over the group). Our grouped-query kernel / that.
- ``stock_causal_vs_full_fwd``, ``stock_causal_vs_full_fwd_bwd``: the same ratio for jax's stock
  ``mha`` (same tiles), which bounds its loops too but masks every step: the baseline for what
  masking only the diagonal adds.

What the figures leave out: interpret mode runs the grid one program after another on the CPU,
so a time here counts the work in tile steps plus the interpreter's overhead, not GPU time, and
num_warps/num_stages do not exist here. That overhead is not small: the interpreter threads
whole operand arrays through its loops, so a program's cost grows with the size of K/V (here,
fwd, 2 heads: about 0.75 ms per program; 8 heads: about 3 ms), a cost causal skipping only
partly removes (it keeps the causal ratios above the 0.53 of the tile steps) and one that makes
K/V arrays 4x smaller pay off in ``gqa_vs_mha_fwd_bwd`` for a reason no GPU has. GPU memory
traffic itself is not modelled, so the grouped-query saving a GPU sees (K/V read once per group)
is not what these ratios show. On a GPU the ratios come from ``tilesweep report`` of a causal
and a non-causal sweep. The machine's load moves single times a lot (a shared 2-core box:
the same ratio read 0.38 and 0.91 in two runs timed variant after variant), hence the pairing.

Run: ``.venv/bin/python -m bench.causal [--rounds 9]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from kernels import stock
from kernels.attention import AttentionConfig, build, flash_attention, make_inputs
from kernels.reference import mode_fn

SEQ, HEAD_DIM, DTYPE = 1024, 64, "float32"
CONFIG = AttentionConfig(block_q=64, block_k=64, bwd_outer=64, bwd_inner=64)


def _repeat_kv(mode: str, group: int) -> Callable[..., Any]:
    """Grouped-query attention the way a multi-head kernel's user does it: K/V repeated."""

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        k, v = (jnp.repeat(x, group, axis=2) for x in (k, v))
        return flash_attention(q, k, v, CONFIG, interpret=True)

    return mode_fn(mode, attend)


def variants() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    """name -> (function, its inputs)."""
    two = make_inputs(batch=1, seq=SEQ, heads=2, head_dim=HEAD_DIM, dtype=DTYPE)
    mha8 = make_inputs(batch=1, seq=SEQ, heads=8, head_dim=HEAD_DIM, dtype=DTYPE)
    gqa8 = make_inputs(batch=1, seq=SEQ, heads=8, kv_heads=2, head_dim=HEAD_DIM, dtype=DTYPE)
    out: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
    for mode in ("fwd", "fwd_bwd"):
        for causal in (False, True):
            name = "causal" if causal else "full"
            out[f"{name}_{mode}"] = (build(mode, CONFIG, causal=causal, interpret=True), two)
            out[f"stock_{name}_{mode}"] = (stock.build(mode, CONFIG, causal=causal, interpret=True), two)
    out["mha_fwd_bwd"] = (build("fwd_bwd", CONFIG, interpret=True), mha8)
    out["gqa_fwd_bwd"] = (build("fwd_bwd", CONFIG, interpret=True), gqa8)
    out["repeat_kv_fwd_bwd"] = (_repeat_kv("fwd_bwd", 4), gqa8)
    return out


# (ratio name, numerator variant, denominator variant): each pair is timed back to back.
PAIRS = [
    *((f"{p}causal_vs_full_{m}", f"{p}causal_{m}", f"{p}full_{m}") for p in ("", "stock_") for m in ("fwd", "fwd_bwd")),
    ("gqa_vs_mha_fwd_bwd", "gqa_fwd_bwd", "mha_fwd_bwd"),
    ("gqa_vs_repeat_kv_fwd_bwd", "gqa_fwd_bwd", "repeat_kv_fwd_bwd"),
]


def _time(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    rounds = ap.parse_args().rounds
    compiled = {}
    for name, (fn, args) in variants().items():
        exe = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(exe(*args))  # warm-up
        compiled[name] = functools.partial(exe, *args)
    times: dict[str, list[float]] = {name: [] for name in compiled}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in PAIRS}
    for r in range(rounds):
        for name, a, b in PAIRS:
            # the two sides of a ratio run back to back, in alternating order, so a load spike
            # from other processes hits both alike; the ratio is taken per round
            if r % 2:
                ta, tb = _time(compiled[a]), _time(compiled[b])
            else:
                tb, ta = _time(compiled[b]), _time(compiled[a])
            times[a].append(ta)
            times[b].append(tb)
            ratios[name].append(ta / tb)
    for name, ts in times.items():
        print(f"{name}_s={statistics.median(ts):.4f}")
    tiles = SEQ // CONFIG.block_q
    print(f"causal_tile_step_fraction={tiles * (tiles + 1) / 2 / tiles**2:.3f}")  # computed, not measured
    for name, rs in ratios.items():
        print(f"{name}={statistics.median(rs):.3f}")


if __name__ == "__main__":
    main()
