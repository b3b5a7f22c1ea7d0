"""Lower the kernel for CUDA on a machine without a GPU, and read back what reached Triton.

Interpret mode checks the numbers but never runs the Triton lowering, and it ignores
num_warps/num_stages entirely. Lowering under an abstract CUDA mesh does run the Pallas ->
Triton lowering of every kernel and leaves one ``__gpu$xla.gpu.triton`` custom call per launch,
carrying name, num_warps, num_stages and grid. So a CPU test can prove that a config lowers
and that its warps and stages reached every launch. What it cannot show: the PTX compile and
the real shared-memory use (``.compile()`` needs the CUDA plugin).
"""

from __future__ import annotations

from typing import Any

import jax
from jax._src.lib.mlir import ir
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from kernels import impl_triton, impls, l2
from kernels.config import AttentionConfig
from kernels.preflight import TRITON_CALL_TARGET, custom_calls
from kernels.smem import dtype_name

_DEVICE = AbstractDevice(device_kind="NVIDIA H100", num_cores=132, platform="cuda")


def _triton_calls(module: Any) -> list[dict[str, Any]]:
    calls = []
    for op in custom_calls(module.operation):
        if op.attributes["call_target_name"].value != TRITON_CALL_TARGET:
            continue
        cfg = op.attributes["mhlo.backend_config"]
        calls.append(
            {
                "name": cfg["name"].value,
                "num_warps": cfg["num_warps"].value,
                "num_stages": cfg["num_stages"].value,
                "grid": tuple(cfg[f"grid_{axis}"].value for axis in "xyz"),
                "operands": [tuple(ir.RankedTensorType(v.type).shape) for v in op.operands],
            }
        )
    return calls


def lower_for_cuda(
    mode: str,
    config: AttentionConfig,
    *,
    batch: int,
    seq: int,
    heads: int,
    head_dim: int,
    dtype: Any,
    kv_heads: int | None = None,
    causal: bool = False,
    impl: str = impls.DEFAULT_IMPL,
) -> list[dict[str, Any]]:
    """Triton launches of implementation ``impl``'s ``build(mode, config)`` lowered for an
    H100, in program order (``kv_heads=None``: multi-head attention).

    Each entry: ``{"name", "num_warps", "num_stages", "grid": (x, y, z), "operands": [shapes]}``
    (the shapes of the arrays the launch receives, in its argument order). Raises whatever
    the lowering raises (a config Triton cannot express fails here, as on the GPU).
    """
    dt = dtype_name(dtype)
    q = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), dt)
    kv = jax.ShapeDtypeStruct((batch, seq, heads if kv_heads is None else kv_heads, head_dim), dt)
    fn = impl_triton.get(impl).build(mode, config, causal=causal, interpret=False)
    return _triton_calls(_lower(jax.jit(fn), q, kv, kv, q).compiler_ir("stablehlo"))


def _lower(jitted: Any, *shapes: Any) -> Any:
    """``jitted`` traced for ``shapes`` and lowered for CUDA on an abstract H100."""
    mesh = AbstractMesh((1,), ("x",), abstract_device=_DEVICE)
    with use_abstract_mesh(mesh):
        return jitted.trace(*shapes).lower(lowering_platforms=("cuda",))


def lower_flush_for_cuda(nbytes: int = l2.FLUSH_BYTES) -> str:
    """The L2 flush (``kernels.l2``) exactly as the timing harness jits it, lowered for an H100:
    the StableHLO text of a program that reads and writes every element of an ``nbytes`` buffer
    it is donated (so the write is in place)."""
    return str(_lower(l2.jitted(), l2.buffer_shape(nbytes)).as_text())
