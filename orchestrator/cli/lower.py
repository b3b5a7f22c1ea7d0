"""``tilesweep plan SPEC --lower``: pre-flight lowering of every planned config a worker will
measure for the spec's target GPU on this machine's CPUs, before any GPU time (``jobs.lowering``;
the verdicts' file is ``store.lowering``'s). The configs planning carries from earlier documents
(the output document, ``reuse``: ``store.carried``) are never measured, so never lowered (but a
carried screen, which a halving round 2 may time in full); the summary says how many were left
out for that.

With ``--sweep-dir`` the sweep directory is planned (or reopened) and each verdict is appended
to its ``lowering.jsonl``: the configs lowering refused are recorded as pruned, with the
compiler's reason and bytes, by ``submit`` and the workers, never compiled on a GPU. A rerun
lowers only the configs without a verdict, and a lowering of a sweep that ran only those its
workers have not recorded yet (a config measured or errored needs no verdict: the summary says
how many it skipped for that; ``store.lowering_todo``); one started while another lowers the
same sweep directory waits for it (its lowering lease, ``store.leases``), saying so, and then does the same;
``run``, ``submit`` and ``resume`` of it wait for it too (``cli.common.wait_for_lowering``), and so
does ``wait`` before it submits a next round.
A stop (Ctrl-C) says what it kept, as the verdicts' files hold it wherever it came: the verdicts written
before it, and the rerun that lowers the rest, or that a rerun lowers nothing where every config has one.
A disk that takes no further verdict (full, a quota, read-only) ends it in one line saying the same, after
the file and its fix.
``--dry-run`` lowers and shows without writing.
Its bar (on stderr) is drawn at 0 as it starts, before the seconds its lowering processes take to
start (each imports jax), and taken off a terminal where an error comes before any verdict.
With ``executor.lower_partition`` (slurm) the configs are lowered as a CPU job array on that
partition (``control.lowering``), followed here until it ends (its bar drawn once it is submitted);
each verdict is copied into ``lowering.jsonl`` as it is read; a stop cancels the array (scancel)
and waits, the lease held, until SLURM runs none of its tasks, keeping the verdicts they wrote.
``--json``: one object per config, its plan line plus its verdict (``null`` for a config not
lowered here: invalid, pruned by the shared-memory model, lowered before, reused, or recorded
already). A replayed sweep lowers the configs of the implementation its source measured, so a
rehearsal prunes what the real sweep would.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernels import impls
from kernels.spelling import as_json
from orchestrator import PROG, word
from orchestrator.cli.common import Progress, counted, print_plan_notes, warn
from orchestrator.cli.reusing import reuse_request
from orchestrator.errors import DispatchError, PlanError, SweepDirError

if TYPE_CHECKING:
    from orchestrator.control.lowering import LoweringArray
    from orchestrator.planning import WorkItem
    from orchestrator.spec.model import SweepSpec
    from orchestrator.store.lowering import Verdict
    from orchestrator.store.lowering_todo import ToLower
    from orchestrator.store.sweepdir import SweepDir


def _check_can_lower(spec: SweepSpec) -> None:
    """One line naming what to install when lowering cannot work here."""
    try:
        from jobs.lowering import check_available
    except ImportError as exc:
        raise PlanError(
            f"pre-flight lowering needs jax here ({exc}); install tilesweep with its dependencies"
        ) from None
    try:
        check_available(spec)
    except RuntimeError as exc:
        raise PlanError(f"cannot lower kernel.impl {as_json(spec.measured_impl)} here: {exc}") from None


def cmd_plan_lower(args: argparse.Namespace, spec: SweepSpec) -> int:
    from orchestrator.planning import expand

    if not args.dry_run and not args.sweep_dir:
        raise PlanError("to keep the verdicts pass --sweep-dir DIR (or --dry-run to only show them)")
    if spec.executor.lower_partition and spec.executor.kind != "slurm":
        raise PlanError(
            f"executor.lower_partition is {as_json(spec.executor.lower_partition)} but executor.kind is "
            f"{as_json(spec.executor.kind)}: a lowering job array needs executor.kind slurm (or drop lower_partition "
            "to lower on this machine's CPUs)"
        )
    if spec.executor.lower_partition and not args.dry_run:  # what sbatch would refuse, said before any of it
        from orchestrator.control.partitions import require_lower_partition

        require_lower_partition(spec.executor)
    _check_can_lower(spec)
    if not args.json:  # as `plan` notes them: a tunable the kernel ignores is lowered at the one value it runs
        print_plan_notes(spec, lowering=True)
    if args.dry_run:
        from orchestrator.store.lowering_todo import to_lower

        items = expand(spec)
        return _lower(args, spec, items, None, to_lower(items, set(), _reused_in_plan(args, spec), set()))
    return _lower_into_sweep(args, spec)


def _reused_in_plan(args: argparse.Namespace, spec: SweepSpec) -> set[str]:
    """The ids of the items a dry run's plan carries from earlier documents (the output document,
    ``reuse``), which no worker would measure."""
    from orchestrator.control.reuseplan import plan_with_reuse
    from orchestrator.control.sweeps import default_sweep_dir
    from orchestrator.store.carried import found_ids
    from orchestrator.store.document import load_costs

    root = Path(args.sweep_dir) if args.sweep_dir else default_sweep_dir(args.spec, spec)
    costs = load_costs(args.costs) if args.costs else None
    planned = plan_with_reuse(spec, root, Path(spec.output), args.units, costs, reuse_request(args))
    return found_ids(planned.items, planned.found)


def _lower_into_sweep(args: argparse.Namespace, spec: SweepSpec) -> int:
    """Lower the configs of the sweep directory ``--sweep-dir`` that have no verdict yet, holding
    its lowering lease: a second ``plan --lower`` of it waits for the first (saying so), then
    lowers only what the first left without a verdict. The configs its workers recorded already
    (measured or errored) are not lowered (``store.lowering_todo``)."""
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store.carried import carried_ids
    from orchestrator.store.files import WRITE_ERRNOS, cannot_write
    from orchestrator.store.leases import lowering_lease
    from orchestrator.store.lowering import read_verdicts
    from orchestrator.store.lowering_todo import recorded_ids, to_lower
    from orchestrator.store.sweepdir import SweepDir

    prepared, _, _ = prepare_sweep(
        args.spec, args.sweep_dir, args.units, None, costs=args.costs, reuse=reuse_request(args), spec=spec
    )

    waited: list[str] = []

    def waiting(holder: str) -> None:
        waited.append(holder)
        warn(
            f"waiting for the other `plan --lower` of {prepared.root} ({holder}) to end; then only the configs it "
            "left without a verdict are lowered here"
        )

    held = False
    lowering: tuple[SweepDir, set[str], set[str]] | None = None  # once it holds the lease: its sweep, verdicts, todo
    try:
        with lowering_lease(prepared.root, on_wait=waiting):
            held = True
            sd = SweepDir.open(prepared.root)  # its verdicts read under the lease: no other lowering writes them
            before = set(read_verdicts(sd.root, sd.spec.fingerprint(), sd.spec.kernel.target.name))
            items = sd.items()
            plan = to_lower(items, before, carried_ids(sd), recorded_ids(sd.root, sd.spec.fingerprint()))
            lowering = sd, before, {it.id for it in plan.todo}
            # the spec file's settings; its verdicts name the fingerprint the sweep was planned with
            return _lower(args, spec.model_copy().keep_fingerprint(sd.spec.fingerprint()), items, sd.root, plan)
    except OSError as exc:
        if lowering is None or exc.errno not in WRITE_ERRNOS:
            raise
        # a verdict the disk took no more of (full, a quota, read-only): its file, its fix, what it kept
        raise SweepDirError(f"{cannot_write(exc)}; {_stopped(args, *lowering)}") from None
    except KeyboardInterrupt:
        if lowering is not None:  # wherever it stopped (its summary said, its lease let go), what its files hold
            raise KeyboardInterrupt(_stopped(args, *lowering)) from None
        if held or not waited:  # stopped before it lowered
            raise
        raise KeyboardInterrupt(
            f"nothing was lowered here, and the other `plan --lower` of {prepared.root} goes on; once it ends, "
            f"{_rerun(args, prepared.root)} lowers only the configs it left without a verdict"
        ) from None


def _lower(
    args: argparse.Namespace,
    spec: SweepSpec,
    items: list[WorkItem],
    root: Path | None,
    plan: ToLower,
) -> int:
    """Lower what ``plan`` picked of ``items`` (``store.lowering_todo``) and say what lowering said
    (verdicts kept in ``root``'s ``lowering.jsonl``; None: kept nowhere)."""
    from jobs.lowering import lower_items
    from jobs.node_env import device_block
    from orchestrator.planning import plan_line
    from orchestrator.spec.compat import env_fingerprint
    from orchestrator.store.lowering import VerdictWriter, lowering_header

    todo = plan.todo
    target = spec.kernel.target
    by_id = {it.id: it for it in todo}
    seen: Counter[str] = Counter()
    writer = None
    on_cluster = bool(root is not None and spec.executor.lower_partition and todo)
    progress = None if args.json or not todo else _bar(len(todo), target.name, on_cluster)

    def on_verdict(v: Verdict) -> None:
        if writer is not None:
            writer.write(v)
        seen[v.verdict] += 1
        seen["smem"] += v.verdict == "refused" and v.smem_bytes is not None
        if args.json:
            sys.stdout.write(json.dumps({**plan_line(by_id[v.id]), "lowering": v.line()}) + "\n")
        elif progress is not None:
            progress.update(sum(seen[k] for k in ("lowered", "refused", "crashed")))

    where = "this machine's CPUs"
    try:
        if root is not None and todo:  # jax imported, to name the jax that lowers in the verdicts' header
            env = env_fingerprint(device_block())
            writer = VerdictWriter(root, lowering_header(spec.fingerprint(), target.name, env))
        t0 = time.perf_counter()
        if root is not None and on_cluster:
            where = _lower_on_cluster(root, todo, on_verdict, progress)
        else:
            lower_items(spec, todo, on_verdict=on_verdict, workers=args.lower_workers)
    except Exception:
        if progress is not None and not seen:  # an error before any verdict: its one line, no bar above it
            progress.close(keep=False)
        raise
    finally:
        if writer is not None:
            writer.close()
        if progress is not None:
            progress.close()
    if args.json:
        _unlowered_lines(items, by_id)
    else:
        wall_s = time.perf_counter() - t0
        _summary(spec, seen, plan, wall_s, root, where, args.sweep_dir)
    return 0


def _bar(configs: int, target: str, on_cluster: bool) -> Progress:
    """The bar of the configs lowered for ``target``: here drawn at once, at 0 (the lowering
    processes take seconds to start); on the cluster once its array is submitted."""
    progress = Progress(configs, "config", desc=f"lowering for {target}")
    if not on_cluster:
        progress.update(0)
    return progress


def _unlowered_lines(items: list[WorkItem], by_id: dict[str, WorkItem]) -> None:
    """With ``--json``, every config has its line: those not lowered here with no verdict."""
    from orchestrator.planning import plan_line

    for it in items:
        if it.id not in by_id:
            sys.stdout.write(json.dumps({**plan_line(it), "lowering": None}) + "\n")


def _say(progress: Progress | None) -> Callable[[str], None]:
    """How a line is said while lowering: ``warn``, above the bar where one is drawn."""
    if progress is None:
        return warn
    return lambda text: progress.note(f"{PROG}: {text}")


def _lower_on_cluster(
    root: Path, todo: list[WorkItem], on_verdict: Callable[[Verdict], None], progress: Progress | None
) -> str:
    """Lower ``todo`` as a CPU job array (``executor.lower_partition``); where it lowered them.
    Its bar is drawn once the array is submitted, below the line saying so. A Ctrl-C cancels
    the array (``_cancel``)."""
    from orchestrator.control.lowering import lower_on_cluster
    from orchestrator.store.sweepdir import SweepDir

    sd = SweepDir.open(root)
    submitted: list[LoweringArray] = []
    say = _say(progress)

    def started(run: LoweringArray) -> None:
        submitted.append(run)
        on = f"job array {run.array} on partition {sd.spec.executor.lower_partition}"
        say(f"lowering {counted(len(todo), 'config')} as {on}")
        if progress is not None:
            progress.update(0)

    try:
        run = lower_on_cluster(sd, todo, on_verdict, started=started)
    except KeyboardInterrupt:
        if submitted:
            _cancel(sd, submitted[0], on_verdict, say)
        raise
    if run.gone:
        say(
            f"{len(run.gone)} of {len(run.job_ids)} lowering tasks ended before they finished (see {sd.logs}); "
            "their configs without a verdict stay runnable: rerun plan --lower to lower them"
        )
    return f"the cluster's CPUs (array {run.array}, partition {sd.spec.executor.lower_partition})"


def _cancel(
    sd: SweepDir, run: LoweringArray, on_verdict: Callable[[Verdict], None], say: Callable[[str], None]
) -> None:
    """Cancel the lowering array ``run`` a Ctrl-C stopped following (scancel), saying so, and wait,
    the sweep's lowering lease still held, until SLURM runs none of its tasks, keeping the verdicts
    they write meanwhile: none writes one once a later ``run`` or ``plan --lower`` may start."""
    from orchestrator.control.lowering import cancel_lowering

    array = run.array
    say(f"cancelling the lowering array {array} (scancel {array}); waiting for its tasks to end")
    left = f"`squeue -j {array}` shows its tasks; rerun plan --lower once none is left"
    try:
        if not cancel_lowering(sd, run, on_verdict):
            say(f"the lowering array {array} is cancelled, but SLURM cannot be asked whether its tasks ended: {left}")
    except DispatchError as exc:
        say(
            f"{exc.message}: the lowering array {array} goes on on the cluster; `scancel {array}` stops it "
            "(cancel it before you rerun plan --lower, which lowers what has no verdict yet)"
        )
    except KeyboardInterrupt:
        say(f"the lowering array {array} is cancelled, but its tasks may still be ending: {left}")


def _stopped(args: argparse.Namespace, sd: SweepDir, before: set[str], todo: set[str]) -> str:
    """What a stop of a lowering of ``todo`` into ``sd``, wherever it came, leaves, as its verdicts'
    files say (``before``: the configs with a verdict as it started): the verdicts it wrote (the
    configs they refuse pruned), and a rerun that lowers only the configs left without one, or
    nothing where each has one."""
    from orchestrator.store.lowering import read_verdicts

    with_one = set(read_verdicts(sd.root, sd.spec.fingerprint(), sd.spec.kernel.target.name))
    kept, left = len((with_one - before) & todo), len(todo - with_one)
    path = sd.root / "lowering.jsonl"
    said = f"the {counted(kept, 'verdict')} it wrote {'is' if kept == 1 else 'are'} kept in {path}"
    said += " (the configs they refuse are pruned)"
    if not left:
        if not kept:
            return f"every config to measure has its verdict in {path} already; a rerun of plan --lower lowers nothing"
        return f"{said}; every config to measure has one, so a rerun of plan --lower lowers nothing"
    if not kept:
        said = f"no verdict was written to {path}"
    return f"{said}; {_rerun(args, sd.root)} lowers only the {counted(left, 'config')} left without one"


def _rerun(args: argparse.Namespace, root: Path) -> str:
    """The command that lowers what a stopped lowering of ``root`` left without a verdict."""
    return f"`{PROG} plan {word(args.spec)} --lower --sweep-dir {word(root)}`"


def _summary(
    spec: SweepSpec,
    seen: Counter[str],
    plan: ToLower,
    wall_s: float,
    root: Path | None,
    where: str,
    sweep_dir: str | None,
) -> None:
    """What lowering said of the configs ``plan`` lowered, and of those it left out (invalid,
    pruned or lowered before; carried from earlier documents; recorded by the workers already)."""
    target = spec.kernel.target
    n, skipped, reused = len(plan.todo), plan.settled, plan.reused
    carried = f"{reused} reused from earlier documents, not lowered (carried into the results, never measured)"
    if n == 0:
        print(
            f"nothing to lower for {target.name}: {skipped} planned configs are invalid, pruned or lowered before"
            + (f"; {carried}" if reused else "")
        )
        _say_recorded(plan.recorded)
        _say_next(root)
        return
    smem = f"{seen['smem']} for shared memory"
    if not impls.get(spec.measured_impl).lowering_sizes_smem:  # Triton sizes it when the GPU compiles
        smem = "its lowering sizes no shared memory: a config over it fails to compile on the GPU, an error record"
    print(
        f"lowered {counted(n, 'config')} for {target.name} ({target.sm}, {target.smem_limit_bytes} bytes of shared "
        f"memory per block) on {where} in {wall_s:.1f} s: {seen['lowered']} lowered, {seen['refused']} refused "
        f"({smem}), {seen['crashed']} crashed"
        + (f"; {skipped} not lowered (invalid, pruned by the model, or lowered before)" if skipped else "")
        + (f"; {carried}" if reused else "")
    )
    _say_recorded(plan.recorded)
    if root is not None:
        print(f"verdicts in {root / 'lowering.jsonl'}; the workers record refused configs as pruned, never compiled")
        _say_next(root)
    elif seen["refused"] or seen["crashed"]:
        warn(f"note: --dry-run keeps no verdicts; {_to_keep(sweep_dir)}")


def _say_next(root: Path | None) -> None:
    """The command that runs the sweep directory ``root`` lowering planned (None: a dry run, none)."""
    if root is not None:
        print(f"next: `{PROG} resume {word(root)}` measures what has no record yet (on SLURM: submits it)")


def _say_recorded(recorded: int) -> None:
    """How many configs were not lowered because the sweep's workers recorded them already."""
    if recorded:
        print(
            f"{counted(recorded, 'config')} skipped, not lowered: the sweep's workers recorded "
            f"{'it' if recorded == 1 else 'them'} already (measured or errored), so no verdict would prune "
            f"{'it' if recorded == 1 else 'them'}"
        )


def _to_keep(sweep_dir: str | None) -> str:
    """How to keep a dry run's verdicts, for the command line it was given (``--sweep-dir`` or not)."""
    if sweep_dir:
        return f"run it again without --dry-run to keep them in {word(sweep_dir)} and prune what they refused"
    return "plan with --lower --sweep-dir DIR to keep them and prune what they refused"
