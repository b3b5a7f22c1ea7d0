"""The ``tilesweep`` command line: the only place that prints or configures logging.

Every expected failure is a ``TilesweepError``; it becomes one line on stderr and exit
code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator.errors import PlanError, SpecError, TilesweepError
from orchestrator.control.status import format_duration

PROG = "tilesweep"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


# ------------------------------------------------------------------------ progress


class Progress:
    """A one-line progress display on stderr: redrawn on a terminal, a line every ~10 s otherwise."""

    def __init__(self, total: int, label: str = "items", stream: Any = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self.first_done: int | None = None
        self.last_print = 0.0
        self.last_text = ""
        self.finished = False

    def update(self, done: int, extra: str = "") -> None:
        now = time.monotonic()
        if self.first_done is None:
            self.first_done = done
        elapsed = now - self.start
        rate_done = done - self.first_done
        eta = f", ETA {format_duration(elapsed / rate_done * (self.total - done))}" if rate_done > 0 and done < self.total else ""
        width = 24
        filled = int(width * min(done, self.total) / self.total)
        text = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {self.label}{extra}, {format_duration(elapsed)} elapsed{eta}"
        if self.tty:
            self.stream.write("\r" + text.ljust(len(self.last_text)))
            self.stream.flush()
        elif now - self.last_print >= 10 or (done >= self.total and not self.finished):
            self.stream.write(text + "\n")
            self.stream.flush()
            self.last_print = now
        self.last_text = text
        self.finished = done >= self.total

    def close(self) -> None:
        if self.tty and self.last_text:
            self.stream.write("\n")
            self.stream.flush()


# ------------------------------------------------------------------------ helpers


def _load_spec(path: str) -> Any:
    from orchestrator.spec.files import load_spec

    return load_spec(path)


def positive_int(value: str) -> int:
    """argparse type of counts (--units, --workers, --max-array-size); argparse names the flag."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


def default_sweep_dir(spec_path: str, spec: Any) -> Path:
    return Path("sweeps") / f"{Path(spec_path).stem}-{spec.fingerprint()[:8]}"


def _load_costs(path: str | None) -> Any:
    from orchestrator.store.document import load_costs

    return load_costs(path) if path else None


def prepare_sweep(spec_path: str, sweep_dir: str | None, units: int | None, output: str | None,
                  costs: str | None = None) -> tuple[Any, list[str], bool]:
    """Create (or reopen) the sweep directory of a spec; return it, the units to run, and
    whether it already existed. An existing directory of the same spec is resumed.
    ``costs``: a results document whose measured costs shard the units."""
    from orchestrator.planning import plan
    from orchestrator.store.sweepdir import SweepDir

    spec = _load_spec(spec_path)
    root = Path(sweep_dir) if sweep_dir else default_sweep_dir(spec_path, spec)
    out = Path(output) if output else Path(spec.output)
    existed = (root / "sweep.json").exists()
    items, planned_units = plan(spec, units, costs=_load_costs(costs))
    sd = SweepDir.create(root, spec, output=out.resolve(), spec_source=str(Path(spec_path).resolve()), planned=len(items))
    from filelock import FileLock

    with FileLock(str(sd.lock_path), timeout=60):
        if not sd.unit_index():
            sd.add_units(planned_units, origin="plan")
    return sd, [u["id"] for u in sd.unit_index()], existed


def print_table(output: Path) -> None:
    """The best-config table of a results document (what `tilesweep report` prints)."""
    from orchestrator.analysis import report
    from orchestrator.store import document as results_doc

    print(report.format_table(report.best_table(results_doc.load(output))))


# ------------------------------------------------------------------------ commands


