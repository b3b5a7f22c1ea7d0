"""``tilesweep submit | resume | cancel | wait``, and ``run`` with the slurm executor.

``submit`` plans a spec and hands its units to SLURM as job arrays, records every job id in
the sweep directory and returns at once. Everything after that works from the sweep
directory alone, in any new process: ``status`` (any time), ``wait`` (a progress bar until
every unit has settled, then the merge and the best-config table), ``resume`` (the items
without a record, regrouped into new units), ``cancel`` (whole arrays). ``run`` with the
slurm executor is ``submit`` then ``wait``.

The final merge happens twice over, on purpose: a dependent job (``afterany`` on the arrays,
``executor.merge_job``) merges on the cluster even when nobody waits, and ``wait`` merges
again when it ends (idempotent; the merge lock serialises them).

A refused submission changes nothing: tools are checked before anything is written, and
when sbatch refuses the first array the units added for it and a sweep directory created
for it are removed again (submitit's temp files too).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.cli.main import positive_int
from orchestrator.errors import DispatchError, MismatchError
from orchestrator.spec.model import ExecutorSettings
from orchestrator.control.scheduler import JOB_COUNT_MARGIN, array_of, cancel as scancel, cluster_limits, missing_tools
from orchestrator.control.status import ACTIVE, SweepStatus, read_history, sweep_status
from orchestrator.store.sweepdir import SweepDir, atomic_write_text, now_iso

PROG = "tilesweep"
LOCK_TIMEOUT_S = 60.0


# ---------------------------------------------------------------------------- resume planning


@dataclass
class ResumePlan:
    """What ``resume`` would submit, computed from the partials (parsed: resume is rare)."""

    missing: list[Any] = field(default_factory=list)  # WorkItems without a record, free to submit
    held: int = 0  # items without a record whose unit is still pending or running
    active: list[str] = field(default_factory=list)  # those units
    recorded: int = 0
    missing_of: dict[str, set[str]] = field(default_factory=dict)  # ended unit -> its missing item ids
    starts: Counter = field(default_factory=Counter)  # item id -> starts that died, over all partials
    starts_by_unit: dict[str, Counter] = field(default_factory=dict)

    def prior_starts(self, unit_id: str, item_ids: list[str]) -> dict[str, int]:
        """Deaths on each item in partials other than this unit's own (the worker reads its own)."""
        own = self.starts_by_unit.get(unit_id, Counter())
        out = {iid: self.starts[iid] - own[iid] for iid in item_ids}
        return {iid: n for iid, n in out.items() if n > 0}


