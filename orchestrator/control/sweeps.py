"""One sweep directory's life outside the workers: create (or reopen) it from a spec, lock it,
say which of its units still need a job, cancel its arrays.

Nothing here prints: each function returns what it did or raises a ``TilesweepError``; the
CLI (and the local ``run``) decide what to show.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from jobs.compile_cache import resolve_cache_dir
from kernels.spelling import as_json
from orchestrator import PROG, word
from orchestrator.control.history import read_history
from orchestrator.control.reuseplan import Planned, ReuseRequest, plan_with_reuse
from orchestrator.control.scheduler import array_of, missing_tools, query
from orchestrator.control.scheduler import cancel as scancel
from orchestrator.control.status import ACTIVE, SweepStatus, sweep_status
from orchestrator.devicefiles import what_it_is
from orchestrator.errors import DispatchError, LeaseHeld, MismatchError, PlanError
from orchestrator.spec.model import SweepSpec
from orchestrator.store import envfile, tokamax_lists, unitfile
from orchestrator.store.filekinds import refuse_odd
from orchestrator.store.files import folder_refuses, same_file
from orchestrator.store.leases import Holder, read_holder, run_lease, run_lease_path
from orchestrator.store.lowering_todo import lowered_already
from orchestrator.store.sweep_paths import check_takes_files, is_spec_file, own_file
from orchestrator.store.sweep_paths import default_root as default_sweep_dir
from orchestrator.store.sweepdir import SweepDir, UnitEntry, now_iso

if TYPE_CHECKING:
    from orchestrator.store.merge import MergeSummary

log = logging.getLogger(__name__)

# How long a command waits for another one that holds the sweep directory's lock.
LOCK_TIMEOUT_S = 60.0


class PreparedSweep(NamedTuple):
    """A sweep directory ready to run: the directory, its units in order, and whether it
    existed before (then it was reopened, not planned again). What planning reused,
    ``store.reuse.read_summary`` says."""

    sd: SweepDir
    unit_ids: list[str]
    existed: bool


def prepare_sweep(
    spec_path: str,
    sweep_dir: str | None,
    units: int | None,
    output: str | None,
    costs: str | None = None,
    reuse: ReuseRequest | None = None,
    kind: str | None = None,
    spec: SweepSpec | None = None,
    planned: Planned | None = None,
    overwrite: bool = False,
) -> PreparedSweep:
    """Create (or reopen) the sweep directory of a spec. An existing directory of the same
    spec is reopened with the units it was planned with, so a rerun redoes only what is
    missing. A new one is planned with reuse (``reuseplan``: what the output document and
    ``reuse`` documents hold is carried, not measured). ``costs``: a results document whose
    measured costs shard the units. ``kind``: the executor it will run on (default: the spec's).
    ``spec``: the spec file's spec as the command line changed it (``--device-kind``).
    ``planned``: that plan, made already by the caller (``plan`` shows it first), so that its
    warnings are said once. A reopened sweep given another output moves to it only once the
    directory reads whole and the output holds no other sweep's records (unless ``overwrite``):
    a refusal changes nothing."""
    from orchestrator.spec.files import load_spec
    from orchestrator.store.carried import write_reuse_unit
    from orchestrator.store.document import load_costs
    from orchestrator.store.searchrounds import write_round

    spec = spec if spec is not None else load_spec(spec_path)
    check_replay_source(spec)
    root = Path(sweep_dir) if sweep_dir else default_sweep_dir(spec_path, spec)
    out = Path(output) if output else Path(spec.output)
    _check_output(out, f"--output {out}" if output else f"output {out} of {spec_path}", root, spec_path)
    existed = (root / "sweep.json").exists()
    if existed:
        sd = SweepDir.create(root, spec, output=out.resolve(), spec_source=None, planned=0)
        index = _reopened_units(sd)  # a damaged one is refused before the output moves: a refusal changes nothing
        _check_cache_dir(sd.spec, root, planned_as=True)
        if out.resolve() != sd.output and (output or _edited_output(sd, spec, spec_path)):
            _check_before_move(sd, out.resolve(), overwrite, here=kind in ("local", "debug"))
            sd = _move_output(sd, out.resolve())
        if index:
            return PreparedSweep(sd=sd, unit_ids=[u["id"] for u in index], existed=existed)
    if not existed:  # (one reopened had its planned cache folder checked above)
        SweepDir.check_new(root)
        _check_cache_dir(spec, root, planned_as=False)
    if planned is None:
        planned = plan_with_reuse(spec, root, out, units, load_costs(costs) if costs else None, reuse, kind)
    sd = SweepDir.create(
        root, spec, output=out.resolve(), spec_source=str(Path(spec_path).resolve()), planned=planned.size
    )
    with sweep_lock(sd):
        if not sd.unit_index():
            tokamax_lists.write(sd.root, spec)  # before the units: whoever reads them re-expands the plan
            sd.add_units(planned.units, origin="plan")
            if planned.reused is not None:
                write_reuse_unit(sd, planned.reused, planned.found)
            if planned.search is not None:  # last: its record says round 1 is planned
                planned.search.record["units"] = [u.id for u in planned.units]
                write_round(sd, planned.search.record)
    return PreparedSweep(sd=sd, unit_ids=[u["id"] for u in sd.unit_index()], existed=existed)


def _reopened_units(sd: SweepDir) -> list[UnitEntry]:
    """The unit index of a sweep directory reopened to run, each unit file checked against it
    (``unitfile``): one that no longer matches would fail its worker, and every rerun's again; and
    the directory itself checked to take new files, said before its compile cache (in it by default)."""
    index = sd.unit_index()
    for entry in index:
        unitfile.read_items(sd.root, entry["id"])
    check_takes_files(sd.root)
    return index


def _check_output(out: Path, given: str, root: Path, spec_path: str) -> None:
    """Refuse, before anything is measured, an output the merge at the end could not write: a
    directory, a device or a pipe (the merge renames its document into place: it would replace
    the node itself), the spec file itself, a file of the sweep directory ``root`` itself, or a
    path whose folder (its nearest existing one) takes no new files."""
    if is_spec_file(out, spec_path):
        raise PlanError(
            f"{given} is the spec file {spec_path} this command reads, which the results document would replace; "
            "name another file for the results document"
        )
    if own_file(root, out):
        raise PlanError(
            f"{given} is a file of the sweep directory {root} (or in one of its folders), which the results "
            "document would replace; name a file outside them"
        )
    if out.is_dir():
        raise PlanError(f"{given} is a directory; name a file for the results document")
    if out.exists() and not out.is_file():
        raise PlanError(f"{given} is {what_it_is(out)}, not a regular file; name a file for the results document")
    refused = folder_refuses(out)
    if refused is not None:
        folder, why = refused
        if why is None:
            raise PlanError(f"{given}: {folder} is not a directory; name a file in a folder")
        raise PlanError(
            f"{given}: the folder {folder} takes no new files ({why}), so the merge at the end could not write the "
            "results document; make it writable or name another output"
        )


def _check_cache_dir(spec: SweepSpec, root: Path, *, planned_as: bool) -> None:
    """Refuse, before anything is measured, a ``compile.cache_dir`` the workers could not make
    or write (a file on its path, a read-only folder): every unit failed on it (one in a sweep
    directory yet to make: that directory's making is refused first, saying why). ``planned_as``:
    the sweep keeps the cache folder it was planned with, which a new spec does not change."""
    path = resolve_cache_dir(spec.compile.cache_dir, root)
    if path is None or (not root.exists() and path.is_relative_to(root)):  # the sweep directory says it first
        return
    refused = folder_refuses(path / "entry")
    if refused is None:
        return
    folder, why = refused
    problem = f"{folder} is not a directory" if why is None else f"the folder {folder} takes no new files ({why})"
    fix = (
        "make it a folder you can write, or plan the sweep anew in another --sweep-dir with another "
        "compile.cache_dir (or 'off')"
        if planned_as
        else "make it a folder you can write, or set compile.cache_dir to another folder (or 'off')"
    )
    raise PlanError(f"compile.cache_dir {path}: {problem}, so no compile could be cached; {fix}")


def _edited_output(sd: SweepDir, spec: SweepSpec, spec_path: str) -> bool:
    """Whether the spec file the sweep was planned from names another output now (another spec
    file of the same fingerprint does not move the sweep's output: only ``--output`` does)."""
    source = sd.meta.get("spec_source")
    return spec.output != sd.spec.output and source is not None and Path(spec_path).resolve() == Path(source)


def _check_before_move(sd: SweepDir, out: Path, overwrite: bool, *, here: bool) -> None:
    """Refuse, before the output moves, what the command would refuse after it: another live
    ``run`` of the sweep (it merges into the sweep's output when it ends, whatever this says), a
    damaged sweep directory (its status reads every file of it), units to run ``here`` (a local
    or debug run) with another stack than this interpreter's, an output holding another sweep's
    records."""
    from orchestrator.store.merge_output import ANOTHER_OUTPUT, check_target

    runner = live_runner(sd)
    if runner is not None:
        raise DispatchError(
            f"{sd.root} is being run by another {runner.command()}, which merges into {sd.output} when it ends; "
            f"move the output to {out} once it has (`{PROG} wait {word(sd.root)}` follows it)"
        )
    st = sweep_status(sd, query_slurm=False)
    if here and any(u.to_run_here for u in st.units):
        check_interpreter_env(sd)
    if not overwrite:
        check_target(sd, out, elsewhere=ANOTHER_OUTPUT)


def check_interpreter_env(sd: SweepDir) -> None:
    """Workers run this interpreter: its jax, jaxlib and tokamax must be the ones the sweep was
    measured with (env.json), or every worker would refuse the sweep (and new records would not
    mix with the old ones)."""
    env = sd.recorded_env()
    if not env or sd.spec.kernel.impl == "replay":  # a replay runs no jax: its env is the source's
        return
    diff = envfile.installed_differences(env)
    if diff:
        raise MismatchError(
            f"the sweep in {sd.root} was measured with another stack (here vs the sweep's: {diff}; see "
            f"{sd.root / envfile.ENV_FILE}); "
            "run or resume it from the environment that made it, or start a new sweep directory"
        )


def _move_output(sd: SweepDir, out: Path) -> SweepDir:
    """A rerun of the sweep whose ``--output`` (or whose spec file's ``output``, edited since) is
    not the sweep's: its merges write ``out`` from now on (sweep.json says so, for every command
    and the final merge job); the document it merged into before is left as it is."""
    with sweep_lock(sd):
        was = sd.output
        sd.rewrite_meta(output=str(out))
    log.warning("%s merges into %s from now on (it merged into %s before, which is left as it is)", sd.root, out, was)
    return SweepDir.open(sd.root)


def check_runs_here(spec: SweepSpec, spec_file: str | Path | None, root: Path) -> None:
    """A sweep whose kernel does not run on a CPU (or whose spec says kernel.interpret false), run
    here without a GPU: refused in one line that says what this machine can do instead (its
    workers would record every config as an error, or fail): the ``plan --lower`` of its spec
    file (``spec_file``; None: not known) into its sweep directory ``root``, as the plan's note names it."""
    from kernels import impls

    if spec.kernel.impl == "replay":
        return
    impl = impls.get(spec.kernel.impl)
    if impl.capabilities.interpret and spec.kernel.interpret is not False:
        return
    import jax

    if jax.default_backend() != "gpu" and impl.capabilities.interpret:
        raise PlanError(
            f"kernel.interpret is false but jax sees no GPU here (backend {jax.default_backend()}): set "
            "kernel.interpret to auto (or true) to run the kernels in interpret mode on these CPUs, or run it on a GPU"
        )
    if jax.default_backend() != "gpu":
        lowered = lowered_already(spec, root)
        check = (
            f"its configs are lowered already ({lowered}), so run it where jax sees a GPU (`{PROG} resume "
            f"{word(root)}` there), or rehearse the sweep with kernel.impl replay"
            if lowered
            else f"check its configs here with `{PROG} plan {word(spec_file or 'SPEC')} --lower --sweep-dir "
            f"{word(root)}` (pre-flight lowering), rehearse the sweep with kernel.impl replay, or run it on a GPU"
        )
        raise PlanError(
            f"kernel.impl {as_json(impl.name)} does not run without a GPU and jax sees none here (backend "
            f"{jax.default_backend()}): {check}"
        )


def check_replay_source(spec: SweepSpec) -> None:
    """A replayed spec's source must be a results document of this spec: refused in one line
    before anything is planned (the workers would each fail on it)."""
    if spec.kernel.impl == "replay":
        from orchestrator.store.replaysource import load_source

        if spec.replay is not None and same_file(Path(spec.replay.source), Path(spec.output)):
            raise PlanError(
                f"replay.source {spec.replay.source} is this sweep's output: the replay would replace the "
                "measurements it replays; set output to another file"
            )
        load_source(spec)


@contextlib.contextmanager
def sweep_lock(sd: SweepDir) -> Iterator[None]:
    """The sweep directory's lock: one command at a time plans, submits, resumes or cancels."""
    from filelock import FileLock, Timeout

    refuse_odd(sd.lock_path)  # filelock would take a pipe or a device for its lock file
    try:
        with FileLock(str(sd.lock_path), timeout=LOCK_TIMEOUT_S):
            yield
    except Timeout:
        raise DispatchError(
            f"{sd.lock_path} is held by another {PROG} command for {LOCK_TIMEOUT_S:.0f} s; retry when it has finished"
        ) from None


def unfinished_units(sd: SweepDir) -> list[str]:
    """The units not done yet (from the sweep directory alone; SLURM is not asked)."""
    return [u.id for u in sweep_status(sd, query_slurm=False).units if u.state != "done"]


def slurm_jobs(sd: SweepDir) -> int:
    """How many SLURM jobs the sweep's history holds (0: never submitted to SLURM)."""
    return sum(1 for e in sd.job_history() if e.get("executor") == "slurm" and "event" not in e)


@dataclass
class Cancelled:
    """What ``cancel_sweep`` did: the sweep's status it judged by, the arrays it cancelled
    (none: nothing was pending or running on SLURM) and how many unfinished units they held."""

    status: SweepStatus
    arrays: list[str] = field(default_factory=list)
    units: int = 0


def cancel_sweep(sd: SweepDir) -> Cancelled:
    """Cancel every job array of the sweep that still has a pending or running unit, and
    record it, so status says "cancelled" even where SLURM keeps no record of a task."""
    with sweep_lock(sd):
        st = sweep_status(sd)
        active = sorted(
            {u.job_id for u in st.units if u.state in ACTIVE and u.executor == "slurm" and u.job_id},
            key=lambda j: (len(j), j),
        )
        arrays = sorted({array_of(j) for j in active}, key=lambda a: (len(a), a))
        if not arrays:
            return Cancelled(st)
        if missing_tools("scancel"):
            raise DispatchError("`scancel` is not on PATH; cancel from a login node of the cluster")
        scancel(arrays)
        # the tasks it cancelled, not every task of their arrays: one that had ended before (failed, or
        # cancelled by scancel) keeps what ended it in status
        event = {"event": "cancel", "arrays": arrays, "jobs": active}
        sd.record_jobs([{**event, "time": now_iso(), "ts": round(time.time(), 3)}])
    n = sum(1 for u in st.units if u.state in ACTIVE and u.job_id and array_of(u.job_id) in arrays)
    return Cancelled(st, arrays=arrays, units=n)


GPU_HOURS_SOURCE = "sacct: elapsed x allocated GPUs, every run of every task of the sweep's arrays"


def accounting(sd: SweepDir) -> dict[str, Any]:
    """The GPU-hours a sweep's SLURM tasks have used so far, for the results document's
    ``tilesweep`` block (empty for a sweep never run on SLURM, or where sacct cannot say)."""
    jobs = read_history(sd).slurm_jobs
    if not jobs:
        return {}
    hours = query(jobs).gpu_hours(jobs)
    return {} if hours is None else {"gpu_hours": hours, "gpu_hours_source": GPU_HOURS_SOURCE}


def merge_sweep(
    sd: SweepDir, *, output: Path | None = None, overwrite: bool = False, skip_empty: bool = False
) -> MergeSummary:
    """``store.merge.merge`` with the sweep's GPU-hours in the document (one sacct call);
    ``skip_empty``: write no document where no unit recorded anything (a sweep's end)."""
    from orchestrator.store.merge import merge

    return merge(sd, output=output, extra=accounting(sd) or None, overwrite=overwrite, skip_empty=skip_empty)


@contextlib.contextmanager
def run_or_follow(sd: SweepDir, command: str) -> Iterator[Holder | None]:
    """For ``tilesweep run`` (and ``resume`` here), ``command``: hold the sweep's run lease for the
    block, naming ``command``, and yield None; or, when another live command holds it, yield that
    holder and hold nothing (the caller then follows its progress instead of starting work beside
    it, or refuses)."""
    for _ in range(3):  # the holder may let go between our try and our look
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(run_lease(sd.root, command))
        except LeaseHeld:
            holder = read_holder(run_lease_path(sd.root))
            if holder is None or not holder.live:
                continue
            yield holder
            return
        with stack:
            yield None
        return
    lease = run_lease_path(sd.root)
    if read_holder(lease) is None and lease.exists():  # a file that names no holder, written a moment ago
        raise DispatchError(f"{lease} names no holder (empty or damaged): delete it, or retry in a few seconds")
    raise DispatchError(f"{lease} changed hands three times in a row; retry")


def live_runner(sd: SweepDir) -> Holder | None:
    """The live command (``tilesweep run``, ``resume`` here) that holds the sweep's run lease, or None."""
    holder = read_holder(run_lease_path(sd.root))
    return holder if holder is not None and holder.live else None


def other_run_live(sd: SweepDir) -> bool:
    """Whether a live command (``tilesweep run``, ``resume`` here) holds the sweep's run lease."""
    return live_runner(sd) is not None
