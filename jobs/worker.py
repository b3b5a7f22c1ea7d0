"""Run one unit of a sweep on this node: ``python -m jobs.worker SWEEP_DIR UNIT_ID``.

Knows nothing of SLURM: dispatch calls ``run_unit`` (through submitit) or a user runs it
by hand. Each finished config is appended to the unit's partial file at once (flushed and
fsynced), so a kill loses at most the configs in flight; a rerun skips what is recorded.
The completion marker is written atomically at the end.

Where the time goes, and what the worker does about it:
- configs the shared-memory model prunes (and invalid ones) are recorded without compiling;
- runnable configs are compiled a window at a time on a pool of threads or of compile
  processes (``compile.mode``) at most as large as the worker's CPUs (``compile.workers``),
  then checked and timed one after another with the pool idle (``jobs.compile_pool`` says
  why timing never overlaps a compile, and why processes);
- compiles go through jax's persistent cache (``compile.cache_dir``), so a rerun loads them;
- inputs and reference outputs are made once per shape (``measure.ShapeContext``);
- with ``kernel.impl: replay`` nothing is compiled or run: records come from the replay
  source (``jobs.replay``), their times on a virtual clock.

Which round of the sweep a unit belongs to (its unit file says; the halving strategy has two)
decides how its items are timed (``orchestrator.planning.halving.measurement``).

A window's configs all get a ``start`` line before it compiles (``"alone": true`` when the
window holds one config). If the worker dies there, each of them is a suspect on the next
attempt and is then run alone; only a death while a config was alone in flight counts against
it, so a config that really kills its worker is the only one that reaches
``executor.max_config_attempts``, never one that shared a window with it. A compile process
that dies costs only its config in flight, which was alone in it: the worker lives on, writes
that death (an ``alone`` start line, unless its start line was one), and compiles it again
with a new start line until the deaths reach ``executor.max_config_attempts``.

A worker that is stopped is not a config that died: SIGINT (Ctrl-C) and SIGTERM (scancel, the
local executor stopping) write an ``abandon`` line for every config in flight, then the worker
exits (``stop_signals``); a warning before the time limit (USR2, see the dispatch tasks) stops
it between configs the same way. Only when the time limit finds a config hung does it count.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import TilesweepError, WorkerEnvironmentError
from orchestrator.planning import RUN, WorkItem
from orchestrator.planning.halving import measurement
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.model import SCHEMA_VERSION, SweepSpec
from orchestrator.store.leases import unit_lease
from orchestrator.store.partials import PartialContent, PartialWriter, check_headers, read_partial
from orchestrator.store.quarantine import quarantine
from orchestrator.store.round2 import unit_round
from orchestrator.store.sweepdir import SweepDir, atomic_write_json, now_iso

from . import compile_cache, compile_pool, compile_procs, in_flight, measure, replay
from .in_flight import abandon_in_flight, stop_signals, write
from .node_env import check_backend, device_block, slurm_task

log = logging.getLogger(__name__)


@dataclass
class _Attempt:
    """One attempt at a unit: where its lines go, what it has done so far, and the inputs of
    the shape being timed (held here so they can be freed before the next shape's are made)."""

    unit_id: str
    attempt: int
    writer: PartialWriter
    todo: int  # items without a record when the attempt began
    starts: Counter  # item id -> starts that died with it in flight, here and in other units' partials
    deaths: Counter  # item id -> of those, the ones while it was alone in flight (what counts against it)
    hangs: Counter  # item id -> of those, the ones the time limit found hung
    stop_check: Callable[[], bool] | None = None
    round: int = 1
    ctx: measure.ShapeContext | None = None
    flush: Callable[[], None] | None = None  # the L2 flush before each sample (kernels.l2), or None
    timer: str = "wall"  # kernels.timing's name of this unit's timer (SweepSpec.timer_on)
    max_attempts: int = 1  # executor.max_config_attempts
    window: int = 0  # configs in the window being compiled
    done: int = 0
    errors: int = 0
    compiled: int = 0
    compile_cached: int = 0
    compile_sum_s: float = 0.0
    compile_wall_s: float = 0.0
    recorded: dict[str, bool] | None = None  # item id -> is an error, for what this attempt wrote
    timed_s: float = 0.0  # seconds spent timing (warm-up, probes, samples)
    screened: int = 0
    load_sum_s: float = 0.0  # loading compile processes' executables into this process
    compile_mode: str | None = None  # compile.mode (None: a replay compiles nothing)
    compile_deaths: int = 0  # compile processes that died with a config in flight

    def should_stop(self) -> bool:
        return in_flight.stop_requested() or (self.stop_check is not None and self.stop_check())

    def on_death(self, it: WorkItem) -> bool:
        """A compile process died with ``it`` in it, alone there: a death against it, in the partial
        as an alone start line (its own start line is one in a window of one). Compile it again,
        with a new start line, unless the deaths reach ``executor.max_config_attempts``: then it
        is no longer in flight (a stop's abandon line must not cancel that death)."""
        self.deaths[it.id] += 1
        self.starts[it.id] += 1
        alone = {"alone": True}
        if self.window > 1:
            write(self.writer, {"start": it.id, "attempt": self.attempt, **alone})
        if self.deaths[it.id] >= self.max_attempts:
            if it.id in in_flight.in_flight():
                in_flight.in_flight().remove(it.id)
            return False
        write(self.writer, {"start": it.id, "attempt": self.attempt, **(alone if self.window == 1 else {})})
        return True

    def record(self, it: WorkItem, rec: dict[str, Any], *, sync: bool = True) -> None:
        write(self.writer, {"id": it.id, "attempt": self.attempt, "record": rec}, sync=sync)
        if self.recorded is None:
            self.recorded = {}
        self.recorded[it.id] = "error" in rec
        self.done += 1
        self.errors += "error" in rec
        self.screened += bool(rec.get("screened"))
        log.info("unit %s: %d/%d %s", self.unit_id, self.done, self.todo, "error" if "error" in rec else "ok")


def run_unit(
    sweep_dir: str,
    unit_key: str,
    *,
    stop_check: Callable[[], bool] | None = None,
    prior_starts: dict[str, Any] | None = None,
    stop_on: tuple[int, ...] = in_flight.STOP_SIGNALS,
) -> dict[str, Any]:
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


def _existing(sd: SweepDir, unit_id: str, spec: SweepSpec) -> PartialContent:
    """What the unit's partial records. A partial that is not this sweep's unit's (copied from
    another sweep, another unit, another environment, or not a worker's at all) is moved to
    quarantine first, as the merger would: nothing in it counts, and nothing is appended to it."""
    path = sd.partial_path(unit_id)
    existing = read_partial(path)
    why = existing.foreign or check_headers(existing.headers, unit_id, spec.fingerprint(), sd.recorded_env())
    if why is not None and quarantine(sd.root, path, why) is not None:
        existing = read_partial(path)
    return existing


def _run_unit(
    sweep_dir: str, unit_key: str, stop_check: Callable[[], bool] | None, prior_starts: dict[str, Any] | None
) -> dict[str, Any]:
    sd = SweepDir.open(sweep_dir)
    unit_id = sd.resolve_unit(unit_key)
    # one worker per unit, ever: refused here, before anything is written, when a live one holds it
    with unit_lease(sd.root, unit_id, gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), job=slurm_task()):
        return _run_leased(sd, unit_id, stop_check, prior_starts)


