"""``tilesweep status SWEEP``, ``tilesweep ls [DIR]`` and ``tilesweep logs SWEEP UNIT``: what
users of SLURM tools expect to find (one sweep's progress from any shell, ``squeue``-like listing
of one's sweeps, ``cat`` of one unit's log); ``status`` is listed with the sweep commands
(``add_status``).

The work is done in ``orchestrator.control.listing``; this module prints.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from orchestrator.cli.common import PROG, Subparsers

_STATE_WIDTH = 54  # items and a state such as "incomplete, 12 units to resume"


CUT_SHORT = "a plan cut short before it was written whole (no sweep.json yet)"


def cmd_ls(args: argparse.Namespace) -> int:
    from orchestrator.control.listing import list_sweeps
    from orchestrator.control.status_text import rounds_summary, sweep_state

    folder = Path(args.dir) if args.dir else (Path("sweeps") if Path("sweeps").is_dir() else Path("."))
    listed = list_sweeps(folder)
    if not listed:
        print(f"no sweep directories under {folder} (a sweep directory holds sweep.json)")
        return 0
    width = max(len(str(x.path)) for x in listed)
    rows: list[tuple[str, str, str | None]] = []
    for x in listed:
        st = x.status
        if x.finish is not None:
            rows.append((str(x.path), f"{CUT_SHORT}; run again, {x.finish} finishes it", None))
            continue
        if st is None:
            rows.append((str(x.path), f"unreadable: {x.error}", None))
            continue
        if st.plan_finish is not None:
            rows.append((str(x.path), f"{sweep_state(st)}; run again, {st.plan_finish} finishes it", None))
            continue
        state = sweep_state(st, advice=False)
        todo = len(st.ended_unfinished()) + len(st.never_started())
        if todo and st.settled and not st.complete:
            why = "stopped on a full disk" if st.run_stop is not None else "incomplete"
            state = f"{why}, {todo} unit{'s' if todo != 1 else ''} to resume"
        rounds = rounds_summary(st)
        state += f" ({rounds})" if rounds else ""
        counts = ", ".join(f"{n} {s}" for s, n in st.counts().items())
        gpu = f"  {st.gpu_hours:.2f} GPU-h" if st.gpu_hours is not None else ""
        replay = "  replayed, not measured" if st.replay_of else ""
        if st.search is not None and st.grid is not None:  # a search measures a part of its grid
            items = f"{st.configs_measured:>6}/{st.grid:<6} configs"
        else:
            items = f"{st.items_done:>6}/{st.planned:<6} items"
        rows.append((str(x.path), f"{items}  {state}", f"units: {counts}{gpu}{replay}"))
    # the units column lines up after the states (a long rounds summary pushes only its own line)
    state_width = min(max((len(m) for _, m, units in rows if units is not None), default=0), _STATE_WIDTH)
    for path, middle, units in rows:
        print(f"{path:<{width}}  {middle}" if units is None else f"{path:<{width}}  {middle:<{state_width}}  {units}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from orchestrator.control.listing import log_of
    from orchestrator.store.files import open_file
    from orchestrator.store.sweepdir import SweepDir

    path = log_of(SweepDir.open(args.sweep_dir), args.unit, task=args.task)
    with open_file(path) as f:  # opened first: a log that cannot be read leaves no header behind
        print(f"==> {path} <==")  # on stdout with the log, as `tail -v` prints it: a capture keeps them together
        sys.stdout.flush()
        shutil.copyfileobj(f, sys.stdout.buffer)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.control.status import format_status, status_json, sweep_status
    from orchestrator.store.sweepdir import SweepDir

    sd = SweepDir.open(args.sweep_dir)
    st = sweep_status(sd, keep_tally=True)
    if args.json:
        print(status_json(st))
    else:
        print(format_status(st))
    return 1 if st.command_left else 0  # what `status --help` (STATUS_HELP) and the README say


STATUS_HELP = (
    "Progress of a sweep, from its directory and one squeue + sacct, from any shell: items done, errors, "
    "each unit's state, records, SLURM task and GPU, for a unit that ended unfinished why (its worker's own "
    "reason, a signal, who cancelled it) and its log, the final merge job, and the command that does what is left. "
    "Exit code 0: nothing waits for a command of yours (the sweep is complete and merged, or it runs and no unit "
    "has failed, or its final merge job or the `run` that runs it writes its document); 1: some units ended "
    "without finishing, or were never started (a plan never run, a run stopped before it started them, an "
    "array sbatch refused), and "
    f"nothing took their items over, or a round is still to plan and nothing running will (`{PROG} resume DIR` "
    "does these); or its plan was cut short before its units were written (the command that started it, run "
    "again, finishes it); or, once the units ended, the final merge job refused, or ended before merging (scancel), or "
    "sbatch refused it, and no merge wrote the document since, or every unit is done and the results document "
    "is missing or older than records written since "
    f'("complete, not merged": `{PROG} merge DIR` writes it); 2: the sweep directory cannot be read.'
)


def add_status(sub: Subparsers) -> None:
    """Add ``status`` to an ``add_subparsers()`` object (the sweep commands list it after ``merge``)."""
    s = sub.add_parser("status", help="progress of a sweep, from any shell", description=STATUS_HELP)
    s.add_argument("sweep_dir")
    s.add_argument(
        "--json",
        action="store_true",
        help="print the status as one JSON object (totals, states, rounds, final merge jobs, every unit) "
        "instead of the text; the exit code is the same",
    )
    s.set_defaults(func=cmd_status)


def register(sub: Subparsers) -> None:
    """Add ``ls`` and ``logs`` to an ``add_subparsers()`` object."""
    s = sub.add_parser(
        "ls",
        help="list the sweep directories under a folder, with their progress",
        description="Every sweep directory under DIR (default: ./sweeps if it exists, else .), "
        "with items done, state, units per state and GPU-hours; SLURM is asked once for all.",
    )
    s.add_argument("dir", nargs="?", metavar="DIR", help="the folder to look under (default: ./sweeps, else .)")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser(
        "logs",
        help="print the log of one unit of a sweep",
        description=f"Print a unit's log (its workers' output, every attempt), after a line naming the file. "
        f"UNIT is a unit id as `{PROG} status` shows it, an id prefix, or a position 0, 1, ... in the unit index "
        "(units.json's order; a number is read as a position first: give an id prefix with a letter in it, or "
        f"more of it), or a SLURM task id as `{PROG} status` shows it in its job column (6343_0): the log of the "
        "unit that task ran, or the task's own log where it ran several (a task of a whole GPU node), whose lines "
        "name each unit; or a SLURM job id as squeue and sacct print it: the sweep's final merge job (its log), or "
        "an array (the log of its task where it has one; of several, name the task: 6343_1), or an array task's own "
        "job id (sacct -o JobIDRaw, squeue's %A: SLURM asked which task it is, unless TILESWEEP_SLURM_QUERIES=0; "
        "that task's log). squeue's row of "
        "an array's tasks that wait to start (6343_[0-2%1]) is answered with the task ids to give. Each attempt's "
        'output opens with a line naming the unit and where it ran ("tilesweep: starting unit ..."), written by '
        "whoever started its worker.",
    )
    s.add_argument("sweep_dir")
    s.add_argument(
        "unit",
        help="a unit id, an id prefix, a position in the unit index, a SLURM task id, or a job id of the sweep",
    )
    s.add_argument(
        "--task", action="store_true", help="print the log of the SLURM task that ran it last (or that task's) instead"
    )
    s.set_defaults(func=cmd_logs)
