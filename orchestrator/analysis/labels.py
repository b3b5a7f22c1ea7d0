"""How reports name a config: one short label per config, the report's, the page's and the
heatmap's alike (``report`` re-exports it).

The Triton kernels' configs have the reference's fields and are named here; an implementation
with its own config fields names its configs itself (``kernels.impls.label``).
"""

from __future__ import annotations

from typing import Any

from kernels import impls


def config_label(config: dict[str, Any], mode: str) -> str:
    """Compact config name: ``bq128 bk64 s2 w4`` (fwd), ``o64 i32 s2 w8`` (fwd_bwd).

    A fwd_bwd config names its forward blocks (``bq64 bk64 o64 ...``) only when they are not
    the kernel default 128/128, so the string stays short for the common sweep that fixes them.
    """
    other = impls.label(mode, config)  # an implementation with its own fields names its configs
    if other is not None:
        return other
    g = config.get
    tail = f"s{g('num_stages')} w{g('num_warps')}"
    if mode == "fwd_bwd":
        head = f"o{g('bwd_outer')} i{g('bwd_inner')}"
        fq, fk = g("fwd_block_q"), g("fwd_block_k")
        if (fq, fk) != (128, 128):
            head = f"bq{fq} bk{fk} {head}"
        return f"{head} {tail}"
    if mode == "fwd":
        return f"bq{g('block_q')} bk{g('block_k')} {tail}"
    return " ".join(f"{k}={v}" for k, v in config.items())