def cmd_spec(args: argparse.Namespace) -> int:
    from orchestrator.spec.model import SweepSpec

    if args.schema:
        print(json.dumps(SweepSpec.model_json_schema(), indent=2))
        return 0
    if not args.file:
        raise SpecError("pass a spec file to check, or --schema to print the JSON Schema")
    spec = _load_spec(args.file)
    print(json.dumps(spec.model_dump(mode="json"), indent=2))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from orchestrator.planning import INVALID, PRUNED, plan, plan_line

    spec = _load_spec(args.spec)
    items, units = plan(spec, args.units, costs=_load_costs(args.costs))
    if args.json:
        out = sys.stdout
        for it in items:
            out.write(json.dumps(plan_line(it)) + "\n")
        return 0
    n_invalid = sum(it.kind == INVALID for it in items)
    n_pruned = sum(it.kind == PRUNED for it in items)
    print(f"{len(items)} items in {len(units)} units ({n_pruned} pruned by the shared-memory model, {n_invalid} invalid)")
    for u in units:
        shapes = sorted({f"{it.dtype}/d{it.head_dim}/s{it.seq}" for it in u.items})
        print(f"  unit {u.index:>3} {u.id}: {len(u.items):>5} items  {', '.join(shapes[:4])}{' ...' if len(shapes) > 4 else ''}")
    if not args.dry_run:
        if not args.sweep_dir:
            raise PlanError("to write the plan pass --sweep-dir DIR (or --dry-run to only show it)")
        sd, unit_ids, _ = prepare_sweep(args.spec, args.sweep_dir, args.units, None, costs=args.costs)
        print(f"planned into {sd.root} ({len(unit_ids)} units); run one with: python -m jobs.worker {sd.root} 0")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.control import dispatch
    from orchestrator.store import merge
    from orchestrator.control.status import sweep_status

    sd, unit_ids, existed = prepare_sweep(args.spec, args.sweep_dir, args.units, args.output, costs=args.costs)
    spec = sd.spec
    kind = args.executor or spec.executor.kind
    if kind == "slurm":
        from orchestrator.cli import slurm as cli_slurm

        return cli_slurm.run_on_slurm(args, sd)
    st = sweep_status(sd, query_slurm=False)
    todo = [u.id for u in st.units if not u.complete]
    print(f"sweep {sd.root}: {sd.planned} items in {len(unit_ids)} units"
          + (f", {st.done} already recorded" if existed and st.done else ""), file=sys.stderr)
    if existed and args.units and args.units != len(unit_ids):
        print(f"{PROG}: note: {sd.root} keeps the {len(unit_ids)} units it was planned with; --units applies to a new "
              "sweep directory", file=sys.stderr)
    progress = Progress(sd.planned)

    def poll() -> None:
        progress.update(sweep_status(sd, query_slurm=False).done)

    outcomes = dispatch.run_units_locally(sd, todo, kind=kind, workers=args.workers, on_poll=poll) if todo else []
    poll()
    progress.close()
    summary = merge.merge(sd)
    print(merge_line(summary), file=sys.stderr)
    print_table(summary.output)
    failed = [o for o in outcomes if not o["ok"]]
    for o in failed:
        print(f"{PROG}: unit {o['unit']} failed: {o['error']} (log: {o['log']})", file=sys.stderr)
    if failed:
        print(f"{PROG}: rerun `{PROG} run {args.spec} --sweep-dir {sd.root}` to redo only the missing items", file=sys.stderr)
        return 1
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from orchestrator.store import merge
    from orchestrator.store.sweepdir import SweepDir

    sd = SweepDir.open(args.sweep_dir)
    summary = merge.merge(sd, output=Path(args.output) if args.output else None)
    print(merge_line(summary))
    return 0


def merge_line(summary: Any) -> str:
    """One line on what a merge did, naming what it set aside (the warnings name the files)."""
    text = (f"merged {summary.records} records ({summary.errors} errors, {summary.missing} of {summary.planned} "
            f"planned missing) into {summary.output}")
    if summary.skipped_lines:
        text += f"; skipped {summary.skipped_lines} torn or invalid partial lines (their items are redone by resume)"
    if summary.quarantined:
        text += f"; quarantined {len(summary.quarantined)} partial file(s) (see the warnings above)"
    return text


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.control.status import format_status, sweep_status
    from orchestrator.store.sweepdir import SweepDir

    sd = SweepDir.open(args.sweep_dir)
    st = sweep_status(sd)
    if args.json:
        print(json.dumps(st.to_json(), indent=1))
        return 0
    print(format_status(st))
    return 0


# ------------------------------------------------------------------------ parser

Register = Callable[[Any], None]


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Autotune Pallas flash-attention tile configs on a SLURM cluster or locally.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("spec", help="check a spec file, or print the spec's JSON Schema")
    s.add_argument("file", nargs="?")
    s.add_argument("--schema", action="store_true", help="print the JSON Schema of spec files")
    s.set_defaults(func=cmd_spec)

    s = sub.add_parser("plan", help="expand and shard a spec into work items and units")
    s.add_argument("spec")
    s.add_argument("--units", type=positive_int, help="number of units (overrides the spec's sharding.units)")
    s.add_argument("--dry-run", action="store_true", help="only show the plan, write nothing")
    s.add_argument("--json", action="store_true", help="one JSON object per item (record fields + unit)")
    s.add_argument("--sweep-dir", help="write the plan into this sweep directory")
    s.add_argument("--costs", metavar="RESULTS.json", help="shard with the measured costs of an earlier results document (the model fills in)")
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("run", help="plan, run all units here (or on SLURM and wait), merge, show the best configs")
    s.add_argument("spec")
    s.add_argument("--sweep-dir", help="sweep directory (default: sweeps/<spec name>-<fingerprint>)")
    s.add_argument("--units", type=positive_int, help="number of units (overrides the spec)")
    s.add_argument("--executor", choices=["local", "debug", "slurm"], help="override the spec's executor.kind")
    s.add_argument("--workers", type=positive_int, help="local: parallel workers (default: one per visible GPU)")
    s.add_argument("--output", help="results document (default: the spec's output)")
    s.add_argument("--costs", metavar="RESULTS.json", help="shard with the measured costs of an earlier results document (the model fills in)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("merge", help="merge a sweep's partial records into its results document")
    s.add_argument("sweep_dir")
    s.add_argument("--output", help="write here instead of the spec's output")
    s.set_defaults(func=cmd_merge)

    s = sub.add_parser("status", help="progress of a sweep, from any shell")
    s.add_argument("sweep_dir")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    from orchestrator.cli import analysis, slurm

    analysis.register(sub)
    slurm.register(sub)
    return p


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except TilesweepError as exc:
        print(f"{PROG}: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; finished records are kept, rerun to continue", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
