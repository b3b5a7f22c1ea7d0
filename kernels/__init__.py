"""The GPU side of tilesweep: the Pallas flash-attention kernel, its reference, the
shared-memory model, the timing harness and a CUDA lowering check.

Names are loaded on first use (PEP 562) so that ``import kernels.smem`` stays jax-free for
the control plane, while ``from kernels import flash_attention`` still works.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "AttentionConfig": "kernels.config",
    "auto_config": "kernels.config",
    "inner_for": "kernels.config",
    "attention_flops": "kernels.config",
    "build": "kernels.attention",
    "flash_attention": "kernels.attention",
    "attention_reference": "kernels.reference",
    "build_reference": "kernels.reference",
    "make_inputs": "kernels.reference",
    "rel_err": "kernels.reference",
    "Timing": "kernels.timing",
    "compile_fn": "kernels.timing",
    "measure": "kernels.timing",
    "lower_for_cuda": "kernels.lowering",
    "MODES": "kernels.smem",
    "DTYPES": "kernels.smem",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
