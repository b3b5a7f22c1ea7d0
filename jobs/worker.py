"""Run one unit of a sweep on this node: ``python -m jobs.worker SWEEP_DIR UNIT_ID``.

Knows nothing of SLURM: dispatch calls ``run_unit`` (through submitit) or a user runs it
by hand. Each finished config is appended to the unit's partial file at once (flushed and
fsynced), so a kill loses at most the configs in flight; a rerun skips what is recorded.
The completion marker is written atomically at the end.

The unit loop is the same for every kind of measuring: configs the shared-memory model prunes
(and invalid ones) are recorded without measuring, so are configs given up on after
``executor.max_config_attempts`` deaths; the rest go to the unit's measurer (``jobs.measurer``:
compile and time the real kernels, ``jobs.compiled``; or, with ``kernel.impl: replay``, answer
from the replay source on a virtual clock, ``jobs.replay``). Which round of the sweep a unit
belongs to (its unit file says; the halving strategy has two) decides how its items are timed
(``orchestrator.planning.halving.measurement``).

A worker that is stopped is not a config that died: SIGINT (Ctrl-C) and SIGTERM (scancel, the
local executor stopping) write an ``abandon`` line for every config in flight, then the worker
exits (``stop_signals``); a warning before the time limit (USR2, see the dispatch tasks) stops
it between configs the same way. Only when the time limit finds a config hung does it count.

Items of the unit that ``tilesweep resume`` gave to later units (``store.handed_on``) are theirs:
a worker started on the old unit afterwards (by hand, or a task SLURM requeued) leaves them to
those units, says so, and writes no marker (the unit is not complete on its own).
"""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":  # run by hand: a Ctrl-C while the modules load ends in one line too

    def _interrupted_early(signum: int, frame: object) -> None:
        print("tilesweep worker: interrupted before it started; nothing was written", file=sys.stderr)
        raise SystemExit(130)

    signal.signal(signal.SIGINT, _interrupted_early)

import argparse
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import counted
from orchestrator.errors import TilesweepError
from orchestrator.planning import RUN, WorkItem
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.model import SweepSpec
from orchestrator.store.files import WRITE_ERRNOS, cannot_write, now_iso
from orchestrator.store.handed_on import later_holders
from orchestrator.store.leases import unit_lease
from orchestrator.store.lines import PartialHeader, PartialWriter, header_line, partial_header
from orchestrator.store.markers import UnitCounts, UnitSummary, worker_summary, write_marker
from orchestrator.store.partials import PartialContent, check_headers, read_partial
from orchestrator.store.quarantine import quarantine
from orchestrator.store.round2 import unit_round
from orchestrator.store.sweepdir import SweepDir

from . import in_flight, measure
from .attempt import Attempt
from .compiled import CompiledMeasurer
from .in_flight import abandon_in_flight, stop_signals
from .measurer import Measurer
from .node_env import device_block, slurm_task
from .replay import ReplayMeasurer

# what control's dispatch takes from here: abandon_in_flight (a unit worker's TERM handler finds
# it in sys.modules) and device_block (the environment of a run on this machine)
__all__ = ["abandon_in_flight", "device_block", "main", "measurer_for", "run_unit"]

log = logging.getLogger(__name__)

# item id -> [starts, deaths, hangs] in other units' partials, or one count of both starts and deaths
PriorStarts = dict[str, int | list[int] | tuple[int, int, int]]


def run_unit(
    sweep_dir: str,
    unit_key: str,
    *,
    stop_check: Callable[[], bool] | None = None,
    prior_starts: PriorStarts | None = None,
    stop_on: tuple[int, ...] = in_flight.STOP_SIGNALS,
) -> UnitSummary:
    """Run every item of the unit that has no record yet; return a summary.

    ``stop_check()`` (optional) is polled between configs; when it returns True the worker
    stops cleanly after the config being timed (configs compiled ahead are abandoned).
    ``prior_starts`` (optional): item id -> [starts, deaths, hangs] of that item in other
    units' partials (``resume.ResumePlan.prior_starts``). ``tilesweep resume`` regroups missing
    items into new units, whose partials start empty; without these counts a config that kills
    its worker would get a fresh ``executor.max_config_attempts`` in every resumed unit and
    never be given up on. ``stop_on``: the signals whose handlers the worker takes over while
    it runs (``in_flight.stop_signals``: abandon the configs in flight, exit); the whole-node
    ``unit_worker`` keeps its own TERM handler (abandon, stop at the next config, exit STOPPED).
    """
    with stop_signals(stop_on):
        return _run_unit(sweep_dir, unit_key, stop_check, prior_starts)