def check_interpreter_env(sd: SweepDir) -> None:
    """Workers run this interpreter: its jax and jaxlib must be the ones the sweep was
    measured with (env.json), or new records would not mix with the old ones."""
    env = sd.recorded_env()
    if not env:
        return
    here = {}
    for dist in ("jax", "jaxlib"):
        try:
            here[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            here[dist] = None
    diff = [f"{k} {here[k]} here vs {env.get(k)}" for k in here if env.get(k) is not None and here[k] != env.get(k)]
    if diff:
        raise MismatchError(
            f"the sweep in {sd.root} was measured with another stack ({', '.join(diff)}; see {sd.root / 'env.json'}); "
            "resume it from the environment that made it, or start a new sweep directory"
        )


def plan_resume(sd: SweepDir, st: SweepStatus, *, force: bool = False) -> ResumePlan:
    """Every planned item without a record in any partial, less those of units still pending
    or running (unless ``force``). Refuses partials of another spec or environment."""
    from orchestrator.store.partials import read_partial

    fingerprint = sd.spec.fingerprint()
    env = sd.recorded_env()
    plan = ResumePlan()
    recorded: set[str] = set()
    for entry in sd.unit_index():
        path = sd.partial_path(entry["id"])
        content = read_partial(path)
        for h in content.headers:
            if h.get("sweep") != fingerprint:
                raise MismatchError(f"{path} holds records of another spec (fingerprint {h.get('sweep')} != "
                                    f"{fingerprint}); resume refuses to mix them: move it out of {sd.partials}")
            if env is not None and h.get("env") != env:
                raise MismatchError(f"{path} was measured in another environment ({h.get('env')} vs {env} in "
                                    f"{sd.root / 'env.json'}); resume refuses to mix them: move it out of {sd.partials}")
        recorded.update(content.records)
        died = Counter({iid: n for iid, n in content.starts.items() if n > 0 and iid not in content.records})
        plan.starts_by_unit[entry["id"]] = died
        plan.starts.update(died)
    plan.recorded = len(recorded)
    # pending, running or requeued; a unit never submitted is "pending" too, but nothing runs it
    active = {u.id for u in st.units if u.state in ACTIVE and u.detail != "not submitted"}
    held: set[str] = set()
    if not force:
        plan.active = sorted(active)
        for uid in plan.active:
            held.update(it.id for it in sd.unit_items(uid))
    for u in st.units:
        if (u.id in active and not force) or u.complete or u.done >= u.total:
            continue
        missing = {it.id for it in sd.unit_items(u.id)} - recorded
        if missing:
            plan.missing_of[u.id] = missing
    for it in sd.items():
        if it.id in recorded:
            continue
        if it.id in held:
            plan.held += 1
        else:
            plan.missing.append(it)
    return plan


def group_missing(sd: SweepDir, missing: list[Any], n_units: int | None, default: int) -> list[Any]:
    """The missing items as units (``plan.shard``, cost model of the spec)."""
    from orchestrator.planning.costs import item_costs, setup_estimate
    from orchestrator.planning import shard

    spec = sd.spec
    costs, scale = item_costs(missing, spec)
    setups = {it.shape: setup_estimate(it.shape, spec.modes) * scale for it in missing}
    n = n_units or max(1, default)
    return shard(missing, min(n, len(missing)), costs=costs, setups=setups, strategy=spec.sharding.strategy)


# ---------------------------------------------------------------------------- submitting


def _per_array(settings: ExecutorSettings, override: int | None, n_units: int) -> tuple[int, str]:
    """Tasks per array: the override, the spec's ``max_array_size``, or the cluster's limits
    (read once). A sweep that can never fit in the controller's job table is refused."""
    limit = override or settings.max_array_size
    if limit is not None:
        return limit, "override" if override else "executor.max_array_size"
    limits = cluster_limits()
    if limits.max_job_count is not None and n_units > limits.max_job_count - JOB_COUNT_MARGIN:
        raise DispatchError(
            f"{n_units} units, but the cluster holds at most MaxJobCount={limits.max_job_count} jobs at once "
            "(every array task counts); plan fewer units (--units)"
        )
    return limits.per_array, f"MaxArraySize={limits.max_array_size} ({limits.source})"


def _check_tools() -> None:
    missing = missing_tools("sbatch", "srun")
    if missing:
        raise DispatchError(
            f"`{missing[0]}` is not on PATH, so nothing can be submitted to SLURM; run on a login node of the "
            "cluster (or load its module), or use executor kind local"
        )


@contextlib.contextmanager
def _lock(sd: SweepDir):
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(sd.lock_path), timeout=LOCK_TIMEOUT_S):
            yield
    except Timeout:
        raise DispatchError(f"{sd.lock_path} is held by another tilesweep command for {LOCK_TIMEOUT_S:.0f} s; "
                            "retry when it has finished") from None


class _UnitsRollback:
    """Undo ``add_units`` when nothing could be submitted: units.json and unit files as before."""

    def __init__(self, sd: SweepDir) -> None:
        self.sd = sd
        self.index_text = (sd.root / "units.json").read_text(encoding="utf-8")
        self.known = {u["id"] for u in sd.unit_index()}

    def undo(self, added: list[str]) -> None:
        for uid in added:
            if uid not in self.known:
                with contextlib.suppress(FileNotFoundError):
                    self.sd.unit_path(uid).unlink()
        atomic_write_text(self.sd.root / "units.json", self.index_text)