def _run_leased(
    sd: SweepDir, unit_id: str, stop_check: Callable[[], bool] | None, prior_starts: dict[str, Any] | None
) -> dict[str, Any]:
    """``run_unit`` once the unit's lease is held."""
    items = sd.unit_items(unit_id)
    spec = sd.spec
    replayer = replay.Replayer(spec) if spec.kernel.impl == "replay" else None
    device = device_block() if replayer is None else replay.device_block(replayer.source)
    if replayer is None:
        check_backend(
            spec.kernel.interpret, device["backend"], os.environ.get("CUDA_VISIBLE_DEVICES"), sd.root / "sweep.json"
        )
    sd.check_env(env_fingerprint(device))

    path = sd.partial_path(unit_id)
    existing = _existing(sd, unit_id, spec)
    for iid, counts in (prior_starts or {}).items():
        starts, deaths, hangs = (counts, counts, 0) if isinstance(counts, int) else counts
        existing.starts[iid] += starts
        existing.deaths[iid] += deaths
        existing.hangs[iid] += hangs
    todo = [it for it in items if it.id not in existing.records]
    started = time.perf_counter()
    with PartialWriter(path) as w:
        run = _Attempt(
            unit_id,
            existing.attempts + 1,
            w,
            len(todo),
            existing.starts,
            existing.deaths,
            existing.hangs,
            stop_check,
            round=unit_round(sd, unit_id),
        )
        if replayer is None:
            run.flush, run.timer = measure.l2_flush(spec, device["backend"]), spec.timer_on(device["backend"])
        in_flight.begin(w, run.attempt)
        write(w, {"header": _header(spec, run, device)})
        log.info(
            "unit %s attempt %d (round %d): %d of %d items to do",
            unit_id,
            run.attempt,
            run.round,
            len(todo),
            len(items),
        )
        runnable = _record_uncompiled(run, todo, spec)
        if replayer is not None:
            stopped, workers = replay.replay_items(run, runnable, spec, replayer), 0
        else:
            stopped, workers = _compile_and_time_all(sd, run, runnable, spec)
        in_flight.end()
    summary = _summary(
        run,
        total=len(items),
        stopped=stopped,
        wall_s=time.perf_counter() - started,
        workers=workers,
        virtual=replayer is not None,
    )
    summary.update(gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), job=slurm_task())
    if not stopped:
        recorded = {iid: "error" in rec for iid, (_, rec) in existing.records.items()} | (run.recorded or {})
        st = os.stat(path)  # what the marker vouches for: status trusts it only while the partial is unchanged
        partial = {
            "stat": [st.st_ino, st.st_size, st.st_mtime_ns],
            "records": len(recorded),
            "errors": sum(recorded.values()),
        }
        atomic_write_json(sd.marker_path(unit_id), {**summary, "partial": partial, "finished": now_iso()})
    return summary


