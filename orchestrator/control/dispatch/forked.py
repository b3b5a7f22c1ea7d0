"""A GPU's worker as a fork of its task's process, sharing the imports the task made once.

Most of a worker's start is imports (jax, the kernels, the orchestrator: seconds of CPU), and
every worker of a task pays them at once on the task's CPUs while its GPUs wait. So the task
imports them once (``preload``: what its sweep's workers need, ``preload_modules``), without
starting any jax backend, and forks a worker per GPU: each worker still sees only its own GPU,
because jax reads ``CUDA_VISIBLE_DEVICES`` when its backend starts, which happens in the
worker, after the fork. A worker runs its GPU's units one after another (``unit_worker.serve``):
the task hands it the next unit over a pipe when it says the last one ended, so jax's backend,
the compiled kernels and the shape's inputs stay warm from one unit to the next.

In the child, before the worker's code runs: the parent's signal handlers are reset, USR2, TERM
and USR1 stay blocked (the parent blocks them around the fork) until the worker's own handlers
exist (``unit_worker.serve`` installs them, then unblocks), its output goes to its unit's log,
it runs on its CPU share and its GPU, it closes the task's ends of the other workers' pipes, and
it is sent TERM if the task's process dies (no orphan keeps a GPU). The child never returns
into the task's code: it leaves through ``os._exit`` with the worker's exit code
(``unit_worker``), so the task reads how it ended as it would a process's.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from kernels import impls
from orchestrator.control.dispatch.unit_worker import SIGNALS
from orchestrator.pyproc import PipeLines
from orchestrator.spec.sections import REPLAY
from orchestrator.store.files import append_fd

if TYPE_CHECKING:
    from orchestrator.spec.model import SweepSpec

log = logging.getLogger(__name__)

# What every worker imports before it measures, whatever its sweep: loaded once by the task.
WORKER = "jobs.worker"
_PR_SET_PDEATHSIG = 1
_RESET = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGALRM, signal.SIGHUP)


def preload_modules(spec: SweepSpec | None) -> tuple[str, ...]:
    """What the workers of a sweep with ``spec`` import before their first config: a replay's
    worker no jax; a compile-and-time worker jax, the timer, the reference, the spec's kernel
    implementation (not the others) and, with ``kernel.interpret: true``, what jax's Pallas
    interpreter loads (``kernels.impls.worker_modules``). ``spec`` None (the task could not read
    it; its workers say why): those of the default implementation."""
    if spec is not None and spec.kernel.impl == REPLAY:
        return (WORKER,)
    if spec is None:
        return (*impls.worker_modules(impls.DEFAULT_IMPL, interpret=False), WORKER)
    return (*impls.worker_modules(spec.measured_impl, interpret=spec.kernel.interpret is True), WORKER)


def preload(spec: SweepSpec | None) -> float:
    """Import what the workers need (``preload_modules``), once, in the task's process, without
    starting any jax backend, then freeze what the task holds (``gc.freeze``): those objects
    live as long as the task, and no collection walks them again, neither a forked worker's
    (whose pages stay shared with the task's) nor the task's own at its exit, which with jax
    imported takes about half a second of the GPUs' time. Where an import fails the workers
    import it themselves, and the one that fails says so in its unit's log; the interpreter's
    modules are jax's own, skipped where a jax release has moved them. The collector is off while
    they load: an import makes objects that live as long as the task, which each collection
    would walk again for nothing (about a tenth of the imports' CPU time, while the GPUs wait).
    Returns the seconds spent on the interpreter's modules, which a run on GPUs never loads."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _import_all(preload_modules(spec))
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _import_all(names: tuple[str, ...]) -> float:
    """Import ``names`` in turn, up to the first that fails; the seconds the interpreter's took."""
    interpreter = 0.0
    for name in names:
        t0 = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:  # the worker meets it again and records why
            if isinstance(exc, ImportError) and name in impls.INTERPRET_MODULES:
                log.debug("preloading %s failed (%s); each worker imports what it needs", name, exc)
                continue
            log.warning("preloading %s failed (%s: %s); each worker imports it itself", name, type(exc).__name__, exc)
            break
        finally:
            if name in impls.INTERPRET_MODULES:
                interpreter += time.perf_counter() - t0
    return interpreter


# the task's ends of its workers' pipes: a worker forked later closes them (``_child``), so a
# worker's pipe has no end but the task's and its own
_TASK_ENDS: set[int] = set()


class ForkedWorker:
    """A forked worker, read as ``subprocess.Popen`` reads a process: ``poll``, ``wait`` and
    ``returncode`` (negative: the signal that ended it); and its pipe: ``send`` a message (one
    JSON line), ``messages`` read what it said, without waiting."""

    def __init__(self, pid: int, send_fd: int, recv_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.send_fd, self.recv_fd = send_fd, recv_fd
        self._lines = PipeLines(recv_fd)

    def send(self, message: dict[str, Any]) -> bool:
        """Write ``message``; False where the worker is gone (its end of the pipe closed)."""
        data = json.dumps(message).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self.send_fd, data) :]
        except (BrokenPipeError, OSError):
            return False
        return True

    def messages(self) -> list[dict[str, Any]]:
        """The whole lines the worker has written since the last call."""
        return [json.loads(line) for line in self._lines.ready()]

    def close(self) -> None:
        """Close the task's ends of the pipe (once the worker has ended)."""
        for fd in (self.send_fd, self.recv_fd):
            _TASK_ENDS.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def start_worker(
    log_path: Path,
    gpu: str | None,
    cpus: list[int],
    sweep_dir: str,
    unit: str,
    prior: dict[str, Any],
    compile_cpus: int | None = None,
) -> ForkedWorker:
    """Fork a worker for ``gpu`` that starts with ``unit`` (see the module docstring); its
    output goes to ``log_path``; its compile pool counts at most ``compile_cpus`` of its CPUs
    (``jobs.compile_pool.share``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    out = append_fd(log_path)
    to_child, from_child = os.pipe(), os.pipe()
    libc = _libc()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:
            for fd in (*_TASK_ENDS, to_child[1], from_child[0]):
                os.close(fd)
            pipe = (to_child[0], from_child[1])
            _child(out, gpu, cpus, libc, [sweep_dir, unit, json.dumps(prior)], compile_cpus, pipe)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(out)
    os.close(to_child[0])
    os.close(from_child[1])
    _TASK_ENDS.update((to_child[1], from_child[0]))
    return ForkedWorker(pid, send_fd=to_child[1], recv_fd=from_child[0])


def _child(
    out: int,
    gpu: str | None,
    cpus: list[int],
    libc: ctypes.CDLL | None,
    argv: list[str],
    compile_cpus: int | None,
    pipe: tuple[int, int],
) -> NoReturn:
    """The worker's side of the fork: set up as the module docstring says, run the GPU's units
    as the task hands them over, exit."""
    code = 1
    try:
        for signum in _RESET:
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if compile_cpus is not None:
            from jobs import compile_pool

            compile_pool.share(compile_cpus)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if gpu is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        from orchestrator.control.dispatch import unit_worker

        code = unit_worker.serve(argv, recv_fd=pipe[0], send_fd=pipe[1])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
