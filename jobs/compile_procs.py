"""Compile processes, the worker's side (``compile.mode: processes``; ``jobs.compile_pool``
says why they exist and why the executable comes back serialized).

Each child (``jobs.compile_child``) lowers and compiles one config at a time and sends back
its executable. This side hands configs to idle children in the order they were submitted,
collects results, and when a child dies, starts another and tells the worker which config
was in flight in it (``on_death``): a compile process that dies loses at most that config,
which is compiled again until ``executor.max_config_attempts`` deaths give it up. A death is
attributed exactly: a child compiles one config at a time.

Signals and lifetime: SLURM signals every process of a step (scancel's TERM, the time-limit
warning USR2) and a terminal's Ctrl-C reaches the whole process group; what that means for
the unit (finish the config being timed, abandon the rest, requeue) is the worker's call, so
children ignore INT, TERM and USR2. They end when the pool closes (EOF on their task pipe;
SIGKILL for a child still compiling or starting), and with the worker should it die first
(``PR_SET_PDEATHSIG`` to the thread that started them, and EOF on the task pipe): no orphans.

Memory: a child allocates no arrays. Its XLA GPU allocator is not preallocated
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``) and capped (``XLA_PYTHON_CLIENT_MEM_FRACTION``, all
children together ``CHILDREN_MEM_SHARE`` of the GPU), so a child holds its CUDA context and
compile scratch only; the worker keeps the GPU memory for inputs, references and timing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from orchestrator.errors import WorkerEnvironmentError
from orchestrator.planning import WorkItem
from orchestrator.pyproc import module_command, module_env
from orchestrator.spec.model import SweepSpec

from . import measure
from .compile_pool import OnDeath, Pool, StopCheck, ThreadPool
from .measure import Compiled

log = logging.getLogger(__name__)

CHILDREN_MEM_SHARE = 0.10  # of the GPU's memory, for all compile processes together
START_FAILURES = 3  # children in a row that die before they are ready: a broken environment
POLL_S = 0.2  # how often a waiting worker checks whether it should stop
CLOSE_WAIT_S = 5.0  # an idle child's time to exit after EOF before it is killed


def child_env(environ: Mapping[str, str], workers: int, job: str = "compile") -> dict[str, str]:
    """A compile process's environment: the worker's, with GPU memory bounded and the
    project importable wherever the worker was started from; a lower-only one (``jobs.lowering``)
    keeps jax on the CPU."""
    env = dict(environ)
    if job == "lower":
        env["JAX_PLATFORMS"] = "cpu"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{CHILDREN_MEM_SHARE / max(1, workers):.4f}"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else root
    return env


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    tx: Connection  # configs to it
    rx: Connection  # results from it
    ready: bool = False
    item: WorkItem | None = None  # the config in flight in it


class ProcessPool:
    """``workers`` compile processes fed from one queue (see the module docstring)."""

    mode = "processes"

    def __init__(self, workers: int, spec: SweepSpec, cache_dir: Path | None, job: str = "compile") -> None:
        self.workers = workers
        self.job = job  # "compile", or "lower": lower only (``jobs.lowering``)
        self.deaths = 0  # children that died with a config in flight
        self._spec = spec
        self._cache_dir = cache_dir
        self._queue: deque[WorkItem] = deque()
        self._known: set[str] = set()
        self._done: dict[str, Compiled] = {}
        self._start_failures = 0
        self._children: list[_Child] = []
        self._children = [self._start() for _ in range(workers)]

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [c.proc.pid for c in self._children]

    def submit(self, items: Sequence[WorkItem]) -> None:
        """Queue configs; idle children take them in this order."""
        for it in items:
            if it.id not in self._known:
                self._known.add(it.id)
                self._queue.append(it)
        self._dispatch()

    def collect(
        self, items: Sequence[WorkItem], should_stop: StopCheck | None = None, on_death: OnDeath | None = None
    ) -> list[Compiled | None]:
        """Wait for these configs' results, in their order. Returns early, with None for the
        configs not compiled yet, once ``should_stop()`` says so (checked every ``POLL_S``)."""
        self.submit(items)
        wanted = [it.id for it in items]
        while any(iid not in self._done for iid in wanted):
            if should_stop is not None and should_stop():
                break
            self._dispatch()
            self._poll(on_death)
        for iid in wanted:
            self._known.discard(iid)
        return [self._done.pop(iid, None) for iid in wanted]

    def close(self) -> None:
        """End every child: an idle one at EOF, one still compiling or starting at once."""
        for child in self._children:
            _quietly(child.tx.close)
            if child.item is not None or not child.ready:
                _quietly(child.proc.kill)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for child in self._children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
            _quietly(child.rx.close)
        self._children = []

    # -- children
    def _start(self) -> _Child:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            proc = subprocess.Popen(
                module_command("jobs.compile_child", str(task_r), str(result_w), str(os.getpid())),
                pass_fds=(task_r, result_w),
                env=module_env(child_env(os.environ, self.workers, self.job)),
                stdin=subprocess.DEVNULL,
            )
        except OSError:
            for fd in (task_w, result_r):
                os.close(fd)
            raise
        finally:
            os.close(task_r)
            os.close(result_w)
        child = _Child(proc, Connection(task_w, readable=False), Connection(result_r, writable=False))
        setup = {
            "spec": self._spec,
            "cache_dir": self._cache_dir,
            "log_level": logging.getLogger().getEffectiveLevel(),
            "job": self.job,
        }
        _quietly(child.tx.send, setup)  # a child that died already shows as EOF on rx
        log.debug("compile process %d started", proc.pid)
        return child

    def _dispatch(self) -> None:
        for child in self._children:
            if not (child.ready and child.item is None and self._queue):
                continue
            item = self._queue.popleft()
            try:
                child.tx.send(item)
            except OSError:  # it died; its EOF comes next
                self._queue.appendleft(item)
                continue
            child.item = item
            log.info("compile process %d compiles item %s", child.proc.pid, item.id)

    def _poll(self, on_death: OnDeath | None) -> None:
        by_conn = {c.rx: c for c in self._children}
        for conn in wait(list(by_conn), timeout=POLL_S):
            child = by_conn[conn]  # type: ignore[index]  # wait() returns what it was given
            try:
                msg: Any = child.rx.recv()
            except (EOFError, OSError):
                self._replace(child, on_death)
                continue
            if msg[0] == "ready":
                child.ready = True
                self._start_failures = 0
            elif msg[0] == "done":
                child.item = None
                self._done[msg[1]] = msg[2]

    def _replace(self, child: _Child, on_death: OnDeath | None) -> None:
        """A child closed its result pipe: it died. Account for its config, start another."""
        try:
            child.proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
        for conn in (child.tx, child.rx):
            _quietly(conn.close)
        how = describe_exit(child.proc.returncode)
        item = child.item
        child.item = None
        if item is None:
            self._start_failures += not child.ready
            if self._start_failures >= START_FAILURES:
                raise WorkerEnvironmentError(
                    f"{START_FAILURES} compile processes in a row died before they were ready (last: {how}); "
                    "their errors are in this task's log; set compile.mode: threads to compile in the worker"
                )
            log.warning("compile process %d ended while idle (%s); starting another", child.proc.pid, how)
        else:
            self.deaths += 1
            again = on_death(item) if on_death is not None else True
            log.warning(
                "compile process %d died (%s) while compiling item %s; %s",
                child.proc.pid,
                how,
                item.id,
                "compiling it again" if again else "giving the config up",
            )
            if again:
                self._queue.appendleft(item)
            else:
                self._done[item.id] = Compiled(died=True)
        self._children[self._children.index(child)] = self._start()


@contextlib.contextmanager
def open_pool(mode: str, workers: int, spec: SweepSpec, cache_dir: Path | None) -> Iterator[Pool]:
    """A unit's compile pool for ``compile.mode``; its threads or processes end with the block."""
    if mode == "processes":
        with ProcessPool(workers, spec, cache_dir) as procs:
            yield procs
        return
    threads = ThreadPool(workers, spec)
    try:
        yield threads
    finally:
        threads.close()


def load(comp: Compiled, item: WorkItem, spec: SweepSpec) -> Compiled:
    """A compile process's result with its executable loaded into this process. One that
    came back without one it could hand over, or that cannot be loaded here, is compiled
    here instead (through the persistent cache its compile process filled)."""
    if comp.executable is not None or comp.error is not None or comp.died:
        return comp
    if comp.blob is not None:
        from jax.experimental import serialize_executable

        try:
            return replace(comp, executable=serialize_executable.deserialize_and_load(*comp.blob), blob=None)
        except Exception as exc:  # an environment problem, not the config's: compile it here
            log.warning(
                "item %s: cannot load its compile process's executable (%s); compiling it here",
                item.id,
                measure.error_string(exc),
            )
    here = measure.compile_item(item, spec)
    return replace(here, compile_s=comp.compile_s, cached=comp.cached) if here.error is None else here


def _quietly(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except OSError:
        pass