def _submit(sd: SweepDir, unit_ids: list[str], settings: ExecutorSettings, *, origin: str,
            max_array_size: int | None, prior: dict[str, dict[str, int]] | None = None) -> Any:
    """Submit units (and the final merge job); print what was submitted. On a refusal of the
    first array the caller undoes what it wrote; a later refusal is reported, not raised."""
    from orchestrator.control import dispatch

    per_array, why = _per_array(settings, max_array_size, len(unit_ids))
    attempts = dict(read_history(sd).submissions)
    sub = dispatch.submit_units(sd, unit_ids, settings, per_array=per_array, origin=origin, prior_starts=prior,
                                attempts=attempts)
    if sub.error is not None and not sub.entries:
        raise sub.error
    merge_line = None
    if settings.merge_job and sub.entries:  # before any printing: a closed stdout must not cost the merge job
        try:
            m = dispatch.submit_merge_job(sd, settings, sub.arrays)
            merge_line = f"final merge: job {m['job_id']} (afterany:{':'.join(sub.arrays)}) writes {sd.output}"
        except DispatchError as exc:
            print(f"{PROG}: warning: the final merge job was not submitted ({exc.message}); "
                  f"`{PROG} wait {sd.root}` or `{PROG} merge {sd.root}` merges", file=sys.stderr)
    by_array: dict[str, list[dict[str, Any]]] = {}
    for e in sub.entries:
        by_array.setdefault(e["array_id"], []).append(e)
    split = f" (at most {per_array} per array: {why})" if len(by_array) > 1 else ""
    print(f"submitted {len(sub.entries)} unit{'s' if len(sub.entries) != 1 else ''} as "
          f"{len(by_array)} job array{'s' if len(by_array) != 1 else ''}{split}:")
    for array, entries in by_array.items():
        ids = [e["job_id"] for e in entries]
        print(f"  {array}: {ids[0]}" + (f" .. {ids[-1]}" if len(ids) > 1 else "") + f"  ({len(ids)} tasks)")
    print(f"  logs: {sd.logs}/<job>_0_log.err")
    if merge_line:
        print(merge_line)
    if sub.error is not None:
        print(f"{PROG}: warning: {len(unit_ids) - len(sub.entries)} units were not submitted: {sub.error.message}; "
              f"fix the cause, then `{PROG} resume {sd.root}`", file=sys.stderr)
    return sub


def _todo_units(sd: SweepDir) -> list[str]:
    st = sweep_status(sd, query_slurm=False)
    return [u.id for u in st.units if u.state != "done"]


def _has_slurm_jobs(sd: SweepDir) -> int:
    return sum(1 for e in sd.job_history() if e.get("executor") == "slurm" and "event" not in e)


def _load_settings(spec_path: str) -> Any:
    from orchestrator.spec.files import load_spec

    return load_spec(spec_path)


def submit_spec(args: argparse.Namespace) -> SweepDir:
    """Plan (or reopen) the sweep of ``args.spec`` and submit its unfinished units."""
    from orchestrator.cli.main import default_sweep_dir, prepare_sweep

    spec = _load_settings(args.spec)
    _check_tools()
    root = Path(args.sweep_dir) if args.sweep_dir else default_sweep_dir(args.spec, spec)
    created = not root.exists()
    sd, unit_ids, existed = prepare_sweep(args.spec, str(root), args.units, args.output, costs=args.costs)
    try:
        with _lock(sd):
            if _has_slurm_jobs(sd):
                raise DispatchError(
                    f"{sd.root} was submitted already ({_has_slurm_jobs(sd)} jobs in {sd.root / 'jobs.jsonl'}); "
                    f"see `{PROG} status {sd.root}`, and `{PROG} resume {sd.root}` submits its missing items"
                )
            todo = _todo_units(sd)
            print(f"sweep {sd.root}: {sd.planned} items in {len(unit_ids)} units"
                  + (f", {len(unit_ids) - len(todo)} units already done" if len(todo) < len(unit_ids) else ""))
            if not todo:
                print(f"every unit is done; nothing to submit (`{PROG} merge {sd.root}` writes the document)")
                return sd
            _submit(sd, todo, spec.executor, origin="submit", max_array_size=getattr(args, "max_array_size", None))
    except BaseException:
        if created and not existed and not _has_slurm_jobs(sd):
            shutil.rmtree(root, ignore_errors=True)  # a sweep directory made for nothing
        raise
    return sd