def measurer_for(spec: SweepSpec, sweep_root: Path) -> Measurer:
    """The measurer of a sweep's units: replay's where ``kernel.impl: replay`` answers from a
    document, compile-and-time otherwise (as Kernel Tuner picks its simulation runner or its
    real one, once, before the tuning loop)."""
    if spec.kernel.impl == "replay":
        return ReplayMeasurer(spec)
    return CompiledMeasurer(spec, sweep_root)


def _existing(sd: SweepDir, unit_id: str, spec: SweepSpec, prior_starts: PriorStarts | None) -> PartialContent:
    """What the unit's partial records, with the starts that died in other units' partials
    (``prior_starts``). A partial that is not this sweep's unit's (copied from another sweep,
    another unit, another environment, or not a worker's at all) is moved to quarantine first,
    as the merger would: nothing in it counts, and nothing is appended to it."""
    path = sd.partial_path(unit_id)
    existing = read_partial(path)
    why = existing.foreign or check_headers(existing.headers, unit_id, spec.fingerprint(), sd.recorded_env())
    if why is not None and quarantine(sd.root, path, why) is not None:
        existing = read_partial(path)
    for iid, counts in (prior_starts or {}).items():
        starts, deaths, hangs = (counts, counts, 0) if isinstance(counts, int) else counts
        existing.starts[iid] += starts
        existing.deaths[iid] += deaths
        existing.hangs[iid] += hangs
    return existing


def _run_unit(
    sweep_dir: str, unit_key: str, stop_check: Callable[[], bool] | None, prior_starts: PriorStarts | None
) -> UnitSummary:
    sd = SweepDir.open(sweep_dir)
    unit_id = sd.resolve_unit(unit_key)
    # one worker per unit, ever: refused here, before anything is written, when a live one holds it
    with unit_lease(sd.root, unit_id, gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), job=slurm_task()):
        return _run_leased(sd, unit_id, stop_check, prior_starts)


def _run_leased(
    sd: SweepDir, unit_id: str, stop_check: Callable[[], bool] | None, prior_starts: PriorStarts | None
) -> UnitSummary:
    """``run_unit`` once the unit's lease is held."""
    items = sd.unit_items(unit_id)
    spec = sd.spec
    measurer = measurer_for(spec, sd.root)
    sd.check_env(env_fingerprint(measurer.device))
    existing = _existing(sd, unit_id, spec, prior_starts)
    todo = [it for it in items if it.id not in existing.records]
    handed = _handed_on(sd, unit_id, todo)
    todo = [it for it in todo if it.id not in handed]
    if handed and not todo:  # nothing of its own left: no attempt, not a line written
        return _left_to_later_units(unit_id, measurer, total=len(items), handed=handed, round_=unit_round(sd, unit_id))
    started = time.perf_counter()
    with PartialWriter(sd.partial_path(unit_id)) as w:
        attempt = Attempt(
            unit_id=unit_id,
            number=existing.attempts + 1,
            writer=w,
            todo=len(todo),
            starts=existing.starts,
            deaths=existing.deaths,
            hangs=existing.hangs,
            round=unit_round(sd, unit_id),
            stop_check=stop_check,
        )
        in_flight.begin(w, attempt.number)
        attempt.write(header_line(_header(spec, attempt, measurer)))
        log.info(
            "unit %s attempt %d (round %d): %d of %s to do",
            unit_id,
            attempt.number,
            attempt.round,
            len(todo),
            counted(len(items), "item"),
        )
        stopped = measurer.run(attempt, _record_unmeasured(attempt, todo, spec))
        in_flight.end()
    summary = _summary(attempt, measurer, total=len(items), stopped=stopped, wall_s=time.perf_counter() - started)
    if handed:  # what later units hold of it is theirs: it is not complete on its own, so no marker
        summary["already"] -= len(handed)
        summary["handed_on"] = dict(Counter(handed.values()))
    elif not stopped:
        recorded = {iid: "error" in rec for iid, (_, rec) in existing.records.items()} | attempt.recorded
        write_marker(sd, summary, records=len(recorded), errors=sum(recorded.values()))
    return summary


def _handed_on(sd: SweepDir, unit_id: str, todo: list[WorkItem]) -> dict[str, str]:
    """Item id -> the later unit ``tilesweep resume`` gave it to, of the items of ``todo`` such a
    unit holds (``store.handed_on``): left to it, said in the log."""
    handed = later_holders(sd, unit_id, {it.id for it in todo})
    if handed:
        log.info(
            "unit %s: %d of its items without a record %s held by later units that `tilesweep resume` gave them "
            "to (%s): not measured here",
            unit_id,
            len(handed),
            "is" if len(handed) == 1 else "are",
            ", ".join(sorted(set(handed.values()))),
        )
    return handed


