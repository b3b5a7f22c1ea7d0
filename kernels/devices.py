"""The GPUs a sweep can name as its target (``kernel.device_kind``), without jax.

Pre-flight lowering stands in for the target on a CPU: it lowers under an abstract CUDA device
of that kind (``kernels.preflight``), which needs the kind's name, its SM count and its compute
capability, and it holds each kernel to the kind's shared memory per block. Names are jax's
``device_kind`` strings, the ones a worker on that GPU records, so a sweep's target and the
environment its records come from compare as they are.

What the limits rest on: the per-block opt-in shared memory of compute capabilities 9.0 and
10.x is 227 KiB (232448 bytes; CUDA programming guide, and jax's Mosaic GPU ``core.py``, which
falls back to the same 227 * 1024 when the device it lowers on has no such attribute, as a
CPU has not). So every kind here has that limit, and the Mosaic GPU compiler's verdict on a
CPU is the verdict for these GPUs; ``kernels.preflight`` still caps lowering at the kind's
limit, so a kind with less is held to its own. SM counts are the public specifications.
Where the name comes from is said per kind (``source``): only "NVIDIA H100" was seen on a
GPU (the reference run's device block).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.spelling import as_json

SM90_SMEM_LIMIT_BYTES = 232448  # 227 KiB: per-block opt-in shared memory of sm_90 and sm_100


@dataclass(frozen=True)
class DeviceKind:
    """One target GPU as pre-flight lowering stands in for it."""

    name: str  # jax's device_kind
    arch: tuple[int, int]  # compute capability (major, minor)
    cores: int  # streaming multiprocessors
    smem_limit_bytes: int  # shared memory per block, opt-in maximum
    source: str  # where this name and these numbers come from

    @property
    def sm(self) -> str:
        """``sm_90`` style name of the architecture."""
        return f"sm_{self.arch[0]}{self.arch[1]}"


KINDS: dict[str, DeviceKind] = {
    k.name: k
    for k in (
        DeviceKind("NVIDIA H100", (9, 0), 132, SM90_SMEM_LIMIT_BYTES, "the reference run's device block (jax 0.11.2)"),
        DeviceKind("NVIDIA H100 80GB HBM3", (9, 0), 132, SM90_SMEM_LIMIT_BYTES, "tokamax's shipped H100 tables (SXM)"),
        DeviceKind("NVIDIA H200", (9, 0), 132, SM90_SMEM_LIMIT_BYTES, "not seen on a GPU here; jax's name assumed"),
        DeviceKind("NVIDIA B200", (10, 0), 148, SM90_SMEM_LIMIT_BYTES, "tokamax's shipped B200 tables"),
    )
}
DEFAULT_DEVICE_KIND = "NVIDIA H100"  # the reference run's GPU: a spec that names none targets it


def get(name: str) -> DeviceKind:
    """The device kind called ``name``, or ValueError listing the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        known = ", ".join(as_json(k) for k in KINDS)
        meant = {_plain(k): k for k in KINDS}.get(_plain(name))
        hint = f" (did you mean {as_json(meant)}? a kind is spelled as jax's device_kind spells it)" if meant else ""
        raise ValueError(f"unknown device kind {as_json(name)}{hint}; known kinds: {known}") from None


def _plain(name: str) -> str:
    """A device kind's name as a near miss of it may spell it: in lower case, ``_`` or ``-`` for a
    space (tokamax's folder of a kind, ``nvidia_h200``)."""
    return " ".join(name.lower().replace("_", " ").replace("-", " ").split())
