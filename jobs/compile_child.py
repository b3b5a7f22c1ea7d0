"""A compile process: ``python -m jobs.compile_child TASK_FD RESULT_FD PARENT_PID``.

Started by ``jobs.compile_procs.ProcessPool``, never by hand. It reads its setup (the spec,
the persistent cache directory, the log level) and then one work item at a time from the
task pipe, lowers and compiles it exactly as a compile thread does
(``jobs.measure.compile_item``: same errors, same ``compile_s``, same cache hits), and
writes back the result with the executable serialized (``jax.experimental
.serialize_executable``). It says ``ready`` once its jax backend is up, so that a broken
environment fails before it is given a config rather than being blamed on one.

Signals: INT, TERM and USR2 are the worker's to act on (``jobs.compile_procs`` says why), so
they are caught here and ignored; handlers, not SIG_IGN, so that the tools a compile runs
(ptxas) start with default dispositions. The process ends at EOF on its task pipe, or by
SIGKILL (from the pool, or ``PR_SET_PDEATHSIG`` when the worker dies first).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux); elsewhere the EOF
    on the task pipe ends it after the config in flight."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(0)


def _ignore(signum: int, frame: Any) -> None:
    log.debug("compile process %d: ignoring %s (the worker decides)", os.getpid(), signal.Signals(signum).name)


def _compile(item: Any, spec: Any) -> Any:
    """``compile_item``, with the executable swapped for its serialized form."""
    import jax
    from jax.experimental import serialize_executable

    from .measure import Compiled, compile_item, error_string

    comp = compile_item(item, spec)
    if comp.executable is None:
        return comp
    if comp.cached and jax.default_backend() == "cpu":
        # XLA:CPU's executable loaded from the persistent cache does not survive serializing
        # again (its run fails "Function ... not found"): the worker loads it from the cache
        log.debug("item %s: loaded from the persistent cache; the worker loads it from there too", item.id)
        return Compiled(compile_s=comp.compile_s, cached=comp.cached)
    try:
        blob = serialize_executable.serialize(comp.executable)
    except Exception as exc:  # the worker compiles it itself (the cache has it now)
        log.warning("item %s: cannot serialize the executable (%s); the worker compiles it", item.id, error_string(exc))
        blob = None
    return Compiled(compile_s=comp.compile_s, cached=comp.cached, blob=blob)


def main(argv: list[str]) -> int:
    task_fd, result_fd, parent = (int(a) for a in argv)
    _die_with_parent(parent)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(sig, _ignore)
    tasks, results = Connection(task_fd, writable=False), Connection(result_fd, readable=False)
    try:
        setup = tasks.recv()
    except EOFError:
        return 0
    log_format = "%(asctime)s compile-process %(process)d %(name)s: %(message)s"
    logging.basicConfig(level=setup["log_level"], format=log_format)
    import jax

    import kernels.attention  # noqa: F401  (the Pallas modules: ready means ready to compile)

    from .compile_cache import persistent_cache

    job = _compile
    if setup.get("job") == "lower":  # lower only: pre-flight lowering (jobs.lowering)
        from .lowering import lower_item

        job = lower_item
    with persistent_cache(setup["cache_dir"]):
        jax.devices()  # bring the backend up before saying ready
        results.send(("ready", os.getpid()))
        while True:
            try:
                item = tasks.recv()
            except EOFError:
                return 0
            results.send(("done", item.id, job(item, setup["spec"])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
