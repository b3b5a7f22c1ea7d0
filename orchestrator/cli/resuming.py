"""``tilesweep resume`` as the command line says it: what it plans, then on SLURM the
submission (it returns once sbatch took the new units; ``wait`` follows them), and here (the
local and debug executors) the run of the new units with a progress bar and what a finished
sweep does (``finish.finish_sweep``: the merge, the best configs, what is left), as ``run``
does. With ``--no-wait`` a resume here starts the new units' workers and leaves them running;
its last line says how to follow them (``wait`` merges once they end).

A resume here holds the sweep's run lease while it runs, as ``run`` does: a ``run`` started
meanwhile follows it instead of starting workers beside it, and ``status`` knows the units it
has still to start are not stranded.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import word
from orchestrator.cli.common import PROG, Progress, counted, round_note, units_capped, warn
from orchestrator.cli.finish import failed_unit_lines, finish_sweep
from orchestrator.cli.submission import print_submission, say_no_gpu
from orchestrator.errors import DispatchError

if TYPE_CHECKING:  # the control flows import submitit: loaded when a command runs, not for --help
    from orchestrator.control.resume import Resumed
    from orchestrator.control.resume_plan import ResumePlan
    from orchestrator.control.rounds import NextRound
    from orchestrator.spec.executor_section import ExecutorSettings
    from orchestrator.store.sweepdir import SweepDir


def say_resume_plan(
    sd: SweepDir,
    r: Resumed,
    *,
    retry: str | None,
    quiet_when_done: bool,
    units: int | None = None,
    merges: bool | None = None,
    follows: bool = False,
) -> None:
    """What a resume is about to do: the units it leaves to run (``follows``: it follows them to
    their end, as a resume here does), the round it planned, the new units (and, as a plan says
    it, fewer of them than ``--units`` asked for: one item each); with nothing to resubmit, what
    the sweep's document lacks (``merges``: whether this resume merges it; None: not said here)."""
    plan = r.plan
    if plan.held:
        print(_held_line(sd, plan, follows))
    if r.next_round is not None:
        nxt = r.next_round
        if "kind" in nxt.summary:  # a search's round
            print(f"round {nxt.number - 1} of {sd.root} is complete; {round_note(nxt)}")
        else:
            print(
                f"round {nxt.number - 1} of {sd.root} is complete: round {nxt.number} times "
                f"{nxt.summary['survivors']} of {nxt.summary['screened']} screened configs in full, "
                f"in {len(nxt.units)} new units"
            )
    if not r.unit_ids:
        if not plan.held and not quiet_when_done and r.next_round is None:
            redo = f" and no {'' if retry == 'all' else retry + ' '}error record to retry" if retry else ""
            left = _unmerged(sd, merges)
            print(f"all {sd.planned} items of {sd.root} have a record{redo}; nothing to resubmit{left}")
        return
    n = len(r.new_units)
    k = len(plan.retry)
    kind = "" if retry == "all" else f"{retry} "
    redo = f"; {k} {kind}error record{' is' if k == 1 else 's are'} redone" if retry else ""
    halving = sd.spec.timing.strategy == "halving"
    later = sum(len(items) for number, items in plan.later.items() if not (halving and number == 2))
    absent = len(plan.missing) + sum(plan.as_planned.values())
    print(
        f"resuming {sd.root}: {absent} of {sd.planned} items {'has' if absent == 1 else 'have'} no record"
        + (
            f", {len(plan.missing2)} survivors of round 2 are not timed in full yet"
            if plan.missing2 and halving
            else ""
        )
        + (f", {later} items of later rounds have no record yet" if later else "")
        + redo
        + _units_said(list(plan.as_planned), "", " never started, taken as planned")
        + _units_said([u.id for u in r.new_units], "new ")
    )
    if n and n == sum(len(u.items) for u in r.new_units):  # as many units as items: no more could be made
        units_capped(units, n)


def _units_said(ids: list[str], before: str, after: str = "") -> str:
    """``; 2 new units: a, b`` (the ids where at most 4), or nothing where there are none."""
    if not ids:
        return ""
    n = len(ids)
    return f"; {n} {before}unit{'s' if n != 1 else ''}{after}" + (f": {', '.join(ids)}" if n <= 4 else "")