def _compile_and_time_all(sd: SweepDir, run: _Attempt, runnable: list[WorkItem], spec: SweepSpec) -> tuple[bool, int]:
    """(stopped early, compile workers): compile on the pool, through the persistent cache."""
    mode, workers = spec.compile.mode, compile_pool.pool_size(spec.compile.workers)
    run.compile_mode = mode
    cache_dir = compile_cache.resolve_cache_dir(spec.compile.cache_dir, sd.root)
    log.info("unit %s: %d compile %s, cache %s, timer %s", run.unit_id, workers, mode, cache_dir or "off", run.timer)
    run.max_attempts = spec.executor.max_config_attempts
    with compile_cache.persistent_cache(cache_dir), compile_procs.open_pool(mode, workers, spec, cache_dir) as pool:
        stopped = _compile_and_time(run, runnable, spec, pool)
        run.compile_deaths = pool.deaths
    return stopped, workers


def _header(spec: SweepSpec, run: _Attempt, device: dict[str, Any]) -> dict[str, Any]:
    """The first line of each attempt: which sweep, unit and environment its records belong to,
    where it ran (host, pid, SLURM job), so a record can be traced to its worker, and how it
    measured (round, timer, L2 flush, real or virtual clock)."""
    virtual = spec.kernel.impl == "replay"
    if virtual:
        timer = replay.TIMER
    else:
        from kernels.timing import TIMERS  # jax: not imported by a replay

        timer = TIMERS[run.timer]
    return {
        "schema": SCHEMA_VERSION,
        "unit": run.unit_id,
        "sweep": spec.fingerprint(),
        "attempt": run.attempt,
        "device": device,
        "env": env_fingerprint(device),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": slurm_task(),
        "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "started": now_iso(),
        "measure": {
            "impl": spec.kernel.impl,
            "strategy": spec.timing.strategy,
            "round": run.round,
            "timer": timer,
            "flush_l2": run.flush is not None,
            "clock": "virtual" if virtual else "real",
        },
    }


def _record_uncompiled(run: _Attempt, todo: list[WorkItem], spec: SweepSpec) -> list[WorkItem]:
    """Record at once what needs no compile (pruned, invalid, and configs given up on after
    ``executor.max_config_attempts`` deaths); return the items left to compile and time."""
    runnable = []
    for it in todo:
        if it.kind != RUN:
            run.record(it, measure.skipped_record(it))
        elif run.deaths[it.id] >= spec.executor.max_config_attempts:
            run.record(it, measure.crashed_record(it, run.deaths[it.id], run.hangs[it.id]))
        else:
            runnable.append(it)
    return runnable