def resume_sweep(sd: SweepDir, settings: ExecutorSettings, *, force: bool, units: int | None,
                 max_array_size: int | None, quiet_when_done: bool = False) -> int:
    """Submit the missing items of a sweep as new units; return how many items were submitted."""
    from orchestrator.control import dispatch

    slurm = settings.kind == "slurm"
    if slurm:
        _check_tools()
    check_interpreter_env(sd)
    with _lock(sd):
        st = sweep_status(sd)
        plan = plan_resume(sd, st, force=force)
        if plan.held:
            print(f"{len(plan.active)} unit{'s are' if len(plan.active) != 1 else ' is'} still pending or running "
                  f"({plan.held} items without a record yet): not resubmitted; wait for "
                  f"{'them' if len(plan.active) != 1 else 'it'}, `{PROG} cancel {sd.root}`, or resume --force")
        if not plan.missing:
            if not plan.held and not quiet_when_done:
                print(f"all {sd.planned} items of {sd.root} have a record; nothing to resubmit")
            return 0
        new_units = group_missing(sd, plan.missing, units, default=len(plan.missing_of) or 1)
        rollback = _UnitsRollback(sd)
        sd.add_units(new_units, origin="resume")
        new_ids = [u.id for u in new_units]
        prior = {u.id: plan.prior_starts(u.id, [it.id for it in u.items]) for u in new_units}
        print(f"resuming {sd.root}: {len(plan.missing)} of {sd.planned} items have no record; "
              f"{len(new_units)} new unit{'s' if len(new_units) != 1 else ''}")
        if slurm:
            try:
                sub = _submit(sd, new_ids, settings, origin="resume", max_array_size=max_array_size, prior=prior)
            except BaseException:
                rollback.undo(new_ids)
                raise
            submitted = {e["unit"] for e in sub.entries}
        else:
            submitted = set(new_ids)
        items_in = {it.id for u in new_units if u.id in submitted for it in u.items}
        replaces = sorted(uid for uid, miss in plan.missing_of.items() if uid not in submitted and miss <= items_in)
        sd.record_jobs([{"event": "resume", "replaces": replaces, "units": sorted(submitted), "time": now_iso(),
                         "ts": round(time.time(), 3), "force": force}])
    if not slurm:
        outcomes = dispatch.run_units_locally(sd, new_ids, kind=settings.kind, prior_starts=prior)
        for o in outcomes:
            if not o["ok"]:
                print(f"{PROG}: unit {o['unit']} failed: {o['error']} (log: {o['log']})", file=sys.stderr)
    return sum(len(u.items) for u in new_units if u.id in submitted)


# ---------------------------------------------------------------------------- waiting


