"""``tilesweep spec | plan | run | merge | status``: a sweep from its spec to its results
document, run here (or on SLURM and waited for: ``run`` with the slurm executor)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import word
from orchestrator.cli.browse import add_status
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
    positive_int,
    prepare_run,
    print_plan_notes,
    search_plan_line,
    unit_column,
    units_capped,
    warn,
)
from orchestrator.cli.finish import merge_line
from orchestrator.cli.following import follow_run
from orchestrator.cli.kept_plan import plan_kinds, print_kept_plan
from orchestrator.cli.reusing import add_reuse_args, reuse_lines, reuse_request
from orchestrator.cli.running import rerun_command, run_here
from orchestrator.errors import PlanError, SpecError, SweepDirError, TilesweepError

if TYPE_CHECKING:  # the control flows import submitit: loaded when a command runs, not for --help
    from orchestrator.control.reuseplan import Planned
    from orchestrator.planning import Verdicts
    from orchestrator.spec.model import SweepSpec
    from orchestrator.store.sweepdir import SweepDir

DRY_RUN_HELP = (
    "only show the plan, write nothing (of a --sweep-dir planned before: the units it keeps, its items as "
    "pre-flight lowering left them)"
)
COSTS_HELP = "shard with the measured costs of an earlier results document (the model fills in)"


def cmd_spec(args: argparse.Namespace) -> int:
    from orchestrator.spec.files import load_spec
    from orchestrator.spec.model import SweepSpec

    if args.schema and args.file:
        raise SpecError(f"--schema prints the schema of every spec, not {args.file}'s: drop {args.file} or --schema")
    if args.schema:
        print(json.dumps(SweepSpec.model_json_schema(), indent=2))
        return 0
    if not args.file:
        raise SpecError("pass a spec file to check, or --schema to print the JSON Schema")
    from orchestrator.planning.grids import check_supported
    from orchestrator.store.sweep_paths import default_root

    spec = load_spec(args.file)
    check_supported(spec, args.file)  # what the kernel implementation cannot do, which `plan` refuses too
    _check_named_files(spec)
    print(json.dumps(spec.model_dump(mode="json"), indent=2))
    # what `plan` would note of it (stderr), its `plan --lower` spelled for this file and its default sweep directory
    lower = f"{PROG} plan {word(args.file)} --lower --sweep-dir {word(default_root(args.file, spec))}"
    print_plan_notes(spec, command=lower)
    return 0


def _check_named_files(spec: SweepSpec) -> None:
    """The files a spec names that ``plan`` reads, refused as ``plan`` refuses them: the replay's
    source (read whole: it must hold this spec's records) and each of ``reuse.documents`` (only
    opened: a large document is read when a plan reuses it)."""
    from orchestrator.control.sweeps import check_replay_source
    from orchestrator.store.document import check_openable

    check_replay_source(spec)
    for path in spec.reuse.documents:
        check_openable(path, "reuse.documents")


def cmd_plan(args: argparse.Namespace) -> int:
    from orchestrator.control.reuseplan import plan_with_reuse
    from orchestrator.control.sweeps import check_replay_source, default_sweep_dir
    from orchestrator.planning import plan_line
    from orchestrator.store.document import load_costs
    from orchestrator.store.sweepdir import SweepDir

    _check_plan_options(args)
    spec = _plan_spec(args)
    if args.lower:
        from orchestrator.cli.lower import cmd_plan_lower

        return cmd_plan_lower(args, spec)
    check_replay_source(spec)
    root = Path(args.sweep_dir) if args.sweep_dir else default_sweep_dir(args.spec, spec)
    if args.sweep_dir and (root / "sweep.json").exists() and print_kept_plan(args, spec, root):
        return 0
    if args.sweep_dir and not args.dry_run and not args.json and not (root / "sweep.json").exists():
        SweepDir.check_new(root)  # refused before the plan is shown (one cut short before its units is finished)
    planned = plan_with_reuse(
        spec, root, Path(spec.output), args.units, load_costs(args.costs) if args.costs else None, reuse_request(args)
    )
    if args.json:
        out = sys.stdout
        for it in planned.items:
            line = plan_line(it)
            if it.index in planned.found.records:
                line["reused_from"] = planned.found.records[it.index][1]
            out.write(json.dumps(line) + "\n")
        return 0
    _print_plan(spec, planned, args.units or spec.sharding.units, _verdicts(args, spec, root, planned))
    if not args.dry_run:
        if not args.sweep_dir:
            raise PlanError("to write the plan pass --sweep-dir DIR (or --dry-run to only show it)")
        _write_plan(args, spec, planned)
    return 0


def _write_plan(args: argparse.Namespace, spec: SweepSpec, planned: Planned) -> None:
    """Write ``planned`` into ``--sweep-dir`` and say what runs it next; a disk that takes no more
    of it (full, a quota, read-only) is said with the rerun that writes what it left out."""
    from orchestrator.control.sweeps import prepare_sweep
    from orchestrator.store.files import WRITE_ERRNOS, cannot_write

    try:
        sd, unit_ids, _ = prepare_sweep(
            args.spec,
            args.sweep_dir,
            args.units,
            None,
            costs=args.costs,
            reuse=reuse_request(args),
            spec=spec,
            planned=planned,
        )
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        again = f"`{PROG} plan {word(args.spec)} --sweep-dir {word(args.sweep_dir)}`"
        raise SweepDirError(f"{cannot_write(exc)}; then {again} again writes the plan it left unwritten") from None
    units = counted(len(unit_ids), "unit")
    if not planned.units:  # every item carried from earlier documents: no unit a worker would run
        print(
            f"planned into {sd.root} ({units}): every item is carried from earlier documents, nothing to "
            f"measure; `{PROG} merge {word(sd.root)}` writes its results document"
        )
    else:
        print(
            f"planned into {sd.root} ({units}); `{PROG} resume {word(sd.root)}` runs them (on SLURM: submits "
            f"them), or run one with: python -m jobs.worker {sd.root} 0"
        )


def _check_plan_options(args: argparse.Namespace) -> None:
    """Refuse, before anything is read, an option that would do nothing on this command line."""
    if args.lower_workers is not None and not args.lower:
        raise PlanError("--lower-workers sets the processes of pre-flight lowering: add --lower, or drop it")
    if args.json and args.sweep_dir and not args.dry_run and not args.lower:  # --json shows, never writes
        raise PlanError(
            f"--json prints the plan and writes nothing into {word(args.sweep_dir)}: add --dry-run to only show it, "
            "or drop --json to write the plan there"
        )


def _plan_spec(args: argparse.Namespace) -> SweepSpec:
    """The spec ``plan``'s command line names (``--device-kind`` over its kernel.device_kind),
    refused in one line naming the file (and the option) where its kernel cannot do it."""
    from orchestrator.planning.grids import check_supported
    from orchestrator.spec.files import load_spec, with_device_kind

    spec = with_device_kind(load_spec(args.spec), args.device_kind)
    check_supported(spec)  # naming the file, and --device-kind where it gave the kind
    return spec


def _verdicts(args: argparse.Namespace, spec: SweepSpec, root: Path, planned: Planned) -> Verdicts | None:
    """What pre-flight lowering of ``root`` said of the plan's configs already, for its note."""
    from orchestrator.store.carried import found_ids
    from orchestrator.store.lowering_todo import verdicts_of

    command = f"{PROG} plan {word(args.spec)} --lower --sweep-dir {word(root)}"
    return verdicts_of(spec, planned.items, root, found_ids(planned.items, planned.found), command)


