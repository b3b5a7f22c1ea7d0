"""Compiling ahead on all CPUs of the allocation: on threads, or in compile processes.

``compile.mode: threads`` (the default): the worker compiles a window of upcoming configs
on a thread pool. jax releases the GIL while XLA (and, on a GPU, Triton and ptxas)
compiles, so threads overlap that part without moving executables between processes
(measured on the 2-core dev machine: while a thread runs ``.compile()`` of an
interpret-mode kernel, a pure-Python thread is blocked for only 15-20% of the time). The
Pallas -> Triton lowering is Python and holds the GIL: two threads lower no faster than
one, which caps a thread pool on a 16-core node near 1 / (lowering share of a compile),
about 4-6x (``bench/compile_farm.py``).

``compile.mode: processes``: ``workers`` compile processes (``jobs.compile_procs``) each
lower and compile whole configs and hand the executable back serialized
(``jax.experimental.serialize_executable``); the worker process stays the one process
that touches the GPU's timing, loads each executable just before timing it and times
configs one after another. Why this and not processes that compile *and* time under a
per-GPU lock: every timing process would hold its own inputs and reference outputs (at
seq 8192 the fwd_bwd reference alone materialises a 2 GiB score matrix per process) and
its own CUDA context with memory, and a compile in one process would run beside a timing
in another. Why a serialized executable and not the persistent cache as the hand-over:
loading from the cache needs the lowering again in the timing process to compute the
cache key (the serial, GIL-holding part this mode exists to move away); loading the
serialized executable skips it (``bench/compile_farm.py`` prints both). The children
still write the persistent cache, so a resumed unit loads instead of compiling.

Why timing never overlaps a compile, in either mode: timing is wall clock around
back-to-back calls, and a compile running beside it takes CPU cores (and, with threads,
the GIL) from the thread that dispatches the calls (``bench/worker.py`` prints the effect
as ``timing_overlap_ratio``). So the worker alternates two phases: compile a window of
upcoming configs on every thread or process, then check and time them one after another
while the compilers are idle. On a GPU node with processes that is not enough: a whole-node
task runs one worker per GPU, and the other workers' compile processes load the CPUs while
this one times, which the wall clock sees (1.66x inflation measured on a CPU beside a
compile) and the device timer (the kernels' own time from jax's profiler trace) does not; so
``timing.timer: auto`` means the device timer there (``SweepSpec.timer_on``).

Pool size: ``compile.workers`` threads or processes, at most the CPUs this worker may run on
(its affinity: the SLURM allocation, or a whole-node task's share of it,
``orchestrator.control.dispatch.node``); more compilers than CPUs only time-slice. A task with
fewer CPUs than workers lets each of them run on all of its CPUs and counts one of them as a
worker's (``share``): each worker compiles with one compiler. Unset, it is
those CPUs, except for threads compiling interpret-mode kernels: there a compile is XLA's CPU
compiler, whose own threads share the CPUs with the other compiles and the Python lowering the
GIL serialises, and one thread at a time was cheaper and no slower (measured on the 2-core dev
machine, ``bench/peer_loop.py``'s fwd_bwd sweep: 17.0 CPU s and 17-24 s wall serially against
21.0 CPU s and 42 s wall with two threads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from orchestrator.cpus import usable_cpus
from orchestrator.planning import WorkItem
from orchestrator.spec.model import SweepSpec

from . import measure
from .measure import Compiled

WINDOW_PER_WORKER = 4  # configs compiled per worker before the compilers pause for timing

# Called when a compile process died with this config in flight; returns whether to
# compile it again (False: the config is given up on, its result says ``died``).
OnDeath = Callable[[WorkItem], bool]
StopCheck = Callable[[], bool]
Job = Callable[[WorkItem, SweepSpec], Compiled]


_shared: dict[str, int] = {}  # "cpus": this worker's part of the CPUs it shares with a task's other workers


def share(cpus: int) -> None:
    """Count at most ``cpus`` of this process's CPUs as its own: a whole-node task's worker
    that shares its CPUs with the task's other workers (set once, after the fork)."""
    _shared["cpus"] = max(1, cpus)


def pool_size(configured: int | None, *, interpreted_threads: bool = False) -> int:
    """The compile pool's size: ``configured`` (``compile.workers``) capped at, or by default,
    the CPUs this process may run on (its ``share`` of them, where it shares them); by default
    one where ``interpreted_threads`` (threads compiling interpret-mode kernels, module
    docstring: Pool size)."""
    cpus = max(1, len(usable_cpus()))
    cpus = min(cpus, _shared.get("cpus", cpus))
    if configured is None:
        return 1 if interpreted_threads else cpus
    return min(configured, cpus)


def window_size(workers: int) -> int:
    """Configs compiled per phase: one when compiling serially (the classic loop)."""
    return 1 if workers <= 1 else WINDOW_PER_WORKER * workers


class Pool(Protocol):
    """What the worker needs of a compile pool: start compiling configs, then collect the
    results of some of them in order (None for any not compiled because it stopped)."""

    mode: str
    workers: int
    deaths: int  # compile processes that died with a config in flight

    def submit(self, items: Sequence[WorkItem]) -> None: ...

    def collect(
        self, items: Sequence[WorkItem], should_stop: StopCheck | None = None, on_death: OnDeath | None = None
    ) -> list[Compiled | None]: ...


class ThreadPool:
    """Compiles on ``workers`` threads of this process (inline, in ``collect``, for one)."""

    mode = "threads"

    def __init__(self, workers: int, spec: SweepSpec, job: Job = measure.compile_item) -> None:
        self.workers = workers
        self.deaths = 0  # a thread does not die alone
        self._spec = spec
        self._job = job  # what a thread does with each config: compile it, or lower it only (jobs.lowering)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="compile") if workers > 1 else None
        self._futures: dict[str, Future[Compiled]] = {}

    def submit(self, items: Sequence[WorkItem]) -> None:
        if self._pool is None or len(items) <= 1:
            return  # compiled in collect, on the calling thread
        for it in items:
            self._futures[it.id] = self._pool.submit(self._job, it, self._spec)

    def collect(
        self, items: Sequence[WorkItem], should_stop: StopCheck | None = None, on_death: OnDeath | None = None
    ) -> list[Compiled | None]:
        """A thread cannot die alone and a compile on one cannot be interrupted: every item
        is compiled, ``should_stop`` and ``on_death`` are not needed."""
        out: list[Compiled | None] = []
        for it in items:
            fut = self._futures.pop(it.id, None)
            out.append(fut.result() if fut is not None else self._job(it, self._spec))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