def wait_until_settled(sd: SweepDir, *, interval: float, slurm_interval: float, timeout: float | None,
                       on_poll: Any = None) -> SweepStatus:
    """Poll until no unit is pending or running. The partials are read every ``interval``;
    SLURM is asked (one squeue + one sacct) at most every ``slurm_interval``, and once more
    before declaring the sweep settled, so a lagging view never ends the wait early."""
    start = time.monotonic()
    view = None
    while True:
        stale = view is None or time.time() - view.taken >= slurm_interval
        st = sweep_status(sd, query_slurm=stale, view=None if stale else view)
        if st.view is not None:
            view = st.view
        if on_poll is not None:
            on_poll(st)
        never = [u.id for u in st.units if u.detail == "not submitted" and u.state != "done"]
        if never and not any(u.state in ACTIVE and u.detail != "not submitted" for u in st.units):
            raise DispatchError(f"{len(never)} units of {sd.root} were never submitted (e.g. {never[0]}); "
                                f"`{PROG} resume {sd.root}` submits them")
        if st.settled:
            if all(u.state == "done" for u in st.units) or (view is not None and time.time() - view.taken < 1.0):
                return st
            view = None  # confirm with a fresh answer
            continue
        if timeout is not None and time.monotonic() - start > timeout:
            return st
        time.sleep(interval)


