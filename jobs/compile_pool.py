"""Compiling ahead on all CPUs of the allocation, and not compiling again what was compiled.

Why threads: jax releases the GIL while XLA (and, on a GPU, Triton and ptxas) compiles,
which is most of a config's compile time; tracing and lowering are Python and hold it. A
thread pool therefore overlaps the compiles of several configs without pickling
executables between processes. Measured on the 2-core dev machine: while a thread runs
``.compile()`` of an interpret-mode kernel, a pure-Python thread is blocked for only
15-20% of the time.

Why timing never overlaps a compile: timing is wall clock around back-to-back calls, and a
compile running beside it takes CPU cores and the GIL from the thread that dispatches the
calls (``bench/worker.py`` prints the effect as ``timing_overlap_ratio``). So the worker
alternates two phases: compile a window of upcoming configs on every worker thread, then
check and time them one after another while the pool is idle.

The persistent compilation cache (jax's, in ``compile.cache_dir``, default
``SWEEP_DIR/compile-cache``) keeps every executable, so a resumed or repeated unit, or a
reference another unit already compiled, loads instead of compiling. Whether a config's
compile came from it is read from jax's monitoring events, which jax records in the
thread that compiles, so concurrent compiles are told apart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
WINDOW_PER_WORKER = 4  # configs compiled per worker thread before the pool pauses for timing


def pool_size(configured: int | None) -> int:
    """``compile.workers``, or the CPUs this process may run on (its SLURM allocation)."""
    if configured is not None:
        return configured
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def window_size(workers: int) -> int:
    """Configs compiled per phase: one when compiling serially (the classic loop)."""
    return 1 if workers <= 1 else WINDOW_PER_WORKER * workers


class CompilePool:
    """Runs a function over a window of items on ``workers`` threads (inline for one)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="compile") if workers > 1 else None

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self._pool is None or len(items) <= 1:
            return [fn(it) for it in items]
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- cache


def resolve_cache_dir(configured: str | None, sweep_dir: Path) -> Path | None:
    """``compile.cache_dir``: None means SWEEP_DIR/compile-cache, "off" disables, a relative
    path is taken relative to the sweep directory."""
    if configured == "off":
        return None
    if configured is None:
        return sweep_dir / "compile-cache"
    path = Path(configured).expanduser()
    return path if path.is_absolute() else sweep_dir / path


_CACHE_OPTIONS = {
    # Cache every compile, however fast or small: interpret-mode and Triton kernels
    # compile in well under jax's default 1 s threshold.
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
}


@contextlib.contextmanager
def persistent_cache(path: Path | None) -> Iterator[None]:
    """Use jax's persistent compilation cache in ``path`` (None: no cache) for the block,
    then restore the process's previous settings."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    _install_listener()
    names = ["jax_compilation_cache_dir", *_CACHE_OPTIONS]
    before = {name: getattr(jax.config, name) for name in names}
    compilation_cache.reset_cache()  # jax opens its cache once per process; reopen here
    try:
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
            jax.config.update("jax_compilation_cache_dir", str(path))
            for name, value in _CACHE_OPTIONS.items():
                jax.config.update(name, value)
        else:
            jax.config.update("jax_compilation_cache_dir", None)
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


class _Hits:
    def __init__(self) -> None:
        self.hits = 0

    @property
    def cached(self) -> bool:
        return self.hits > 0


_local = threading.local()
_listener_lock = threading.Lock()
_listener_installed = False


def _on_event(event: str, **_: Any) -> None:
    if event == CACHE_HIT_EVENT:
        counter = getattr(_local, "counter", None)
        if counter is not None:
            counter.hits += 1


def _install_listener() -> None:
    global _listener_installed
    with _listener_lock:
        if not _listener_installed:
            import jax

            jax.monitoring.register_event_listener(_on_event)
            _listener_installed = True


@contextlib.contextmanager
def cache_hits() -> Iterator[_Hits]:
    """Count the persistent-cache hits of the compiles this thread runs inside the block."""
    _install_listener()
    counter = _Hits()
    previous = getattr(_local, "counter", None)
    _local.counter = counter
    try:
        yield counter
    finally:
        _local.counter = previous
