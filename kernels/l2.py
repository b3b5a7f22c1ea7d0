"""A cold L2 cache before each timed sample, as Triton's ``do_bench`` makes it.

A kernel timed right after its previous call finds its inputs in the GPU's L2 cache (50 MB on
an H100), which a real training step, between other kernels, does not. So before each sample
the timing harness overwrites a buffer several times larger than any current L2 (256 MiB, the
size ``do_bench`` uses): whatever the cache held is evicted. The buffer is donated, so the
overwrite is in place and allocates nothing per sample.

What it leaves out: a sample is ``inner`` back-to-back calls, and only the first of them starts
cold; with the device timer a sample can be a single call (``timing.max_inner: 1``) to make
every timed call cold. Off on the CPU unless asked for (``timing.flush_l2: true``): interpret
mode is not a model of a GPU's caches.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

FLUSH_BYTES = 256 * 2**20


def overwrite(buf: jax.Array) -> jax.Array:
    """Read and write every element of ``buf`` (what is jitted, with ``buf`` donated)."""
    return buf + 1


def buffer_shape(nbytes: int = FLUSH_BYTES) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((nbytes // 4,), jnp.int32)


def jitted() -> Any:
    """The flush as it runs (and as ``kernels.lowering.lower_flush_for_cuda`` lowers it)."""
    return jax.jit(overwrite, donate_argnums=0)


class L2Flush:
    """``flush()`` overwrites a ``nbytes`` device buffer and waits for it."""

    def __init__(self, nbytes: int = FLUSH_BYTES) -> None:
        self.nbytes = nbytes
        self._fn = jitted()
        self._buf = jnp.zeros(buffer_shape(nbytes).shape, jnp.int32)

    def __call__(self) -> None:
        self._buf = jax.block_until_ready(self._fn(self._buf))


def wanted(setting: Any, backend: str) -> bool:
    """Whether ``timing.flush_l2`` asks for the flush here: ``auto`` on a GPU only."""
    if setting == "auto":
        return backend == "gpu"
    return bool(setting)