def wait_and_merge(sd: SweepDir, *, interval: float = 2.0, slurm_interval: float = 10.0,
                   timeout: float | None = None) -> int:
    from orchestrator.store import merge
    from orchestrator.cli.main import Progress, print_table

    progress = Progress(sd.planned)
    warned: set[str] = set()

    def poll(st: SweepStatus) -> None:
        for u in st.units:
            if u.state == "pending" and u.detail and "cannot start" in u.detail and u.id not in warned:
                warned.add(u.id)
                print(f"\n{PROG}: warning: unit {u.id} (job {u.job_id}) waits for {u.detail}", file=sys.stderr)
        c = st.counts()
        extra = "; units: " + ", ".join(f"{n} {s}" for s, n in c.items())
        progress.update(st.done, extra=extra)

    st = wait_until_settled(sd, interval=interval, slurm_interval=slurm_interval, timeout=timeout, on_poll=poll)
    progress.close()
    if not st.settled:
        print(f"{PROG}: still running after {timeout:.0f} s: {len(st.unsettled())} units pending or running; "
              f"`{PROG} wait {sd.root}` again later", file=sys.stderr)
        return 1
    summary = merge.merge(sd)
    print(f"merged {summary.records} records ({summary.errors} errors, {summary.missing} of {summary.planned} "
          f"missing) into {summary.output}", file=sys.stderr)
    if summary.records:
        print_table(summary.output)
    ended = [u for u in st.units if u.state in ("failed", "cancelled", "timed out") and not u.resumed]
    for u in ended:
        print(f"{PROG}: unit {u.id} {u.state}" + (f" ({u.detail})" if u.detail else "")
              + f": {u.done}/{u.total} items" + (f"; log: {u.log}" if u.log else ""), file=sys.stderr)
    if summary.missing:
        print(f"{PROG}: {summary.missing} items have no record; `{PROG} resume {sd.root}` redoes only those",
              file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------- commands


def cmd_submit(args: argparse.Namespace) -> int:
    sd = submit_spec(args)
    print(f"follow with: {PROG} status {sd.root}   (or {PROG} wait {sd.root})")
    return 0


def _resume_settings(sd: SweepDir, spec_path: str | None) -> ExecutorSettings:
    if spec_path is None:
        return sd.spec.executor
    spec = _load_settings(spec_path)
    if spec.fingerprint() != sd.spec.fingerprint():
        raise MismatchError(
            f"{spec_path} is not the spec of the sweep in {sd.root} (fingerprint {spec.fingerprint()} != "
            f"{sd.spec.fingerprint()}); resume without --spec, or submit that spec to a new --sweep-dir"
        )
    return spec.executor


def cmd_resume(args: argparse.Namespace) -> int:
    sd = SweepDir.open(args.sweep_dir)
    settings = _resume_settings(sd, args.spec)
    n = resume_sweep(sd, settings, force=args.force, units=args.units, max_array_size=args.max_array_size)
    if n and settings.kind == "slurm":
        print(f"follow with: {PROG} status {sd.root}   (or {PROG} wait {sd.root})")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    sd = SweepDir.open(args.sweep_dir)
    with _lock(sd):
        st = sweep_status(sd)
        arrays = sorted({array_of(u.job_id) for u in st.units
                         if u.state in ACTIVE and u.executor == "slurm" and u.job_id}, key=lambda a: (len(a), a))
        if not arrays:
            print(f"nothing of {sd.root} is pending or running; nothing to cancel")
            return 0
        if missing_tools("scancel"):
            raise DispatchError("`scancel` is not on PATH; cancel from a login node of the cluster")
        scancel(arrays)
        sd.record_jobs([{"event": "cancel", "arrays": arrays, "time": now_iso(), "ts": round(time.time(), 3)}])
    n = sum(1 for u in st.units if u.state in ACTIVE and u.job_id and array_of(u.job_id) in arrays)
    print(f"cancelled job array{'s' if len(arrays) > 1 else ''} {', '.join(arrays)} ({n} unfinished units); "
          f"finished records are kept: `{PROG} resume {sd.root}` redoes the rest")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    sd = SweepDir.open(args.sweep_dir)
    return wait_and_merge(sd, interval=args.interval, slurm_interval=args.slurm_interval, timeout=args.timeout)


def run_on_slurm(args: argparse.Namespace, sd: SweepDir) -> int:
    """``tilesweep run`` with the slurm executor: submit (or resume what is missing), then wait."""
    spec = _load_settings(args.spec)
    settings = spec.executor.model_copy(update={"kind": "slurm"})
    if _has_slurm_jobs(sd):
        resume_sweep(sd, settings, force=False, units=None, max_array_size=None, quiet_when_done=True)
    else:
        _check_tools()
        with _lock(sd):
            todo = _todo_units(sd)
            print(f"sweep {sd.root}: {sd.planned} items in {len(sd.unit_index())} units", file=sys.stderr)
            if todo:
                _submit(sd, todo, settings, origin="submit", max_array_size=None)
    return wait_and_merge(sd)


def _seconds(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return v


def register(sub: Any) -> None:
    s = sub.add_parser("submit", help="plan a spec and submit its units to SLURM as job arrays; returns at once")
    s.add_argument("spec")
    s.add_argument("--sweep-dir", help="sweep directory (default: sweeps/<spec name>-<fingerprint>)")
    s.add_argument("--units", type=positive_int, help="number of units = array tasks (overrides the spec)")
    s.add_argument("--output", help="results document (default: the spec's output)")
    s.add_argument("--costs", metavar="RESULTS.json", help="shard with the measured costs of an earlier results document")
    s.add_argument("--max-array-size", type=positive_int, help="at most this many tasks per job array "
                   "(default: executor.max_array_size, else the cluster's MaxArraySize)")
    s.set_defaults(func=cmd_submit)

    s = sub.add_parser("resume", help="submit the items of a sweep that have no record yet, as new units")
    s.add_argument("sweep_dir")
    s.add_argument("--spec", help="the sweep's spec file (must match its fingerprint); its executor settings are used")
    s.add_argument("--force", action="store_true", help="also resubmit items of units still pending or running")
    s.add_argument("--units", type=positive_int, help="number of new units (default: one per unit that ended unfinished)")
    s.add_argument("--max-array-size", type=positive_int, help="at most this many tasks per job array")
    s.set_defaults(func=cmd_resume)

    s = sub.add_parser("cancel", help="cancel the job arrays of a sweep that are still pending or running")
    s.add_argument("sweep_dir")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("wait", help="show progress until every unit has settled, then merge and show the best configs")
    s.add_argument("sweep_dir")
    s.add_argument("--interval", type=_seconds, default=2.0, help="seconds between reads of the partials (default 2)")
    s.add_argument("--slurm-interval", type=_seconds, default=10.0,
                   help="seconds between squeue/sacct queries (default 10)")
    s.add_argument("--timeout", type=_seconds, help="give up after this many seconds (exit 1)")
    s.set_defaults(func=cmd_wait)
