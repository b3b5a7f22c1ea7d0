"""Where a worker runs: the device block its records carry, whether jax sees the GPU its task
was given, and which SLURM task it is (``jobs.worker`` writes them into each attempt's header).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

from kernels import tokamax_meta
from orchestrator.errors import WorkerEnvironmentError
from orchestrator.store.lines import DeviceBlock


def device_block() -> DeviceBlock:
    """The reference document's ``device`` block, plus jaxlib and, where it is installed,
    tokamax's version (both part of the fingerprint)."""
    import jax

    devices = jax.devices()
    block: DeviceBlock = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in devices],
        "python": platform.python_version(),
        "device_kind": devices[0].device_kind,
        "jaxlib": importlib.metadata.version("jaxlib"),
    }
    found = tokamax_meta.version()
    if found is not None:
        block["tokamax"] = found
    return block


def check_backend(
    interpret: bool | str,
    backend: str | None,
    visible: str | None,
    spec_file: os.PathLike[str] | str,
    impl: str = "tilesweep",
) -> None:
    """A GPU task whose jax sees no GPU would silently time the kernels in interpret mode on
    the CPU: refuse that unless the spec asks for interpret mode on purpose. A kernel that has
    no interpret mode (``kernels.impls``: ``capabilities.interpret``) is refused without a GPU, and
    one of tokamax's where tokamax is not installed (one line naming the extra)."""
    from kernels import impls

    if backend != "gpu" and not impls.get(impl).capabilities.interpret:
        raise WorkerEnvironmentError(
            f"kernel.impl {impl!r} in {spec_file} does not run without a GPU and jax sees none here (backend "
            f"{backend}): run it on a GPU node, or check its configs with `tilesweep plan SPEC --lower`"
        )
    if impl in tokamax_meta.IMPL_NAMES and tokamax_meta.version() is None:
        raise WorkerEnvironmentError(f"{tokamax_meta.missing(f'kernel.impl {impl!r} in {spec_file}')} on this node")
    if backend == "gpu" or interpret is True:
        return
    if interpret is False:
        raise WorkerEnvironmentError(
            f"kernel.interpret is false in {spec_file} but jax sees no GPU here (backend {backend}); run on a GPU "
            "node with the CUDA jaxlib (pip install 'tilesweep[cuda]'), or set kernel.interpret to auto or true"
        )
    if visible and visible.strip() not in ("", "NoDevFiles", "-1"):
        raise WorkerEnvironmentError(
            f"this task was given GPU(s) CUDA_VISIBLE_DEVICES={visible} but jax sees none (backend {backend}); install "
            "the CUDA jaxlib on the nodes (pip install 'tilesweep[cuda]', or load it in executor.slurm_setup), or set "
            f"kernel.interpret: true in {spec_file} to time interpret mode on purpose"
        )


def slurm_task() -> str | None:
    """The SLURM task this worker runs in, as users see it: ``55_3`` for task 3 of array 55
    (SLURM_JOB_ID alone is the task's raw id, which no user command shows), else the job id."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")
