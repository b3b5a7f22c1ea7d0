"""A named GPU standing in as jax's default device, on a machine that has none (a CPU).

tokamax chooses its kernel module, its autotuning search space, its heuristics and the grid of
its persistent kernels from ``jax.extend.backend.get_default_device()``: the device's
``compute_capability``, ``core_count`` and ``device_kind``. jax's Mosaic GPU lowering reads the
same function for the architecture it lowers for (``_infer_arch``, when that device's kind is the
abstract mesh's). On a CPU the default device is the CPU, which has none of them, so tokamax
refuses ("Not supported on cpu") or picks nothing. ``default_device`` replaces that one function,
for the duration of a block, with a stand-in of the target GPU (name, compute capability, SM
count; ``kernels.devices`` has them per kind); with it tokamax's enumeration, heuristics, cache
lookup and lowering behave as they would on that GPU, short of compiling PTX.

The replacement is process-wide (jax has one default device): other threads see the stand-in
while a block runs. Blocks nest, from any thread, for the same device kind; a block for another
kind while one is active is refused (``RuntimeError``), since one of them would see the wrong GPU.
A GPU worker never needs this: its default device is the GPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax.extend.backend as jex_backend


@dataclass(frozen=True)
class StandIn:
    """What tokamax and jax's Mosaic GPU lowering read of the default device."""

    device_kind: str
    compute_capability: str  # "9.0", as a CUDA device reports it
    core_count: int
    platform: str = "gpu"
    id: int = 0


_lock = threading.Lock()
_active: StandIn | None = None
_depth = 0
_real: Callable[[], Any] | None = None


@contextlib.contextmanager
def default_device(device_kind: str, arch: tuple[int, int], cores: int) -> Iterator[StandIn]:
    """jax's default device is a stand-in for this GPU inside the block (the module docstring says why)."""
    global _active, _depth, _real
    fake = StandIn(device_kind, f"{arch[0]}.{arch[1]}", cores)
    with _lock:
        if _active is not None and _active != fake:
            raise RuntimeError(f"the default device already stands in for {_active.device_kind}; not {device_kind}")
        if _depth == 0:
            _real = jex_backend.get_default_device
            jex_backend.get_default_device = lambda: fake
            _active = fake
        _depth += 1
    try:
        yield fake
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                jex_backend.get_default_device = _real  # type: ignore[assignment]
                _active = None


def active() -> StandIn | None:
    """The stand-in in force, or None."""
    return _active
