"""jax's persistent compilation cache for a unit, and telling which compiles came from it.

The cache (in ``compile.cache_dir``, default ``SWEEP_DIR/compile-cache``) keeps every
executable, so a resumed or repeated unit, or a reference another unit already compiled,
loads instead of compiling. Whether a config's compile came from it is read from jax's
monitoring events, which jax records in the thread that compiles, so concurrent compiles
(threads of one worker, or compile processes: each process counts its own) are told apart.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


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