def _left_to_later_units(
    unit_id: str, measurer: Measurer, *, total: int, handed: dict[str, str], round_: int
) -> UnitSummary:
    """The summary of a worker that found every item of its unit without a record held by later
    units (``_handed_on``): it wrote nothing."""
    summary = worker_summary(
        unit=unit_id,
        attempt=0,
        unit_round=round_,
        total=total,
        already=total - len(handed),
        stopped=False,
        wall_s=0.0,
        counts=UnitCounts(),
        **_how_measured(measurer),
    )
    summary["handed_on"] = dict(Counter(handed.values()))
    return summary


def _header(spec: SweepSpec, attempt: Attempt, measurer: Measurer) -> PartialHeader:
    """The first line of each attempt: which sweep, unit and environment its records belong to,
    where it ran (host, pid, SLURM job), so a record can be traced to its worker, and how it
    measured (round, timer, L2 flush, real or virtual clock)."""
    method = measurer.method
    return partial_header(
        unit=attempt.unit_id,
        sweep=spec.fingerprint(),
        attempt=attempt.number,
        device=measurer.device,
        env=env_fingerprint(measurer.device),
        host=socket.gethostname(),
        pid=os.getpid(),
        slurm_job_id=slurm_task(),
        gpu=os.environ.get("CUDA_VISIBLE_DEVICES"),
        started=now_iso(),
        measure={
            "impl": spec.kernel.impl,
            "strategy": spec.timing.strategy,
            "round": attempt.round,
            "timer": method.records_timer,
            "flush_l2": method.flush_l2,
            "clock": method.clock,
        },
    )


def _record_unmeasured(attempt: Attempt, todo: list[WorkItem], spec: SweepSpec) -> list[WorkItem]:
    """Record at once what needs no measuring (pruned, invalid, and configs given up on after
    ``executor.max_config_attempts`` deaths); return the items left to measure."""
    runnable = []
    for it in todo:
        if it.kind != RUN:
            attempt.record(it, measure.skipped_record(it))
        elif attempt.deaths[it.id] >= spec.executor.max_config_attempts:
            attempt.record(it, measure.crashed_record(it, attempt.deaths[it.id], attempt.hangs[it.id]))
        else:
            runnable.append(it)
    return runnable


def _summary(attempt: Attempt, measurer: Measurer, *, total: int, stopped: bool, wall_s: float) -> UnitSummary:
    """What ``run_unit`` returns and, when the unit finished, its completion marker holds."""
    return worker_summary(
        unit=attempt.unit_id,
        attempt=attempt.number,
        unit_round=attempt.round,
        total=total,
        already=total - attempt.todo,
        stopped=stopped,
        wall_s=wall_s,
        counts=attempt.counts,
        **_how_measured(measurer),
    )


def _how_measured(measurer: Measurer) -> dict[str, Any]:
    """What a unit's summary says of how and where its worker measured: the clock, the compile
    workers and mode, the timer, its GPU and SLURM task."""
    method = measurer.method
    return {
        "clock": method.clock,
        "compile_workers": method.compile_workers,
        "compile_mode": method.compile_mode,
        "timer": method.timer,
        "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "job": slurm_task(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.worker", description="Run one unit of a tilesweep sweep.")
    parser.add_argument("sweep_dir")
    parser.add_argument("unit", help="unit id, id prefix, or position in the sweep's unit index")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s: %(message)s"
    )
    try:
        summary = run_unit(args.sweep_dir, args.unit)
    except TilesweepError as exc:
        print(f"tilesweep worker: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        print(f"tilesweep worker: error: {cannot_write(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "tilesweep worker: interrupted; finished records are kept, the configs in flight were given up "
            "(not counted against them); run it again to continue",
            file=sys.stderr,
        )
        return 130
    print(
        f"unit {summary['unit']}: {summary['done']} record{'s' if summary['done'] != 1 else ''} written "
        f"({summary['errors']} error{'s' if summary['errors'] != 1 else ''}), "
        f"{summary['already']} already done, {summary['wall_s']:.1f}s"
    )
    if summary.get("handed_on"):
        print(_handed_on_line(summary["handed_on"]))
    return 0


def _handed_on_line(handed: dict[str, int]) -> str:
    """What a worker run by hand says of the items it left to later units (``_handed_on``)."""
    n = sum(handed.values())
    units = ", ".join(f"{uid} ({k} item{'s' if k != 1 else ''})" for uid, k in sorted(handed.items()))
    them = "a later unit, which measures" if len(handed) == 1 else "later units, which measure"
    items = f"{n} item{'s' if n != 1 else ''}"
    return f"  not measured here: {items} `tilesweep resume` gave to {them} {'it' if n == 1 else 'them'}: {units}"


if __name__ == "__main__":
    sys.exit(main())