def _held_line(sd: SweepDir, plan: ResumePlan, follows: bool) -> str:
    """What a resume says of the units still pending or running that it leaves to their workers:
    that it follows them (``follows``), or how to have them redone."""
    n, them = len(plan.active), "them" if len(plan.active) != 1 else "it"
    held = f"({counted(plan.held, 'item')} without a record yet)"
    if follows:
        return (
            f"{n} unit{'s are' if n != 1 else ' is'} run by a worker already {held}: following {them} instead of "
            f"starting a second worker on {'each' if n != 1 else 'it'}"
        )
    return (
        f"{n} unit{'s are' if n != 1 else ' is'} still pending or running {held}: not resubmitted; wait for "
        f"{them}, `{PROG} cancel {word(sd.root)}`, or resume --force"
    )


def _unmerged(sd: SweepDir, merges: bool | None) -> str:
    """A complete sweep's document not merged since its last records, or never: that this resume
    merges it, or what writes it (what runs, or the command that does, as ``status`` says)."""
    from orchestrator.control.status import sweep_status
    from orchestrator.control.status_text import sweep_state

    if merges is None:
        return ""
    st = sweep_status(sd)
    if not st.complete or st.merged:
        return ""
    if merges:
        since = "not merged since its last records" if st.output_exists else "not merged yet"
        return f"; merging them into {st.output} ({since})"
    return f"; the sweep is {sweep_state(st)}"


def merge_left(sd: SweepDir) -> str | None:
    """Where the sweep is complete and its document missing or short of records, with nothing
    running to write it (what a resume that did not merge leaves to ``merge``): the sweep's
    state as ``status`` says it, naming the command that writes it."""
    from orchestrator.control.status import sweep_status
    from orchestrator.control.status_text import sweep_state

    st = sweep_status(sd)
    return sweep_state(st) if st.merge_left else None


def resume_saying(
    sd: SweepDir,
    settings: ExecutorSettings,
    *,
    force: bool,
    units: int | None,
    max_array_size: int | None,
    quiet_when_done: bool = False,
    retry: str | None = None,
    include_missing: bool = True,
    progress: Progress | None = None,
    background: bool = False,
    spec_file: str | None = None,
) -> Resumed:
    """``resume_sweep``, saying what it plans before it submits or runs, and how its
    submissions went; ``progress`` is fed while units run here, and a wait for a ``plan
    --lower`` before a next round is said above it (``running.later_rounds_wait``)."""
    from orchestrator.cli.running import later_rounds_wait
    from orchestrator.control.resume import resume_sweep
    from orchestrator.control.status import sweep_status

    def planned(r: Resumed) -> None:
        # a resume here merges once its units ran; one that leaves them running says it once it let the sweep go
        merges = None if background else settings.kind != "slurm"
        say_resume_plan(
            sd, r, retry=retry, quiet_when_done=quiet_when_done, units=units, merges=merges, follows=bool(merges)
        )
        if r.unit_ids and settings.kind == "slurm":
            say_no_gpu(sd.spec, settings)
        if settings.kind == "local" and not background:
            say_cpu_workers(sd, settings, r, progress)

    def poll() -> None:
        if progress is not None:
            progress.sweep(sweep_status(sd, query_slurm=False))

    def announce(nxt: NextRound) -> None:  # a round its units made due, said as `run` says it
        if progress is not None:
            poll()  # the round that ended shows its last count above what is said of the next
            progress.note(round_note(nxt))

    result = resume_sweep(
        sd,
        settings,
        force=force,
        units=units,
        max_array_size=max_array_size,
        on_planned=planned,
        retry=retry,
        include_missing=include_missing,
        on_poll=poll,
        background=background,
        wait_lowering=later_rounds_wait(progress) if progress is not None else None,
        on_round=announce,
        spec_file=spec_file,
    )
    _say_submissions(sd, result)
    return result


def _say_submissions(sd: SweepDir, result: Resumed) -> None:
    """How a resume's submissions went (SLURM): its units', and a next round's it submitted."""
    if result.submission is not None:
        print_submission(sd, result.submission)
    if result.next_round is not None and result.next_round.outcome is not None:
        print_submission(sd, result.next_round.outcome)


