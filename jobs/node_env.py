"""Where a worker runs: the device block its records carry, whether jax sees the GPU its task
was given, and which SLURM task it is (``jobs.worker`` writes them into each attempt's header).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

from kernels import tokamax_meta
from kernels.spelling import as_json
from orchestrator import PROG, word
from orchestrator.errors import SweepDirError, WorkerEnvironmentError
from orchestrator.store.files import read_text
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
            f"kernel.impl {as_json(impl)} in {spec_file} does not run without a GPU and jax sees none here (backend "
            f"{backend}): run it on a GPU node, or check its configs with `tilesweep plan SPEC --lower`"
        )
    if impl in tokamax_meta.IMPL_NAMES and tokamax_meta.version() is None:
        missing = tokamax_meta.missing(f"kernel.impl {as_json(impl)} in {spec_file}")
        raise WorkerEnvironmentError(f"{missing} on this node")
    if backend == "gpu" or interpret is True:
        return
    given = bool(visible and visible.strip() not in ("", "NoDevFiles", "-1"))
    if interpret is False:  # auto times interpret mode only where no GPU was given
        raise WorkerEnvironmentError(
            f"kernel.interpret is false in {spec_file} but jax sees no GPU here (backend {backend}); "
            + _ways_on(spec_file, "true" if given else "auto or true")
        )
    if given:
        raise WorkerEnvironmentError(
            f"this task was given GPU(s) CUDA_VISIBLE_DEVICES={visible} but jax sees none (backend {backend}); "
            + _ways_on(spec_file, "true")
        )


def _ways_on(sweep_json: os.PathLike[str] | str, interpret: str) -> str:
    """The two ways on from a sweep whose workers find no GPU, each a command that takes it: the
    CUDA jaxlib where they run, then ``resume`` (with ``--spec`` on SLURM, whose executor section
    may load it: not part of the fingerprint); or interpret mode on purpose, which is another
    sweep (``kernel.interpret`` is part of the fingerprint: ``resume --spec`` refuses it, and the
    sweep's frozen ``sweep.json`` is not the user's to edit)."""
    root = Path(sweep_json).parent
    spec = word(_planned_from(Path(sweep_json)) or "SPEC")
    if slurm_task() is not None:
        fix = (
            "install the CUDA jaxlib on the nodes (pip install 'tilesweep[cuda]', or load it in "
            f"executor.slurm_setup of {spec}), then `{PROG} resume {word(root)} --spec {spec}`"
        )
        again = "submit"
    else:
        fix = f"install the CUDA jaxlib here (pip install 'tilesweep[cuda]'), then `{PROG} resume {word(root)}`"
        again = "run"
    return (
        f"{fix}; or, to time interpret mode on purpose, set kernel.interpret to {interpret} in {spec} and "
        f"`{PROG} {again} {spec}`, another sweep (kernel.interpret is part of its fingerprint)"
    )


def _planned_from(sweep_json: Path) -> str | None:
    """The spec file a sweep was planned from, as its ``sweep.json`` names it (None where it
    names none or cannot be read)."""
    try:
        source = json.loads(read_text(sweep_json)).get("spec_source")
    except (OSError, ValueError, AttributeError, SweepDirError):
        return None
    return source if isinstance(source, str) else None


def slurm_task() -> str | None:
    """The SLURM task this worker runs in, as users see it: ``55_3`` for task 3 of array 55
    (SLURM_JOB_ID alone is the task's own job id, which squeue and sacct print only when asked
    for it, as ``squeue -o %A`` and ``sacct -o JobIDRaw``; `tilesweep logs` takes it too), else
    the job id."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")
