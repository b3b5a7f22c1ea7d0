"""Pre-flight lowering: lower one config for a target GPU on this machine's CPU, and read back
what the compiler said about it.

The program is lowered under an abstract CUDA device of the target's kind
(``kernels.devices``: name, SM count; jax's Mosaic GPU lowering takes the architecture from it),
with Mosaic GPU's shared-memory check capped at the target's limit
(``artificial_shared_memory_limit``, jax's own hook; on a CPU the check already assumes the
227 KiB of sm_90/sm_100, so for the kinds known today the cap changes nothing). A Mosaic GPU
kernel that fits carries its exact shared-memory size in the lowered module (the
``dynamicSharedMemorySize`` operand of its ``gpu.launch``), read back per kernel by ``launches``;
one that does not is refused with a ``ValueError`` that gives both byte counts
(``smem_refusal``). Triton launches are lowered too, but Triton sizes shared memory only when
it compiles PTX, so their bytes stay the model's (``kernels.smem``).

What lowering cannot show: the PTX/SASS compile (register spills, ptxas limits) and run-time
errors. ``bench/gpu_check.py`` compares these verdicts with what the GPU compile did.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

from kernels import devices, impls
from kernels.impl_base import Fields

MOSAIC_CALL_TARGET = "mosaic_gpu_v2"
TRITON_CALL_TARGET = "__gpu$xla.gpu.triton"
_SMEM = re.compile(r"exceeds available shared memory: smem_bytes=(\d+) > max_smem_bytes=(\d+)")


def cpu_only() -> None:
    """Keep jax on the CPU in this process (no GPU backend is started to lower for one); must run
    before jax's backends start. A CUDA plugin then registers without probing for a GPU."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def smem_refusal(message: str) -> tuple[int, int] | None:
    """(bytes needed, bytes allowed) of a Mosaic GPU shared-memory refusal, or None."""
    m = _SMEM.search(message)
    return (int(m.group(1)), int(m.group(2))) if m else None


@contextlib.contextmanager
def target(device: devices.DeviceKind) -> Iterator[None]:
    """Lower for ``device`` inside the block (the module docstring says how)."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    abstract = AbstractDevice(device_kind=device.name, num_cores=device.cores, platform="cuda")
    with contextlib.ExitStack() as stack:
        stack.enter_context(use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=abstract)))
        core: Any = None
        try:
            from jax.experimental.mosaic.gpu import core
        except ImportError:  # a jax without Mosaic GPU: only Triton lowers here
            pass
        limit = getattr(core, "artificial_shared_memory_limit", None)
        if limit is not None:
            stack.enter_context(limit(device.smem_limit_bytes))
        yield


def lower(
    impl_name: str,
    mode: str,
    fields: Fields | None,
    *,
    batch: int,
    seq: int,
    heads: int,
    head_dim: int,
    dtype: str,
    kv_heads: int | None = None,
    causal: bool = False,
    device: devices.DeviceKind,
) -> list[tuple[str, int | None]]:
    """Lower implementation ``impl_name``'s program for one config (``fields`` None: its auto)
    for ``device``: its kernels in program order, each with its shared-memory bytes where the
    lowered module holds them. Raises whatever the lowering raises."""
    import jax
    import jax.numpy as jnp

    impl = impls.get(impl_name)
    q = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.dtype(dtype))
    kv = jax.ShapeDtypeStruct((batch, seq, heads if kv_heads is None else kv_heads, head_dim), jnp.dtype(dtype))
    with target(device):
        fn = impl.make(
            mode,
            fields,
            dtype=dtype,
            head_dim=head_dim,
            seq=seq,
            smem_limit_bytes=device.smem_limit_bytes,
            causal=causal,
            interpret=False,
        )
        lowered = jax.jit(fn).trace(q, kv, kv, q).lower(lowering_platforms=("cuda",))
    return launches(lowered.compiler_ir("stablehlo"))


def custom_calls(op: Any, found: list[Any] | None = None) -> list[Any]:
    """Every ``stablehlo.custom_call`` below ``op`` (a lowered module's operation), in program
    order: the kernel launches a lowering made."""
    found = [] if found is None else found
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                if child.name == "stablehlo.custom_call":
                    found.append(child)
                custom_calls(child, found)
    return found


def launches(module: Any) -> list[tuple[str, int | None]]:
    """(kernel name, shared-memory bytes or None) of every Mosaic GPU and Triton launch of a
    lowered StableHLO module, in program order."""
    from jax._src.lib.mlir import ir

    out: list[tuple[str, int | None]] = []
    for op in custom_calls(module.operation):
        target_name = ir.StringAttr(op.attributes["call_target_name"]).value
        if target_name == MOSAIC_CALL_TARGET:
            blob = ir.StringAttr(ir.DictAttr(op.attributes["mhlo.backend_config"])["module"]).value_bytes
            out.append(_mosaic_kernel(blob))
        elif target_name == TRITON_CALL_TARGET:
            out.append((ir.StringAttr(ir.DictAttr(op.attributes["mhlo.backend_config"])["name"]).value, None))
    return out


def _mosaic_kernel(blob: bytes) -> tuple[str, int | None]:
    """(symbol name, dynamic shared memory of its launch) of one serialized Mosaic GPU module.
    The ``gpu.launch`` op's last operand is its dynamic shared-memory size, a constant."""
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic.gpu import dialect

    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    dialect.register_dialect(ctx)
    found: list[int] = []

    def visit(op: Any) -> Any:
        if op.operation.name.endswith("gpu.launch"):
            operands = op.operation.operands
            const = operands[len(operands) - 1].owner
            found.append(ir.IntegerAttr(const.attributes["value"]).value)
        return ir.WalkResult.ADVANCE

    with ctx:
        module = ir.Module.parse(blob)
        name = ir.StringAttr(module.operation.attributes["sym_name"]).value
        module.operation.walk(visit)
    return name, (found[0] if found else None)
