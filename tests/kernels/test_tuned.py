"""kernels.tuned names dtypes by the kernel's own rule (kernels.smem.dtype_name).

The loading and lookup rules are tested with the exporter in tests/test_export.py; this file
checks only what the shared dtype rule decides for a lookup.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from kernels.tuned import TunedTable

CONFIG = {"block_q": 64, "block_k": 64, "bwd_outer": 64, "bwd_inner": 32, "num_warps": 4, "num_stages": 2}


def _table(*dtypes: str) -> TunedTable:
    entries: list[dict[str, Any]] = [
        {
            "dtype": d,
            "head_dim": 64,
            "seq": 1024,
            "batch": 1,
            "heads": 2,
            "mode": "fwd",
            "config": CONFIG,
            "median_ms": 1.0,
            "auto_ms": 1.5,
        }
        for d in dtypes
    ]
    return TunedTable.from_obj({"format": "tilesweep-tuned", "version": 1, "device": {}, "entries": entries})


def test_dtype_given_any_way_the_kernel_accepts_finds_the_entry() -> None:
    table = _table("bfloat16", "float32")
    for dtype in ("float32", np.float32, np.dtype("float32"), jnp.float32, jnp.zeros(1).dtype):
        assert table.lookup(dtype=dtype, head_dim=64, seq=1024, mode="fwd") == CONFIG, dtype
    assert table.lookup(dtype=jnp.bfloat16, head_dim=64, seq=1024, mode="fwd") == CONFIG


def test_dtype_the_kernel_does_not_run_means_auto() -> None:
    """Even a hand-written float16 entry is no answer: the kernel would refuse float16."""
    table = _table("float16")
    for dtype in ("float16", np.float16, "int8"):
        assert table.lookup(dtype=dtype, head_dim=64, seq=1024, mode="fwd") is None, dtype
