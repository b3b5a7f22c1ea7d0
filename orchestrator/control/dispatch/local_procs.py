"""The workers of a local run that waits for them: each unit's worker a child process of the
command (``local_worker``), with no controller process between them.

The run is what submitit's local controller was for such a worker: it starts the worker with
SIGINT blocked (``children_block_sigint``: the worker takes it over once its unit runs),
pinned to its GPU, its output in a log of its own in the sweep's log folder; it reads how the
worker ended, and writes the reason where a signal ended it without a word (``why``), as the
controller did; it stops a worker that outlives ``executor.timeout_min`` (TERM: the configs
in flight are abandoned, then KILL). A worker outlives a run that is killed and finishes its
unit, as under the controller; ``status`` follows it by its pid. A run that is stopped
(Ctrl-C, SIGTERM) stops its workers (``stop_workers``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.control.dispatch.nodelog import starting_line
from orchestrator.control.why import (
    INTERRUPTED,
    death_reason,
    failure_line,
    interrupted_line,
    last_word,
    oom_kills,
    read_failure,
)
from orchestrator.pyproc import module_command, module_env
from orchestrator.store.files import open_append
from orchestrator.store.markers import read_marker
from orchestrator.store.sweep_paths import log_folder
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)

WORKER = "orchestrator.control.dispatch.local_worker"
STOP_WAIT_S = 20.0  # how long a stopped worker has to write its abandon lines before it is killed


@dataclass
class Ended:
    """How a worker ended: ``ok``; else ``error`` (one line) and ``interrupted`` (a stop
    signal ended it, which is no failure of the unit)."""

    ok: bool
    summary: dict[str, Any] | None = None
    error: str | None = None
    interrupted: bool = False


@dataclass
class LocalWorker:
    """One unit's worker process: ``job_id`` its pid, ``log`` its output."""

    unit: str
    proc: subprocess.Popen[bytes]
    log: Path
    marker: Path
    limit_min: int  # executor.timeout_min
    oom_before: int | None
    started: float
    killed_at: float | None = None  # when it was told to stop for its time limit
    header: int = 0  # bytes of the line naming the unit, written into its log before it started

    @property
    def job_id(self) -> str:
        return str(self.proc.pid)

    def poll(self) -> int | None:
        return self.proc.poll()

    def enforce_limit(self) -> None:
        """Stop a worker past its time limit: TERM (it abandons its configs in flight), then
        KILL if it is still there ``STOP_WAIT_S`` later."""
        now = time.monotonic()
        if self.killed_at is None and now >= self.started + 60 * self.limit_min:
            self.killed_at = now
            log.warning("unit %s ran past executor.timeout_min (%d min): stopping it", self.unit, self.limit_min)
            _signal(self.proc, signal.SIGTERM)
        elif self.killed_at is not None and now >= self.killed_at + STOP_WAIT_S:
            _signal(self.proc, signal.SIGKILL)

    def ended(self) -> Ended:
        """How the worker ended, once it has; a death by signal without a word from the
        worker gets its reason written as the log's last line."""
        code = self.proc.wait()
        marker = read_marker(self.marker)
        if code == 0:
            return Ended(ok=True, summary=dict(marker or {}) or None)
        if marker is not None and self.killed_at is None:  # done, as status says: what came after is no failure
            log.warning("unit %s is done, but its worker then exited with code %s; see %s", self.unit, code, self.log)
            return Ended(ok=True, summary=dict(marker))
        if self.killed_at is not None:
            reason = f"ran past executor.timeout_min ({self.limit_min} min); its finished records are kept"
            self._say(failure_line(self.unit, reason))
            return Ended(ok=False, error=reason)
        said = last_word(self.log, self.unit)
        if said is not None and said[0] == INTERRUPTED:
            return Ended(ok=False, error=said[1], interrupted=True)
        if code < 0:
            reason = death_reason(-code, self.oom_before, where="local")
            self._say(failure_line(self.unit, reason))
            return Ended(ok=False, error=reason)
        return Ended(ok=False, error=read_failure(self.log, self.unit) or f"the worker exited with code {code}")

    def _say(self, line: str) -> None:
        try:
            with open_append(self.log) as out:
                out.write(f"{line}\n")
        except OSError:
            pass  # a log that cannot be written: status falls back on the process being gone


