"""A SLURM task's workers: one process per unit, each on its own GPU and its own CPU share.

A task given G GPUs holds up to G units (``slurm.tasks_of``). Each unit runs in its own
process (``unit_worker``) that sees only its GPU (``CUDA_VISIBLE_DEVICES`` set to one of the
task's, in order) and runs on its own share of the task's CPUs (its affinity: the task's
CPUs split into G contiguous parts, or one CPU each, shared round robin, when there are
fewer CPUs than units). The compile pool of a worker sizes itself to its affinity, so G
workers compile on the task's CPUs without taking each other's cores, and they share the
sweep's one compile cache. Each worker writes to its unit's log (``SweepDir.unit_log``),
so ``tilesweep logs`` shows one unit's story even when its task ran several.

The parent starts the workers, forwards signals, and says why a worker died when the worker
could not (a signal, the OOM killer) as the unit log's last line. It never imports jax.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from orchestrator.control.dispatch.unit_worker import HELD, SIGNALS, STOPPED
from orchestrator.control.why import failure_line, oom_kills, read_failure, signal_reason
from orchestrator.store.sweepdir import SweepDir, now_iso

log = logging.getLogger(__name__)

POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


def task_gpus() -> list[str]:
    """The task's GPUs as SLURM hands them over (``CUDA_VISIBLE_DEVICES``), in order."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if env.strip() in ("", "NoDevFiles", "-1"):
        return []
    return [g.strip() for g in env.split(",") if g.strip()]


def task_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def cpu_shares(cpus: list[int], n: int) -> list[list[int]]:
    """The task's CPUs split into ``n`` contiguous shares as even as they go; with fewer CPUs
    than workers, one CPU each, shared round robin."""
    if n <= 0 or not cpus:
        return [[] for _ in range(max(n, 0))]
    if len(cpus) < n:
        return [[cpus[k % len(cpus)]] for k in range(n)]
    size, extra = divmod(len(cpus), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(cpus[start:end])
        start = end
    return out


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _preexec(cpus: list[int], libc: ctypes.CDLL | None) -> Callable[[], None]:
    """In the child, before exec: hold USR2, TERM and USR1 until its handlers exist, pin it to its
    CPU share, and have it sent TERM if this parent dies (no orphan keeps a GPU)."""

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return setup


@dataclass
class Slot:
    """One unit of the task: its GPU and CPU share, its log, its process and how it ended."""

    unit: str
    gpu: str | None
    cpus: list[int]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    state: str = "waiting"  # waiting | skipped (done before) | running | done | stopped | held | failed
    reason: str | None = None

    def outcome(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "gpu": self.gpu,
            "cpus": self.cpus,
            "state": self.state,
            "reason": self.reason,
            "log": str(self.log),
        }


class TaskWorkers:
    """The workers of one task's units (see the module docstring)."""

    def __init__(self, sweep_dir: str, units: list[str], prior: dict[str, dict[str, Any]], task: str | None) -> None:
        self.sd = SweepDir(Path(sweep_dir))
        self.prior = prior
        self.task = task
        gpus = task_gpus()
        if gpus and len(units) > len(gpus):
            log.warning("%d units but %d GPUs in this task: GPUs are shared", len(units), len(gpus))
        shares = cpu_shares(task_cpus(), len(units))
        self.slots = [
            Slot(unit=u, gpu=gpus[k % len(gpus)] if gpus else None, cpus=shares[k], log=self.sd.unit_log(u))
            for k, u in enumerate(units)
        ]
        self._oom_before: int | None = None

    def start(self) -> None:
        """Start a worker per unit that is not done yet."""
        self._oom_before = oom_kills()
        libc = _libc()
        for slot in self.slots:
            if self.sd.marker_path(slot.unit).exists():
                slot.state = "skipped"
                continue
            slot.log.parent.mkdir(parents=True, exist_ok=True)
            with open(slot.log, "ab") as out:
                self._note(
                    out,
                    f"starting unit {slot.unit} on {socket.gethostname()}, GPU {slot.gpu or '-'}, "
                    f"CPUs {','.join(map(str, slot.cpus)) or '-'}, SLURM task {self.task or '-'}",
                )
                env = dict(os.environ)
                if slot.gpu is not None:
                    env["CUDA_VISIBLE_DEVICES"] = slot.gpu
                cmd = [
                    sys.executable,
                    "-u",
                    "-m",
                    "orchestrator.control.dispatch.unit_worker",
                    str(self.sd.root),
                    slot.unit,
                    json.dumps(self.prior.get(slot.unit) or {}),
                ]
                slot.proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, preexec_fn=_preexec(slot.cpus, libc)
                )
            slot.state = "running"
            log.info("unit %s: worker pid %d on GPU %s, CPUs %s", slot.unit, slot.proc.pid, slot.gpu, slot.cpus)

    @staticmethod
    def _note(out: IO[bytes], text: str) -> None:
        out.write(f"{now_iso()} tilesweep: {text}\n".encode())
        out.flush()

    def running(self) -> list[Slot]:
        return [s for s in self.slots if s.proc is not None and s.proc.poll() is None]

    def signal(self, signum: int) -> None:
        """Send a signal to every worker still running."""
        for slot in self.running():
            try:
                os.kill(slot.proc.pid, signum)  # type: ignore[union-attr]
            except ProcessLookupError:
                pass

    def wait(self) -> None:
        """Until every worker has ended (signal handlers run in between)."""
        while self.running():
            time.sleep(POLL_S)

    def mark_hung(self, wait_s: float = 1.0) -> None:
        """Ask every worker still running to mark its configs in flight hung (USR1, see
        ``unit_worker``) and give them ``wait_s`` to write those lines before the kill. A worker
        stuck where no handler runs writes nothing: its configs still count as plain deaths."""
        self.signal(signal.SIGUSR1)
        deadline = time.monotonic() + wait_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL every worker still running and reap it (its configs in flight stay
        started, so they count as attempts that died on them)."""
        self.signal(signal.SIGKILL)
        for slot in self.slots:
            if slot.proc is not None:
                slot.proc.wait()

    def finish(self) -> list[dict[str, Any]]:
        """How each unit ended; a worker that died without a word gets its reason written."""
        for slot in self.slots:
            if slot.proc is None:
                continue
            code = slot.proc.wait()
            if code == 0:
                slot.state = "done"
            elif code == STOPPED:
                slot.state = "stopped"
            elif code == HELD:
                slot.state = "held"
                slot.reason = read_failure(slot.log, slot.unit, "not started") or "another live worker holds it"
            elif code < 0:
                oom = signal.Signals(-code) == signal.SIGKILL and self._oom_grew()
                slot.state, slot.reason = "failed", signal_reason(-code, oom)
                with open(slot.log, "ab") as out:
                    self._note(out, failure_line(slot.unit, slot.reason).removeprefix("tilesweep: "))
            else:
                slot.state = "failed"
                slot.reason = read_failure(slot.log, slot.unit) or f"the worker exited with code {code}"
        return [s.outcome() for s in self.slots]

    def _oom_grew(self) -> bool:
        now = oom_kills()
        return self._oom_before is not None and now is not None and now > self._oom_before
