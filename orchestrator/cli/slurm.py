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

The work is done in ``orchestrator.control`` (submit, resume, wait, sweeps); this module
only says what happened.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import word
from orchestrator.cli.common import (
    MAKES_FOLDERS,
    OVERWRITE_HELP,
    PROG,
    RETRY_HELP,
    RETRY_KINDS,
    Subparsers,
    counted,
    file_path,
    folder_path,
    items_in_units,
    planned_units,
    positive_int,
    prepare_run,
    print_plan_notes,
    seconds,
    units_capped,
    wait_for_lowering,
    warn,
)
from orchestrator.cli.resuming import merge_left, resume_here, resume_saying
from orchestrator.cli.reusing import add_reuse_args, reuse_lines, reuse_request
from orchestrator.cli.submission import print_dry_run, print_submission, say_no_gpu
from orchestrator.cli.waiting import cmd_wait, wait_and_merge
from orchestrator.errors import DispatchError
from orchestrator.store.sweepdir import SweepDir

if TYPE_CHECKING:  # the control flows import submitit: loaded when a command runs, not for --help
    from orchestrator.control.local_stop import LocalStopped
    from orchestrator.control.submit import SweepSubmission
    from orchestrator.spec.executor_section import ExecutorSettings


def cmd_submit(args: argparse.Namespace) -> int:
    from orchestrator.control.submit import submit_spec
    from orchestrator.store.carried import read_summary
    from orchestrator.store.lowering_todo import sweep_verdicts
    from orchestrator.store.parse_procs import requested

    requested()  # the final merge job runs with this shell's environment
    if args.dry_run:
        return print_dry_run(args)

    def planned(s: SweepSubmission) -> None:
        done = s.units - len(s.todo)
        print(
            f"sweep {s.sd.root}: {items_in_units(s.sd.planned, s.units)}"
            + (f", {counted(done, 'unit')} already done" if done else "")
        )
        if not s.existed:
            units_capped(args.units or s.sd.spec.sharding.units, planned_units(s.sd))
        print_plan_notes(s.sd.spec, verdicts=sweep_verdicts(s.sd, args.spec))
        for line in reuse_lines(read_summary(s.sd)):
            print(line)
        if not s.todo:
            print(f"every unit is done; nothing to submit (`{PROG} merge {word(s.sd.root)}` writes the document)")
        else:
            say_no_gpu(s.sd.spec, s.sd.spec.executor)

    result = submit_spec(
        args.spec,
        sweep_dir=args.sweep_dir,
        units=args.units,
        output=args.output,
        costs=args.costs,
        max_array_size=args.max_array_size,
        on_planned=planned,
        reuse=reuse_request(args),
        wait_lowering=lambda root: wait_for_lowering(root, "submitted"),
    )
    if result.outcome is None:  # every unit done: nothing runs to follow (said in `planned`)
        return 0
    print_submission(result.sd, result.outcome)
    print(f"follow with: {PROG} status {word(result.sd.root)}   (or {PROG} wait {word(result.sd.root)})")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.cli.resuming import settings_kept
    from orchestrator.control.resume import resume_settings
    from orchestrator.store.parse_procs import requested

    requested()  # a bad TILESWEEP_MERGE_PROCS is said before anything is measured
    sd = SweepDir.open(args.sweep_dir)
    settings = resume_settings(sd, args.spec)
    wait_for_lowering(sd.root, "submitted" if settings.kind == "slurm" else "run")
    if settings.kind != "slurm":
        return resume_here(sd, settings, args)
    result = resume_saying(
        sd,
        settings,
        force=args.force,
        units=args.units,
        max_array_size=args.max_array_size,
        retry=args.retry_errors,
        spec_file=args.spec,
    )
    settings_kept(sd, settings, args.spec)
    if result.items_submitted or result.next_round is not None:
        print(f"follow with: {PROG} status {word(sd.root)}   (or {PROG} wait {word(sd.root)})")
    elif not result.unit_ids and not result.plan.held and merge_left(sd) is not None:
        return 1  # complete, and its document lacks records nothing will write: `merge` does (said above)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrator.control.local_stop import stop_local
    from orchestrator.control.sweeps import cancel_sweep

    sd = SweepDir.open(args.sweep_dir)
    done = cancel_sweep(sd)
    here = stop_local(sd, done.status)  # the units it runs here, as the cancel saw them
    if not done.arrays and not here:
        print(f"nothing of {sd.root} is pending or running; nothing to cancel")
        return 0
    if done.arrays:
        print(
            f"cancelled job array{'s' if len(done.arrays) > 1 else ''} {', '.join(done.arrays)} "
            f"({counted(done.units, 'unfinished unit')})"
        )
    for line in local_stop_lines(here, sd):
        print(line)
    if here.elsewhere is not None or here.lingering:
        return 1
    print(f"finished records are kept: `{PROG} resume {word(sd.root)}` redoes the rest")
    return 0