def start_worker(sd: SweepDir, unit: str, gpu: int | None, prior: dict[str, Any] | None) -> LocalWorker:
    """Start the worker of ``unit`` on ``gpu`` (None: no GPU), its log a new file."""
    env = module_env(dict(os.environ, CUDA_VISIBLE_DEVICES="" if gpu is None else str(gpu)))
    cmd = module_command(WORKER, str(sd.root), unit, json.dumps(prior or {}), unbuffered=True)
    path, fd = _new_log(log_folder(sd.logs), unit)
    header = starting_line(unit, f"GPU {'-' if gpu is None else gpu}, local worker process")
    try:
        written = os.write(fd, header)
    except OSError:  # a full disk: the worker fails on it, and says so where it can
        written = 0
    proc: subprocess.Popen[bytes] | None = None
    try:
        before = oom_kills()
        with children_block_sigint():
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env)
    except BaseException:  # a Ctrl-C that came while it started: the worker stops with the run
        if proc is not None:
            _stop(proc)
        raise
    finally:
        os.close(fd)
    limit = sd.spec.executor.timeout_min
    return LocalWorker(unit, proc, path, sd.marker_path(unit), limit, before, time.monotonic(), header=written)


def _new_log(folder: Path, unit: str) -> tuple[Path, int]:
    """A log file of the unit's that no earlier worker wrote: ``<unit>.<n>_0_log.err``."""
    n = 1
    while True:
        path = folder.absolute() / f"{unit}.{n}_0_log.err"
        try:
            return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            n += 1


def stop_workers(workers: list[LocalWorker]) -> None:
    """Ask each worker to stop (TERM: it abandons its configs in flight and exits) and give them
    ``STOP_WAIT_S`` to do so; one still there then (its handler waits for a call that has not
    returned: a long compile or a kernel in interpret mode) is killed, so none goes on measuring
    after the run said it stopped. A Ctrl-C at a terminal reached the workers already; this
    covers one that reached only us. Further Ctrl-C meanwhile are ignored (the CLI's handler). A
    worker a signal ended before it could say so (still starting: it takes the stop signals over
    once its unit runs; or killed) gets the line it would have written, so its unit reads as
    interrupted, not as failed."""
    for w in workers:
        _signal(w.proc, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    left = workers
    while left and time.monotonic() < deadline:
        left = [w for w in left if w.poll() is None]
        time.sleep(0.1)
    for w in left:
        if w.poll() is None:
            log.warning("unit %s: its worker did not stop within %.0f s of the stop; killing it", w.unit, STOP_WAIT_S)
            _signal(w.proc, signal.SIGKILL)
            w.proc.wait()
    for w in workers:
        if last_word(w.log, w.unit) is not None:
            continue
        if w.poll() == -signal.SIGTERM:
            w._say(interrupted_line(w.unit, "stopped with the run that started it, before its unit began"))
        elif w.poll() == -signal.SIGKILL:
            w._say(
                interrupted_line(
                    w.unit,
                    f"stopped with the run that started it: killed {STOP_WAIT_S:.0f} s after the stop, its config in "
                    "flight not ended; its finished records are kept",
                )
            )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop one worker as ``stop_workers`` does (it ignores SIGINT until its unit runs)."""
    _signal(proc, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_WAIT_S)


def wait_any(workers: list[LocalWorker], timeout_s: float) -> None:
    """Return once one of ``workers`` has ended, or after ``timeout_s``."""
    if len(workers) == 1:
        with contextlib.suppress(subprocess.TimeoutExpired):
            workers[0].proc.wait(timeout=timeout_s)
    elif workers:
        time.sleep(timeout_s)


def _signal(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(OSError):
        proc.send_signal(signum)


@contextlib.contextmanager
def children_block_sigint() -> Iterator[None]:
    """Start processes with SIGINT blocked, and keep a Ctrl-C that comes meanwhile for this
    process's own handler, run once the block ends.

    A worker that starts with SIGINT blocked installs its own handler and unblocks it once its
    unit runs (``jobs.in_flight.stop_signals``), and then stops cleanly on a Ctrl-C, which a
    terminal sends to the whole process group, whether it came before or after: never with a
    traceback in its log. A controller started here (``local_controller``) keeps it blocked for
    its life: a Ctrl-C in its own code would print a traceback on the user's terminal and
    SIGKILL its worker before the worker had written its abandon lines. Only this thread's mask
    changes and this process's disposition stays a handler: the process's other threads (a
    lease's heartbeat, a progress bar's monitor) take a Ctrl-C that comes meanwhile and would
    drop it under SIG_IGN."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one pending for this thread is noted now
        signal.signal(signal.SIGINT, previous)
        if came:
            signal.raise_signal(signal.SIGINT)  # to the handler the run had: the Ctrl-C stops it