def say_cpu_workers(sd: SweepDir, settings: ExecutorSettings, r: Resumed, progress: Progress | None) -> None:
    """A resume that runs its units here, several workers at a time timing kernels on this
    machine's CPUs, says so once, as ``run`` does (``running.cpu_workers_note``), above its bar."""
    from orchestrator.cli.running import cpu_workers_note

    units = len(r.unit_ids) or (len(r.next_round.units) if r.next_round is not None else 0)
    alone = "set executor.local_workers to 1 in the sweep's spec file and resume with --spec FILE"
    note = cpu_workers_note(sd.spec, units, settings.local_workers, alone)
    if note is None:
        return
    if progress is not None:
        progress.note(f"{PROG}: {note}")
    else:
        warn(note)


def settings_kept(sd: SweepDir, settings: ExecutorSettings, spec: str | None) -> None:
    """The executor settings of the spec given to ``resume --spec`` are the sweep's from now on:
    a later plain resume would otherwise go back to the ones it was fixing. Said in one line."""
    from orchestrator.control.resume import keep_settings
    from orchestrator.spec.files import load_spec

    if spec is None:
        return
    if keep_settings(sd, settings, spec):
        print(f"{sd.root} runs with the executor settings of {spec} from now on (plain `{PROG} resume` too)")
    given = load_spec(spec).output
    if Path(given).resolve() != sd.output:  # the output moves with `run --output` or `merge --output`
        warn(
            f"{sd.root} merges into {sd.output}, its output; {spec} names {given}, which resume does not use "
            f"(`{PROG} merge {word(sd.root)} --output {word(given)}` writes there)"
        )


def resume_here(sd: SweepDir, settings: ExecutorSettings, args: argparse.Namespace) -> int:
    """A resume with the local or debug executor (see the module docstring)."""
    from orchestrator.cli.running import follow_then_run_rounds
    from orchestrator.control.status import sweep_status
    from orchestrator.control.sweeps import check_runs_here, run_or_follow
    from orchestrator.store.merge_output import check_target

    planned_from = sd.meta.get("spec_source")  # the spec file the sweep was planned from, where it still is
    spec_file = args.spec or (planned_from if planned_from and Path(planned_from).is_file() else None)
    check_runs_here(sd.spec, spec_file, sd.root)  # as `run` does: a kernel that cannot run here starts no worker
    if not args.overwrite and not args.no_wait:
        check_target(sd)  # refuse now, not after the units ran, to drop another sweep's records
    with run_or_follow(sd, "resume") as other:
        if other is not None:
            raise DispatchError(
                f"{sd.root} is being run by another {other.command()} ({other.describe()}); "
                f"resume it once that run has ended (`{PROG} wait {word(sd.root)}` follows it)"
            )
        progress = None if args.no_wait else Progress(sweep_status(sd, query_slurm=False).total)
        try:  # closed on Ctrl-C too: else tqdm draws the bar once more after the one-line message
            result = resume_saying(
                sd,
                settings,
                force=args.force,
                units=args.units,
                max_array_size=None,
                retry=args.retry_errors,
                progress=progress,
                background=args.no_wait,
                spec_file=args.spec,
            )
        finally:
            if progress is not None:
                progress.close()
        settings_kept(sd, settings, args.spec)
        failed = [] if args.no_wait else failed_unit_lines(result.outcomes)
        if result.plan.active and not args.no_wait:  # run by workers of other processes: followed, as `run` does
            failed += follow_then_run_rounds(sd, result.plan.active, settings.kind, settings.local_workers)
    if args.no_wait:
        if result.started:
            n, here = len(result.started), word(sd.root)
            print(
                f"started {n} unit{'s' if n != 1 else ''} here, left running; follow with: {PROG} status {here}"
                f"   (or {PROG} wait {here}, which merges once they end)"
            )
            return 0
        left = merge_left(sd)  # this resume holds the sweep no more: nothing runs that would merge
        print("nothing started" + (f"; the sweep is {left}" if left else ""))
        return 1 if left else 0
    return finish_sweep(
        sd, overwrite=args.overwrite, html=sd.spec.report.html, failed=failed, redo=f"`{PROG} resume {word(sd.root)}`"
    )