def local_stop_lines(here: LocalStopped, sd: SweepDir) -> list[str]:
    """What ``cancel`` says of the sweep's processes on this machine that it stopped, or could not."""
    lines = []
    if here.runner is not None:
        lines.append(f"stopped the `{PROG}` command that runs {sd.root} here (pid {here.runner}), as a Ctrl-C would")
    if here.detached:
        n = len(here.detached)
        pids = ", ".join(map(str, here.detached))
        lines.append(
            f"stopped {n} unit{'s' if n > 1 else ''} running here (local process{'es' if n > 1 else ''} {pids})"
        )
    if here.elsewhere is not None:
        lines.append(f"{sd.root} is run by {here.elsewhere}: stop that run there (Ctrl-C)")
    if here.lingering:
        pids = " ".join(map(str, here.lingering))
        lines.append(f"still running after the stop: pid {pids}; `kill -9 {pids}` ends them")
    return lines


def run_on_slurm(args: argparse.Namespace) -> int:
    """``tilesweep run`` with the slurm executor: submit (or resume what is missing), then
    wait. Refused before anything is written where sbatch cannot be reached; a sweep
    directory made for a submission that failed is removed again; a second ``run`` of a
    sweep being run follows the first one's progress."""
    from orchestrator.control.scheduler import require_submit_tools
    from orchestrator.control.sweeps import default_sweep_dir, run_or_follow, slurm_jobs
    from orchestrator.spec.files import load_spec
    from orchestrator.store.carried import read_summary
    from orchestrator.store.lowering_todo import sweep_verdicts
    from orchestrator.store.merge_output import ANOTHER_OUTPUT, check_target

    spec = load_spec(args.spec)
    require_submit_tools()
    root = Path(args.sweep_dir) if args.sweep_dir else default_sweep_dir(args.spec, spec)
    created = not root.exists()
    sd, _, existed = prepare_run(args, root, "slurm", reuse_request(args))
    asked = None if existed else args.units or sd.spec.sharding.units
    print_plan_notes(sd.spec, verdicts=sweep_verdicts(sd, args.spec))
    for line in reuse_lines(read_summary(sd)):
        print(line, file=sys.stderr)
    try:
        if not args.overwrite:
            check_target(sd, elsewhere=ANOTHER_OUTPUT)  # refused now, not after the units ran
        with run_or_follow(sd, "run") as other:  # held while submitting and waiting: a second run follows
            if other is not None:
                warn(
                    f"note: {sd.root} is being run by another {other.command()} ({other.describe()}); following "
                    "its progress instead of submitting it a second time"
                )
                _wait_for_submission(sd)
                all_done = False
            else:
                all_done = _submit_or_resume(
                    sd, spec.executor.model_copy(update={"kind": "slurm"}), retry=args.retry_errors, asked=asked
                )
            if not slurm_jobs(sd):
                if not all_done:
                    raise DispatchError(f"nothing of {sd.root} was submitted; `{PROG} run` it again")
                print(f"every unit of {sd.root} is done; nothing to submit", file=sys.stderr)
            return wait_and_merge(sd, html=spec.report.html, overwrite=args.overwrite)
    except BaseException:
        if created and not slurm_jobs(sd):
            shutil.rmtree(root, ignore_errors=True)  # a sweep directory made for nothing
        raise


def _submit_or_resume(
    sd: SweepDir, settings: ExecutorSettings, *, retry: str | None = None, asked: int | None = None
) -> bool:
    """Submit what is not done; True where every unit was done already (all of it reused).
    ``asked``: the units a plan made by this run was asked for (said where it made fewer)."""
    from orchestrator.control.submit import submit_unfinished

    def planned(s: SweepSubmission) -> None:
        print(f"sweep {sd.root}: {items_in_units(sd.planned, s.units)}", file=sys.stderr)
        units_capped(asked, planned_units(sd))
        if s.todo:
            say_no_gpu(sd.spec, settings)

    result = submit_unfinished(sd, settings, on_planned=planned)
    if result is None:  # submitted before (or meanwhile): only what is missing
        resume_saying(sd, settings, force=False, units=None, max_array_size=None, quiet_when_done=True, retry=retry)
        return False
    if result.outcome is not None:
        print_submission(sd, result.outcome)
    if retry:  # error records run here before: redo them as units of their own
        resume_saying(
            sd,
            settings,
            force=False,
            units=None,
            max_array_size=None,
            quiet_when_done=True,
            retry=retry,
            include_missing=False,
        )
    return not result.todo


