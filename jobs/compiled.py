"""The compile-and-time measurer: the real kernels, compiled, checked against the reference, timed.

Runnable configs are compiled a window at a time on a pool of threads or of compile processes
(``compile.mode``) at most as large as the worker's CPUs (``compile.workers``), then checked and
timed one after another with the pool idle (``jobs.compile_pool`` says why timing never overlaps a
compile, and why processes). Compiles go through jax's persistent cache (``compile.cache_dir``),
so a rerun loads them; inputs and reference outputs are made once per shape
(``measure.ShapeContext``) and kept for the next unit a process runs (a whole-node task's worker
runs its GPU's units one after another, often of the same shape).

A window's configs all get a ``start`` line before it compiles (``"alone": true`` when the
window holds one config). If the worker dies there, each of them is a suspect on the next
attempt and is then run alone; only a death while a config was alone in flight counts against
it, so a config that really kills its worker is the only one that reaches
``executor.max_config_attempts``, never one that shared a window with it. A compile process
that dies costs only its config in flight, which was alone in it: the worker lives on, writes
that death (an ``alone`` start line, unless its start line was one), and compiles it again
with a new start line until the deaths reach ``executor.max_config_attempts``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from orchestrator import counted
from orchestrator.errors import WorkerEnvironmentError
from orchestrator.planning import WorkItem
from orchestrator.planning.halving import measurement
from orchestrator.spec.model import SweepSpec
from orchestrator.store.lines import DeviceBlock, start_line

from . import compile_cache, compile_pool, compile_procs, in_flight, measure
from .attempt import Attempt
from .measurer import Method
from .node_env import check_backend, device_block

log = logging.getLogger(__name__)
# a worker's compile pool as its log names it, by compile.mode: one, then more than one
_WORKERS = {"threads": ("compile thread",), "processes": ("compile process", "compile processes")}

# the inputs and reference outputs of the shape this process timed last, by (sweep, shape, seed)
_last_shape: dict[tuple[Any, ...], measure.ShapeContext] = {}


class CompiledMeasurer:
    """Compile on the pool, through the persistent cache; check and time each config in plan
    order (the module docstring says how)."""

    def __init__(self, spec: SweepSpec, sweep_root: Path) -> None:
        from kernels.timing import TIMERS  # jax: the replay measurer never imports it

        device = device_block()
        backend = device["backend"] or ""  # jax names it (node_env.device_block)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        check_backend(spec.kernel.interpret, backend, visible, sweep_root / "sweep.json", spec.measured_impl)
        self._device = device
        self._spec = spec
        self._root = str(sweep_root)
        self._cache_dir = compile_cache.resolve_cache_dir(spec.compile.cache_dir, sweep_root)
        self._flush = measure.l2_flush(spec, backend)
        timer = spec.timer_on(backend)
        self._method = Method(
            clock="real",
            records_timer=TIMERS[timer],
            timer=timer,
            flush_l2=self._flush is not None,
            compile_mode=spec.compile.mode,
            compile_workers=compile_pool.pool_size(
                spec.compile.workers,
                interpreted_threads=spec.compile.mode == "threads"
                and (spec.kernel.interpret is True or backend != "gpu"),
            ),
        )
        self._ctx: measure.ShapeContext | None = None  # the inputs of the shape being timed

    @property
    def device(self) -> DeviceBlock:
        return self._device

    @property
    def method(self) -> Method:
        return self._method

    def run(self, attempt: Attempt, runnable: Sequence[WorkItem]) -> bool:
        mode = self._spec.compile.mode
        workers = self._method.compile_workers
        cache_dir = self._cache_dir
        log.info(
            "unit %s: %s, cache %s, timer %s",
            attempt.unit_id,
            counted(workers, *_WORKERS[mode]),
            cache_dir or "off",
            self._method.timer,
        )
        with (
            compile_cache.persistent_cache(cache_dir),
            compile_procs.open_pool(mode, workers, self._spec, cache_dir) as pool,
        ):
            stopped = self._compile_and_time(attempt, runnable, pool)
            attempt.counts.compile_deaths = pool.deaths
        return stopped

    def _compile_and_time(self, attempt: Attempt, runnable: Sequence[WorkItem], pool: compile_pool.Pool) -> bool:
        """Compile a window of configs on the pool, then check and time them one after another;
        return whether the attempt stopped early."""
        for window in windows(runnable, compile_pool.window_size(pool.workers), suspects=attempt.starts):
            if attempt.should_stop():
                return True
            if self._time_window(attempt, window, self._compile(attempt, window, pool)):
                return True
        return False

    def _compile(
        self, attempt: Attempt, window: list[WorkItem], pool: compile_pool.Pool
    ) -> list[measure.Compiled | None]:
        """The window's start lines, then its compiles (None for any the pool did not reach)."""
        attempt.start(window)

        def died(it: WorkItem) -> bool:
            return self._died(attempt, it, alone=len(window) == 1)

        t0 = time.perf_counter()
        pool.submit(window)
        compiled = pool.collect(window, should_stop=attempt.should_stop, on_death=died)
        attempt.counts.compile_wall_s += time.perf_counter() - t0
        return compiled

    def _died(self, attempt: Attempt, it: WorkItem, *, alone: bool) -> bool:
        """A compile process died with ``it`` in it, alone there: a death against it, in the
        partial as an alone start line (its own start line is one in a window of one). Compile it
        again, with a new start line, unless the deaths reach ``executor.max_config_attempts``:
        then it is not in flight any more (a stop's abandon line must not cancel that death)."""
        attempt.deaths[it.id] += 1
        attempt.starts[it.id] += 1
        if not alone:
            attempt.write(start_line(it.id, attempt.number, alone=True))
        if attempt.deaths[it.id] >= self._spec.executor.max_config_attempts:
            in_flight.settled(it.id)
            return False
        attempt.write(start_line(it.id, attempt.number, alone=alone))
        return True

    def _time_window(self, attempt: Attempt, window: list[WorkItem], compiled: list[measure.Compiled | None]) -> bool:
        """Check and time a compiled window in plan order; return whether it stopped early
        (the configs not timed yet are abandoned, not counted as deaths)."""
        counts = attempt.counts
        for k, (it, comp) in enumerate(zip(window, compiled, strict=True)):
            if attempt.should_stop() or comp is None:  # None: the pool stopped before compiling it
                in_flight.abandon_in_flight()
                return True
            if comp.died:  # its compile processes died on it executor.max_config_attempts times
                rec = measure.crashed_record(it, attempt.deaths[it.id], attempt.hangs[it.id])
            else:
                rec, timed_s = self._finish(attempt, it, comp)
                counts.timed_s += timed_s
                if in_flight.abandoned(it.id):  # a stop (TERM) gave it up while it was timed: no record
                    return True
            compiled[k] = None  # drop the executable once timed
            in_flight.settled(it.id)
            if comp.error is None and not comp.died:
                counts.compiled += 1
                counts.compile_cached += comp.cached
                counts.compile_sum_s += comp.compile_s
            attempt.record(it, rec)
        return False

    def _finish(self, attempt: Attempt, it: WorkItem, comp: measure.Compiled) -> tuple[dict[str, Any], float]:
        """Load ``it``'s executable (from its compile process) and check and time it: its record
        and the seconds its timing took."""
        if self._ctx is None or self._ctx.shape != it.shape:
            self._ctx = None  # free the previous shape's arrays first
            self._ctx = _shape_context(self._root, it, self._spec)
        t0 = time.perf_counter()
        comp = compile_procs.load(comp, it, self._spec)
        attempt.counts.load_sum_s += time.perf_counter() - t0
        how = measurement(it.config, self._spec, attempt.round)
        try:
            return measure.finish_item(
                it, comp, self._ctx, self._spec, how, flush=self._flush, timer=self._method.timer
            )
        except WorkerEnvironmentError:
            in_flight.abandon_in_flight()  # the environment's fault, not the configs': no death counted
            raise


def _shape_context(sweep: str, it: WorkItem, spec: SweepSpec) -> measure.ShapeContext:
    """``it``'s shape's inputs and reference outputs: the last ones made in this process where
    they are its shape's in the same sweep (a unit before this one), else new ones (the previous
    ones freed first)."""
    key = (sweep, it.shape, spec.timing.seed)
    ctx = _last_shape.get(key)
    if ctx is None:
        _last_shape.clear()
        ctx = _last_shape[key] = measure.ShapeContext.make(it, spec)
    return ctx


def windows(items: Sequence[WorkItem], size: int, suspects: Counter[str]) -> Iterator[list[WorkItem]]:
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