def _print_plan(spec: SweepSpec, planned: Planned, units_asked: int | None, verdicts: Verdicts | None) -> None:
    from orchestrator.planning import RUN

    items, units = planned.items, planned.units
    n_units = len(units) + (planned.reused is not None)
    kinds = plan_kinds(spec, items)
    if planned.search is None:
        print(f"{items_in_units(len(items), n_units)} ({kinds})")
    else:
        in_units = f"{planned.size} of them in the {counted(n_units, 'unit')} of the search's round 1"
        print(f"{counted(len(items), 'item')} ({kinds}), {in_units}")
    units_capped(units_asked, len(units))
    shares = [u.share for u in units if u.share is not None]
    if shares:
        print(
            f"units: each task's {spec.executor.gpus_per_task()} GPUs take its largest units first, and its units "
            f"shrink towards its end ({max(shares):.2g} to {min(shares):.2g} of a unit's mean share of the work), "
            "so its GPUs end close together"
        )
    print_plan_notes(spec, verdicts=verdicts)
    for line in reuse_lines(planned.found.summary()):
        print(line)
    if spec.timing.strategy == "halving" and not spec.auto_only:  # auto_only: no forced config to screen
        print(
            f"halving: these units screen every forced config once (about {spec.timing.screen_target_ms:g} ms); "
            "round 2, planned when they are done, times the configs that can still win in full"
        )
    if planned.search is not None:
        unrun = sum(it.kind != RUN and it.index not in planned.found.records for it in planned.search.items)
        print(search_plan_line(planned.search.record, planned.size, unrun))
    for u in units:
        shapes = sorted({f"{it.dtype}/d{it.head_dim}/s{it.seq}" for it in u.items})
        more = " ..." if len(shapes) > 4 else ""
        print(f"  unit {u.index:>3} {u.id}: {unit_column(len(u.items))}  {', '.join(shapes[:4])}{more}")
    if planned.reused is not None:
        u = planned.reused
        print(f"  unit {u.index:>3} {u.id}: {unit_column(len(u.items))}  reused, nothing to measure")


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.control.sweeps import check_runs_here, default_sweep_dir, run_or_follow
    from orchestrator.planning.grids import check_supported
    from orchestrator.spec.files import load_spec
    from orchestrator.store.carried import read_summary
    from orchestrator.store.lowering_todo import sweep_verdicts
    from orchestrator.store.merge_output import ANOTHER_OUTPUT, check_target
    from orchestrator.store.parse_procs import requested

    requested()  # a bad TILESWEEP_MERGE_PROCS is said before anything is measured
    spec = load_spec(args.spec)
    check_supported(spec, args.spec)  # naming the spec file, before any planning
    kind = args.executor or spec.executor.kind
    if kind == "slurm":
        from orchestrator.cli.slurm import run_on_slurm

        return run_on_slurm(args)
    root = Path(args.sweep_dir) if args.sweep_dir else default_sweep_dir(args.spec, spec)
    check_runs_here(spec, args.spec, root)
    if spec.executor.gpus_per_node:  # said, not silently ignored
        warn(
            f"note: executor.gpus_per_node is SLURM's (GPUs per task); a {kind} run runs one unit per visible GPU "
            "(executor.local_workers caps how many at once)"
        )
    created = not root.exists()
    sd, unit_ids, existed = prepare_run(args, root, kind, reuse_request(args))
    if not args.overwrite:
        try:
            check_target(sd, elsewhere=ANOTHER_OUTPUT)  # refused now, not after the units ran
        except TilesweepError:
            if created:  # a sweep directory made for nothing (as `run` on SLURM): a rerun starts afresh
                shutil.rmtree(sd.root, ignore_errors=True)
            raise
    print_plan_notes(sd.spec, verdicts=sweep_verdicts(sd, args.spec))
    for line in reuse_lines(read_summary(sd)):
        print(line, file=sys.stderr)
    # the spec file's report.html, not only the frozen spec's: it is not part of the fingerprint
    html = spec.report.html
    with run_or_follow(sd, "run") as other:
        if other is not None:
            return follow_run(sd, other, redo=rerun_command(args.spec, sd), html=html, overwrite=args.overwrite)
        return run_here(sd, unit_ids, existed, kind, args, html=html)


