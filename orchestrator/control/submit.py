"""Submitting a sweep to SLURM: its unfinished units, planned from a spec or reopened, and a
refusal that changes nothing.

``submit_spec`` plans a spec (or reopens its sweep directory) and submits its unfinished
units; ``submit_unfinished`` does the same for a directory that exists (``run`` with the
slurm executor); ``dry_run`` shows what ``submit`` would do. The units go through
``arrays.submit_with_merge``, as ``resume``'s and a next round's do. Nothing here prints: the
results say what was submitted, and ``on_planned`` hooks let the caller speak before sbatch
is called.

A refused submission changes nothing: the tools are checked before anything is written, and
when sbatch refuses the first array the units added for it and a sweep directory created for
it are removed again (``dispatch`` removes submitit's temp files).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.spelling import as_json
from orchestrator import PROG, counted, word
from orchestrator.control import dispatch
from orchestrator.control.arrays import SubmitOutcome, per_array, require_cluster_takes, submit_with_merge
from orchestrator.control.reuseplan import ReuseRequest
from orchestrator.control.rounds import after_merge as after_merge  # merge jobs of 0.1.0 pickled it as submit's
from orchestrator.control.rounds import merge_hook
from orchestrator.control.scheduler import require_submit_tools
from orchestrator.control.sweeps import default_sweep_dir, prepare_sweep, slurm_jobs, sweep_lock, unfinished_units
from orchestrator.errors import DispatchError, SpecError
from orchestrator.spec.executor_section import ExecutorSettings
from orchestrator.spec.model import SweepSpec
from orchestrator.store.merge_output import ANOTHER_OUTPUT, check_target
from orchestrator.store.sweepdir import SweepDir


@dataclass
class SweepSubmission:
    """What ``submit_spec`` / ``submit_unfinished`` found and did: the sweep's units, those
    not done yet, and the outcome of submitting them (None when every unit was done)."""

    sd: SweepDir
    units: int
    todo: list[str] = field(default_factory=list)
    outcome: SubmitOutcome | None = None
    existed: bool = True  # planned before this submission (false: planned by it)


OnPlanned = Callable[[SweepSubmission], None]


def _submit_todo(
    sd: SweepDir,
    settings: ExecutorSettings,
    max_array_size: int | None,
    on_planned: OnPlanned | None,
    *,
    existed: bool = True,
    spec_file: str | None = None,
) -> SweepSubmission:
    """Under the sweep's lock: submit every unit that is not done. What the cluster would refuse
    before sbatch is refused before ``on_planned`` tells of the sweep, whose directory a refused
    submission removes again."""
    result = SweepSubmission(sd=sd, units=len(sd.unit_index()), todo=unfinished_units(sd), existed=existed)
    if result.todo:
        require_cluster_takes(settings, sd.spec, spec_file=spec_file or sd.meta.get("spec_source"))
    if on_planned is not None:
        on_planned(result)
    if result.todo:
        result.outcome = submit_with_merge(
            sd, result.todo, settings, origin="submit", max_array_size=max_array_size, then=merge_hook(sd)
        )
    return result


def submit_spec(
    spec_path: str,
    *,
    sweep_dir: str | None,
    units: int | None,
    output: str | None,
    costs: str | None,
    max_array_size: int | None,
    on_planned: OnPlanned | None = None,
    reuse: ReuseRequest | None = None,
    wait_lowering: Callable[[Path], None] | None = None,
) -> SweepSubmission:
    """Plan (or reopen) the sweep of a spec and submit its unfinished units. A directory
    that was submitted already is refused (``resume`` submits what it misses); a directory
    made for a submission that failed is removed again. ``wait_lowering`` is given the sweep
    directory before anything is submitted, to wait for a ``plan --lower`` of it."""
    from orchestrator.spec.files import load_spec

    spec = slurm_spec(spec_path, load_spec(spec_path))
    require_submit_tools()
    root = Path(sweep_dir) if sweep_dir else default_sweep_dir(spec_path, spec)
    created = not root.exists()
    sd: SweepDir | None = None
    try:  # a stop while planning leaves no half-made directory either
        sd, _, existed = prepare_sweep(spec_path, str(root), units, output, costs=costs, reuse=reuse, spec=spec)
        # its final merge job would refuse the output after the GPU time was spent: refused now
        check_target(
            sd,
            overwrite=f"move it away first (`{PROG} run` and `{PROG} merge` take --overwrite)",
            elsewhere=ANOTHER_OUTPUT,
        )
        if wait_lowering is not None:  # before the sweep's lock, which other commands take meanwhile
            wait_lowering(sd.root)
        with sweep_lock(sd):
            if jobs := slurm_jobs(sd):
                raise DispatchError(
                    f"{sd.root} was submitted already ({counted(jobs, 'job')} in {sd.root / 'jobs.jsonl'}); "
                    f"see `{PROG} status {word(sd.root)}`, and `{PROG} resume {word(sd.root)}` submits its missing "
                    "items"
                )
            return _submit_todo(sd, spec.executor, max_array_size, on_planned, existed=existed, spec_file=spec_path)
    except BaseException:
        if created and (sd is None or (not existed and not slurm_jobs(sd))):
            shutil.rmtree(root, ignore_errors=True)  # a sweep directory made for nothing
        raise


def slurm_spec(spec_path: str, spec: SweepSpec) -> SweepSpec:
    """The spec ``submit`` sends to SLURM: one that names no executor gets the slurm executor, so
    its sweep says so (``resume`` and the final merge job's next round go to SLURM too, not here);
    one that names another executor is refused (it went to the default partition without a
    GPU, and ``resume`` ran it here, as its spec says)."""
    if spec.executor.kind == "slurm":
        return spec
    if "kind" in spec.executor.model_fields_set:
        raise SpecError(
            f"{spec_path}: executor.kind is {as_json(spec.executor.kind)}, and `{PROG} submit` sends the units to "
            f'SLURM: set executor.kind to "slurm" (with its slurm_partition and gpus_per_node), or '
            f"`{PROG} run {word(spec_path)}` runs the sweep here"
        )
    return spec.model_copy(update={"executor": spec.executor.model_copy(update={"kind": "slurm"})})


def submit_unfinished(
    sd: SweepDir, settings: ExecutorSettings, *, on_planned: OnPlanned | None = None
) -> SweepSubmission | None:
    """Submit the units of an existing sweep directory that are not done (``run`` with the
    slurm executor, on a directory never submitted to SLURM); None, submitting nothing, when
    another command submitted it meanwhile (checked under the sweep's lock)."""
    require_submit_tools()
    with sweep_lock(sd):
        if slurm_jobs(sd):
            return None
        return _submit_todo(sd, settings, None, on_planned)


@dataclass
class DryRun:
    """What ``submit`` would do, made without writing or submitting anything: the units,
    how they map to arrays and tasks (``arrays[a][t]`` = the units of task ``t`` of array
    ``a``, which its ``per_task`` GPUs take in turn), and the sbatch scripts submitit would write."""

    root: Path
    planned: int
    sizes: dict[str, int]  # unit -> items
    per_task: int  # GPUs of a task: the units it runs at once
    per_array: int
    why: str
    arrays: list[list[list[str]]]
    scripts: list[str]
    merge_script: str | None
    reused: dict[str, Any] | None = None  # what planning would reuse (``Found.summary``), planned here
    gpus: int = 1  # GPUs a task asks for (executor.gpus_per_node; 0: none, a CPU task)
    asked: int | None = None  # units a new plan was asked for (--units, sharding.units); None: a plan kept


def _kept_units(sd: SweepDir, settings: ExecutorSettings) -> tuple[dict[str, int], dict[str, float] | None]:
    """The units ``submit`` would submit of a planned sweep directory (its unfinished ones, with
    their items), and their costs where a task takes several in turn (its GPUs take the longest
    first); one submitted already is refused, as ``submit`` refuses it."""
    if slurm_jobs(sd):
        raise DispatchError(
            f"{sd.root} was submitted already; `{PROG} resume {word(sd.root)}` submits its missing items"
        )
    todo = set(unfinished_units(sd))
    sizes = {u["id"]: u["n_items"] for u in sd.unit_index() if u["id"] in todo}
    return sizes, dispatch.unit_costs(sd, list(sizes)) if settings.units_per_task() > 1 else None


def dry_run(
    spec_path: str,
    *,
    sweep_dir: str | None,
    units: int | None,
    costs: str | None,
    max_array_size: int | None,
    output: str | None = None,
    reuse: ReuseRequest | None = None,
) -> DryRun:
    """``submit --dry-run``: plan in memory, with reuse as ``submit`` would (or read the units of
    an existing, never submitted sweep directory) and render the sbatch scripts; nothing is written."""
    from orchestrator.control.reuseplan import plan_with_reuse
    from orchestrator.planning.costs import unit_cost
    from orchestrator.spec.files import load_spec
    from orchestrator.store.document import load_costs

    spec = slurm_spec(spec_path, load_spec(spec_path))
    settings = spec.executor
    require_submit_tools()
    root = Path(sweep_dir) if sweep_dir else default_sweep_dir(spec_path, spec)
    opened = SweepDir.open(root) if (root / "sweep.json").exists() else None
    if opened is not None and opened.unit_index():  # one with no unit is planned again, as submit does
        sd = opened
        sizes, unit_secs = _kept_units(sd, settings)
        planned, reused, asked = sd.planned, None, None
    else:
        sd = SweepDir(root)
        p = plan_with_reuse(
            spec, root, Path(output or spec.output), units, load_costs(costs) if costs else None, reuse, "slurm"
        )
        sizes, planned, reused = {u.id: len(u.items) for u in p.units}, p.size, p.found.summary()
        asked = units or spec.sharding.units
        whole_node = settings.units_per_task() > 1
        unit_secs = {u.id: unit_cost(u.items, spec, u.round) for u in p.units} if whole_node else None
    size, why = per_array(settings, max_array_size, len(sizes))
    if sizes:  # what submit would refuse before sbatch, refused here as it would be
        require_cluster_takes(settings, spec, spec_file=spec_path)
    groups = dispatch.tasks_of(list(sizes), settings.units_per_task(), unit_secs)
    arrays = [groups[i : i + size] for i in range(0, len(groups), size)]
    scripts, merge_script = dispatch.render_scripts(sd, settings, [len(a) for a in arrays])
    _refused_by_sbatch(spec_path, scripts, settings)
    return DryRun(
        root=root,
        planned=planned,
        sizes=sizes,
        per_task=settings.gpus_per_task(),
        per_array=size,
        why=why,
        arrays=arrays,
        scripts=scripts,
        merge_script=merge_script,
        reused=reused,
        gpus=settings.gpus_per_node or 0,
        asked=asked,
    )


def _refused_by_sbatch(spec_path: str, scripts: list[str], settings: ExecutorSettings) -> None:
    """What sbatch would refuse of the units' arrays (an option it does not know, a value it
    cannot read), refused as ``submit`` would have it refused, naming the spec: each array's script
    differs only in its size, so the first one is asked (``sbatch --test-only``, nothing submitted)."""
    from orchestrator.control.dispatch.sbatch import test_only

    refusal = test_only(scripts[0], settings) if scripts else None
    if refusal is not None:
        raise DispatchError(f"{spec_path}: {refusal}")