def _wait_for_submission(sd: SweepDir) -> None:
    """While the other ``run`` has not submitted anything yet, wait for it to."""
    from orchestrator.control.sweeps import other_run_live, slurm_jobs

    while not slurm_jobs(sd) and other_run_live(sd):
        time.sleep(0.5)


RESUME_UNITS_HELP = (
    "number of new units (default: a plan that never ran runs its own units; otherwise one per unit that "
    "ended unfinished, rounded up to fill whole SLURM tasks of several GPUs; with --no-wait here, at most "
    "as many as run here at a time, since all of them start at once: where the missing items and the error "
    "records to retry need more units of their own than that, --no-wait is refused)"
)


def register(sub: Subparsers) -> None:
    """Add ``submit``, ``resume``, ``cancel`` and ``wait`` to an ``add_subparsers()`` object."""
    _register_submit(sub)
    _register_after_submit(sub)


def _register_submit(sub: Subparsers) -> None:
    s = sub.add_parser("submit", help="plan a spec and submit its units to SLURM as job arrays; returns at once")
    s.add_argument("spec")
    s.add_argument("--sweep-dir", type=folder_path, help="sweep directory (default: sweeps/<spec name>-<fingerprint>)")
    s.add_argument(
        "--units",
        type=positive_int,
        help="number of units (overrides the spec); a task runs one per GPU (executor.gpus_per_node)",
    )
    s.add_argument("--output", type=file_path, help=f"results document (default: the spec's output; {MAKES_FOLDERS})")
    s.add_argument(
        "--costs", metavar="RESULTS.json", help="shard with the measured costs of an earlier results document"
    )
    s.add_argument(
        "--max-array-size",
        type=positive_int,
        help="at most this many tasks per job array "
        "(default: executor.max_array_size, else the cluster's MaxArraySize)",
    )
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="print the array layout and the sbatch scripts, or what submit would refuse before sbatch; write "
        "and submit nothing",
    )
    add_reuse_args(s)
    s.set_defaults(func=cmd_submit)


def _register_after_submit(sub: Subparsers) -> None:
    s = sub.add_parser(
        "resume",
        help="redo the items of a sweep that have no record yet, as new units (a plan that never ran: its own units): "
        "on SLURM submitted, here run and merged",
    )
    s.add_argument("sweep_dir")
    s.add_argument("--spec", help="the sweep's spec file (must match its fingerprint); its executor settings are used")
    s.add_argument("--force", action="store_true", help="also resubmit items of units still pending or running")
    s.add_argument("--units", type=positive_int, help=RESUME_UNITS_HELP)
    s.add_argument("--max-array-size", type=positive_int, help="at most this many tasks per job array")
    s.add_argument("--retry-errors", choices=RETRY_KINDS, help=RETRY_HELP)
    s.add_argument(
        "--no-wait",
        action="store_true",
        help="local: start the new units, no more than run here at a time (executor.local_workers, else one per "
        "visible GPU), and return (`tilesweep wait` follows and merges); SLURM resume never waits",
    )
    s.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    s.set_defaults(func=cmd_resume)

    s = sub.add_parser(
        "cancel",
        help="cancel the job arrays of a sweep that are still pending or running, or stop a local sweep's units",
        description="Cancel a sweep's SLURM job arrays that are still pending or running (scancel), or, for a sweep "
        "run here, stop the run that runs it, the units it left running and the workers run by hand "
        "(`python -m jobs.worker`); finished records are kept, and "
        f"`{PROG} resume` redoes the rest.",
    )
    s.add_argument("sweep_dir")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("wait", help="show progress until every unit has settled, then merge and show the best configs")
    s.add_argument("sweep_dir")
    s.add_argument("--interval", type=seconds, default=2.0, help="seconds between reads of the partials (default 2)")
    s.add_argument(
        "--slurm-interval", type=seconds, default=10.0, help="seconds between squeue/sacct queries (default 10)"
    )
    s.add_argument(
        "--timeout",
        type=seconds,
        help="give up after this many seconds (exit 1), saying what still runs or waits "
        "(held tasks: the `scontrol release` that starts them)",
    )
    s.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    s.set_defaults(func=cmd_wait)