def cmd_merge(args: argparse.Namespace) -> int:
    from orchestrator.control.sweeps import merge_sweep
    from orchestrator.store.sweepdir import SweepDir

    sd = SweepDir.open(args.sweep_dir)
    summary = merge_sweep(sd, output=Path(args.output) if args.output else None, overwrite=args.overwrite)
    print(merge_line(summary))
    if summary.written and not summary.missing and sd.spec.timing.strategy != "full":
        _later_rounds_note(sd)
    return 0 if summary.written else 1  # every partial with records quarantined: no document written


def _later_rounds_note(sd: SweepDir) -> None:
    """Every item of round 1 merged, and a later round of the strategy not done yet: the
    document is not final (its screens are no best), said so."""
    from orchestrator.control.status import sweep_status
    from orchestrator.control.status_text import rounds_lines

    st = sweep_status(sd, query_slurm=False)
    if not st.complete:
        print(f"note: the sweep is not done, so neither is this document: {'; '.join(rounds_lines(st))}")


def register(sub: Subparsers) -> None:
    """Add ``spec``, ``plan``, ``run``, ``merge`` and ``status`` to an ``add_subparsers()`` object."""
    s = sub.add_parser("spec", help="check a spec file, or print the spec's JSON Schema")
    s.add_argument("file", nargs="?", help="the spec file to check (JSON or TOML; a file: standard input is not read)")
    s.add_argument("--schema", action="store_true", help="print the JSON Schema of spec files")
    s.set_defaults(func=cmd_spec)

    s = sub.add_parser("plan", help="expand and shard a spec into work items and units")
    s.add_argument("spec")
    s.add_argument("--units", type=positive_int, help="number of units (overrides the spec's sharding.units)")
    s.add_argument("--dry-run", action="store_true", help=DRY_RUN_HELP)
    s.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per item (record fields + unit); shows the plan, writes none (with --lower: its "
        "verdict too, kept with --sweep-dir)",
    )
    s.add_argument("--sweep-dir", type=folder_path, help="write the plan into this sweep directory")
    s.add_argument("--costs", metavar="RESULTS.json", help=COSTS_HELP)
    s.add_argument(
        "--lower",
        action="store_true",
        help="pre-flight lowering: lower every config to measure (not reused, not recorded by its workers yet) for "
        "kernel.device_kind on this "
        "machine's CPUs; with --sweep-dir what the compiler refuses is recorded as pruned, never compiled on a GPU",
    )
    s.add_argument("--device-kind", metavar="KIND", help="target GPU (overrides the spec's kernel.device_kind)")
    s.add_argument("--lower-workers", type=positive_int, help="--lower: lowering processes (default: the CPUs)")
    add_reuse_args(s)
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("run", help="plan, run all units here (or on SLURM and wait), merge, show the best configs")
    s.add_argument("spec")
    s.add_argument("--sweep-dir", type=folder_path, help="sweep directory (default: sweeps/<spec name>-<fingerprint>)")
    s.add_argument("--units", type=positive_int, help="number of units (overrides the spec)")
    s.add_argument("--executor", choices=["local", "debug", "slurm"], help="override the spec's executor.kind")
    s.add_argument(
        "--workers",
        type=positive_int,
        help="local: parallel workers (default: one per visible GPU; without one, several "
        "time interpret mode side by side on the CPUs they share, disturbing each other's timings)",
    )
    s.add_argument("--output", type=file_path, help=f"results document (default: the spec's output; {MAKES_FOLDERS})")
    s.add_argument("--costs", metavar="RESULTS.json", help=COSTS_HELP)
    s.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    s.add_argument("--retry-errors", choices=RETRY_KINDS, help=RETRY_HELP)
    add_reuse_args(s)
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("merge", help="merge a sweep's partial records into its results document")
    s.add_argument("sweep_dir")
    s.add_argument("--output", type=file_path, help=f"write here instead of the spec's output ({MAKES_FOLDERS})")
    s.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    s.set_defaults(func=cmd_merge)

    add_status(sub)