def _compile_and_time(run: _Attempt, runnable: list[WorkItem], spec: SweepSpec, pool: compile_pool.Pool) -> bool:
    """Compile a window of configs on the pool, then check and time them one after another;
    return whether the attempt stopped early (``stop_check``)."""
    for window in _windows(runnable, compile_pool.window_size(pool.workers), suspects=run.starts):
        if run.should_stop():
            return True
        alone = {"alone": True} if len(window) == 1 else {}
        for it in window:
            write(run.writer, {"start": it.id, "attempt": run.attempt, **alone}, started=it.id)
        t0, run.window = time.perf_counter(), len(window)
        pool.submit(window)
        compiled = pool.collect(window, should_stop=run.should_stop, on_death=run.on_death)
        run.compile_wall_s += time.perf_counter() - t0
        if _time_window(run, window, compiled, spec):
            return True
    return False


def _time_window(run: _Attempt, window: list[WorkItem], compiled: list[Any], spec: SweepSpec) -> bool:
    """Check and time a compiled window in plan order; return whether it stopped early
    (the configs not timed yet are abandoned, not counted as deaths)."""
    for k, (it, comp) in enumerate(zip(window, compiled, strict=True)):
        if run.should_stop() or comp is None:  # None: the pool stopped before compiling it
            abandon_in_flight()
            return True
        if comp.died:  # its compile processes died on it executor.max_config_attempts times
            rec, timed_s = measure.crashed_record(it, run.deaths[it.id], run.hangs[it.id]), 0.0
        else:
            rec, timed_s = _finish(run, it, comp, spec)
        run.timed_s += timed_s
        compiled[k] = None  # drop the executable once timed
        if it.id in in_flight.in_flight():  # a stop signal may have abandoned it meanwhile
            in_flight.in_flight().remove(it.id)
        if comp.error is None and not comp.died:
            run.compiled += 1
            run.compile_cached += comp.cached
            run.compile_sum_s += comp.compile_s
        run.record(it, rec)
    return False


def _finish(run: _Attempt, it: WorkItem, comp: measure.Compiled, spec: SweepSpec) -> tuple[dict[str, Any], float]:
    """Load ``it``'s executable (from its compile process) and check and time it: its record."""
    if run.ctx is None or run.ctx.shape != it.shape:
        run.ctx = None  # free the previous shape's arrays first
        run.ctx = measure.ShapeContext.make(it, spec)
    t0 = time.perf_counter()
    comp = compile_procs.load(comp, it, spec)
    run.load_sum_s += time.perf_counter() - t0
    try:
        return measure.finish_item(
            it, comp, run.ctx, spec, measurement(it.config, spec, run.round), flush=run.flush, timer=run.timer
        )
    except WorkerEnvironmentError:
        abandon_in_flight()  # the environment's fault, not the configs': no death counted
        raise


def _summary(
    run: _Attempt, *, total: int, stopped: bool, wall_s: float, workers: int, virtual: bool = False
) -> dict[str, Any]:
    """What ``run_unit`` returns and, when the unit finished, its completion marker holds.
    ``compile_sum_s`` and ``timed_s`` are seconds of a virtual clock for a replay
    (``clock: virtual``); ``wall_s`` is always this process's real time."""
    return {
        "unit": run.unit_id,
        "attempt": run.attempt,
        "round": run.round,
        "done": run.done,
        "errors": run.errors,
        "screened": run.screened,
        "total": total,
        "already": total - run.todo,
        "stopped": stopped,
        "wall_s": round(wall_s, 3),
        "clock": "virtual" if virtual else "real",
        "compile_workers": workers,
        "compiled": run.compiled,
        "compile_cached": run.compile_cached,
        "compile_sum_s": round(run.compile_sum_s, 3),
        "compile_wall_s": round(run.compile_wall_s, 3),
        "timed_s": round(run.timed_s, 4),
        "compile_mode": run.compile_mode,
        "compile_deaths": run.compile_deaths,
        "load_sum_s": round(run.load_sum_s, 3),
        "timer": None if virtual else run.timer,
    }


def _windows(items: list[WorkItem], size: int, suspects: Any) -> Iterator[list[WorkItem]]:
    """Plan-ordered windows of at most ``size`` items; an item a previous attempt started
    without finishing (a suspect) gets a window of its own."""
    window: list[WorkItem] = []
    for it in items:
        if suspects[it.id] > 0:
            if window:
                yield window
                window = []
            yield [it]
            continue
        window.append(it)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window


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
    except KeyboardInterrupt:
        print(
            "tilesweep worker: interrupted; finished records are kept, the configs in flight were given up "
            "(not counted against them); run it again to continue",
            file=sys.stderr,
        )
        return 130
    print(
        f"unit {summary['unit']}: {summary['done']} records written ({summary['errors']} errors), "
        f"{summary['already']} already done, {summary['wall_s']:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
