"""A SLURM task's workers: its GPUs take its units in turn, a worker process per GPU.

A task given G GPUs holds several units per GPU (``slurm.tasks_of``). It runs G at once, one
on each GPU, and a GPU whose unit ends takes the task's next unit not started yet, so the
GPUs of a task end within a fraction of a unit of each other, whatever the cost model got
wrong. Each GPU has one worker process (``forked``: a fork of the task, which has imported jax
and the worker's modules once) that runs the units the task hands it one after another, with
no exit, fork and setup between them and its jax, compiled kernels and shape's inputs warm. It
sees only its GPU (``CUDA_VISIBLE_DEVICES`` set to one of the task's) and runs on that GPU's
share of the task's CPUs (its affinity: the task's CPUs split into G contiguous parts, or all
of them, shared by every worker, when there are fewer CPUs than GPUs). The compile pool of a
worker sizes itself to its share (its affinity, or one CPU where all are shared), so G
workers compile on the task's CPUs without taking each other's cores, and they share the
sweep's one compile cache. A worker writes to the log of the unit it runs
(``SweepDir.unit_log``), so ``tilesweep logs`` shows one unit's story even when its task ran
several; each unit still runs under its own lease (one worker per unit). A worker that dies
costs only the unit it was running: the task starts a new worker, which takes the GPU's next.

The parent starts the workers, forwards signals, starts no more units once the task is told to
stop (the time-limit warning, TERM), and says why a worker died when the worker could not (a
signal, the OOM killer) as the unit log's last line. Once a worker failed it asks whether the
sweep directory's disk is full (``store.diskspace``): if so it starts no further unit, each of
which would fail the same way, and says so in its log and as the last line of each unit it did
not start, where ``status`` reads it. It imports jax but never starts a backend.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from orchestrator import counted
from orchestrator.control.dispatch.forked import ForkedWorker, preload, start_worker
from orchestrator.control.dispatch.nodelog import starting_line
from orchestrator.control.dispatch.unit_worker import HELD, NOT_STARTED, STOPPED
from orchestrator.control.why import death_reason, failure_line, oom_kills, read_failure
from orchestrator.cpus import usable_cpus
from orchestrator.errors import TilesweepError
from orchestrator.store.diskspace import FULL_ERRNOS, FullDisk
from orchestrator.store.files import open_append
from orchestrator.store.sweepdir import SweepDir, now_iso

if TYPE_CHECKING:
    from orchestrator.spec.model import SweepSpec

log = logging.getLogger(__name__)

POLL_S = 0.05  # how soon a dead worker is seen (a worker's message is read at once); a look costs a waitpid per GPU


def process_age_s() -> float:
    """Seconds since this process started (/proc's start time; -1 where there is no /proc)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def task_gpus() -> list[str]:
    """The task's GPUs as SLURM hands them over (``CUDA_VISIBLE_DEVICES``), in order."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if env.strip() in ("", "NoDevFiles", "-1"):
        return []
    return [g.strip() for g in env.split(",") if g.strip()]


def cpu_list(cpus: list[int]) -> str:
    """A worker's CPUs as the task's log and its unit's log say them: ``0,1``; ``-`` for none."""
    return ",".join(map(str, cpus)) or "-"


def cpu_shares(cpus: list[int], n: int) -> list[list[int]]:
    """The task's CPUs split into ``n`` contiguous shares as even as they go; with fewer CPUs
    than workers, all of them for every worker: the OS then shares them out as the work goes,
    so a worker whose unit ends leaves its CPU time to the others, and no GPU falls behind
    because the CPU it was pinned to was busier (pinned one CPU each, round robin, the workers
    of the busier CPU ended seconds after the others'; ``bench/README.md``, slurm)."""
    if n <= 0 or not cpus:
        return [[] for _ in range(max(n, 0))]
    if len(cpus) < n:
        return [list(cpus) for _ in range(n)]
    size, extra = divmod(len(cpus), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(cpus[start:end])
        start = end
    return out


@dataclass
class Slot:
    """One unit of the task: the GPU and CPU share it ran on, its log, its worker and how it ended."""

    unit: str
    log: Path
    gpu: str | None = None
    cpus: list[int] = field(default_factory=list)
    proc: ForkedWorker | None = None  # the worker that runs it
    state: str = "waiting"  # waiting (never started) | skipped (done before) | running | done | stopped | held | failed
    reason: str | None = None
    oom_before: int | None = None  # the OOM killer's count when its worker started

    def outcome(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "gpu": self.gpu,
            "cpus": self.cpus,
            "state": self.state,
            "reason": self.reason,
            "log": str(self.log),
        }


@dataclass
class Lane:
    """One GPU of the task (None in a task without GPUs) and its CPU share: its worker, and
    the unit it runs (one at a time). ``last``: the worker takes no further unit (it said so,
    or it was told there is none)."""

    gpu: str | None
    cpus: list[int]
    slot: Slot | None = None
    proc: ForkedWorker | None = None
    last: bool = False


class TaskWorkers:
    """The workers of one task's units (see the module docstring). Without GPUs, every unit
    gets a lane of its own, all at once."""

    def __init__(self, sweep_dir: str, units: list[str], prior: dict[str, dict[str, Any]], task: str | None) -> None:
        self.sd = SweepDir(Path(sweep_dir))
        self.prior = prior
        self.task = task
        gpus = task_gpus()
        n = max(1, min(len(units), len(gpus) or len(units)))
        cpus = usable_cpus()
        shares = cpu_shares(cpus, n)
        # where every worker runs on all of the CPUs, each compiles on one (compile_pool.share)
        self.compile_cpus = 1 if len(cpus) < n else None
        self.lanes = [Lane(gpu=gpus[k] if gpus else None, cpus=shares[k]) for k in range(n)]
        self.slots = [Slot(unit=u, log=self.sd.unit_log(u)) for u in units]
        self.disk = FullDisk(self.sd.root)
        self.stopping = False
        self._stop_signal: int | None = None

    def start(self) -> None:
        """Skip the units done before; start a worker on each GPU, each with the next unit."""
        for slot in self.slots:
            if self.sd.marker_path(slot.unit).exists():
                slot.state = "skipped"
        if not self.stopping and any(s.state == "waiting" for s in self.slots):
            t0 = time.perf_counter()
            interpreter = preload(self._spec())
            gpus = sum(lane.gpu is not None for lane in self.lanes)
            log.info(
                "%s, %s at a time (%s); imported what they use in %.2f s%s (the task's process started %.2f s ago)",
                counted(len(self.slots), "unit"),
                counted(len(self.lanes), "worker"),
                f"one per GPU, {counted(gpus, 'GPU')}" if gpus else "no GPU",
                time.perf_counter() - t0,
                f", {interpreter:.2f} s of it Pallas's interpreter (interpret mode)" if interpreter else "",
                process_age_s(),
            )
        self._fill()

    def _spec(self) -> SweepSpec | None:
        """The sweep's spec, for what the workers import; None where it cannot be read (each
        worker then says why in its unit's log)."""
        try:
            return self.sd.spec
        except TilesweepError as exc:
            log.warning("the task cannot read its sweep's spec (%s); its workers import what they need", exc.message)
            return None

    def stop(self, signum: int | None = None) -> None:
        """Start no more units, and send ``signum`` (if given) to every worker running, and to
        one whose start this call interrupted."""
        self.stopping = True
        if signum is not None:
            self._stop_signal = signum
            self.signal(signum)

    def _fill(self) -> None:
        """Give every free GPU the task's next unit not started yet; tell a GPU's worker that
        there is none left (or that the task stops), so it exits."""
        for lane in self.lanes:
            if lane.slot is not None:
                continue
            nxt = None if self.stopping else next((s for s in self.slots if s.state == "waiting"), None)
            if nxt is not None and (lane.proc is None or not lane.last):
                self._launch(lane, nxt)
            elif lane.proc is not None and not lane.last:
                lane.last = True
                lane.proc.send({"quit": True})

    def _launch(self, lane: Lane, slot: Slot) -> None:
        """``slot``'s unit on ``lane``: handed to its worker, or to a new one where it has none."""
        try:
            slot.log.parent.mkdir(parents=True, exist_ok=True)
            with open_append(slot.log, "ab") as out:
                where = f"GPU {lane.gpu or '-'}, CPUs {cpu_list(lane.cpus)}, SLURM task {self.task or '-'}"
                out.write(starting_line(slot.unit, where))
                out.flush()
        except OSError as exc:  # no room for its log: the disk is full, and its worker would fail on it
            if exc.errno not in FULL_ERRNOS or not self.disk.probe():
                raise
            self._stop_for_disk()
            return
        slot.gpu, slot.cpus = lane.gpu, lane.cpus
        slot.oom_before = oom_kills()
        prior = self.prior.get(slot.unit) or {}
        if lane.proc is None:
            lane.proc = start_worker(
                slot.log, slot.gpu, slot.cpus, str(self.sd.root), slot.unit, prior, compile_cpus=self.compile_cpus
            )
            lane.last = False
            if self._stop_signal is not None:  # a stop came while it was being forked
                os.kill(lane.proc.pid, self._stop_signal)
        elif not lane.proc.send({"unit": slot.unit, "prior": prior, "log": str(slot.log)}):
            lane.last = True  # its worker is gone: the unit waits for the next worker of the GPU
            return
        slot.proc, slot.state, lane.slot = lane.proc, "running", slot
        gpu = f"GPU {slot.gpu}" if slot.gpu is not None else "no GPU"
        log.info("unit %s: worker pid %d on %s, CPUs %s", slot.unit, lane.proc.pid, gpu, cpu_list(slot.cpus))

    @staticmethod
    def _note(out: IO[bytes], text: str) -> None:
        out.write(f"{now_iso()} tilesweep: {text}\n".encode())
        out.flush()

    def running(self) -> list[ForkedWorker]:
        """The workers still alive."""
        return [lane.proc for lane in self.lanes if lane.proc is not None and lane.proc.poll() is None]

    def signal(self, signum: int) -> None:
        """Send a signal to every worker still running."""
        for proc in self.running():
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                pass

    def step(self) -> None:
        """Note how each unit whose worker said so (or died) ended, then give its GPU the next."""
        for lane in self.lanes:
            self._read(lane)
            if lane.proc is not None and lane.proc.poll() is not None:
                self._read(lane)  # what it said before it exited
                if lane.slot is not None:  # it died with its unit
                    self._ended(lane.slot, lane.proc.wait())
                    lane.slot = None
                lane.proc.close()
                lane.proc, lane.last = None, False
        self._fill()

    def _read(self, lane: Lane) -> None:
        """What ``lane``'s worker said of the units it ran."""
        if lane.proc is None:
            return
        for message in lane.proc.messages():
            slot = lane.slot
            if slot is None or slot.unit != message.get("unit"):
                log.warning("GPU %s's worker spoke of unit %s, which it does not run", lane.gpu, message.get("unit"))
                continue
            self._ended(slot, int(message["code"]))
            lane.slot = None
            lane.last = lane.last or not message.get("next")

    def wait(self) -> None:
        """Until no GPU has a unit left to run and every worker has exited (signal handlers run
        in between)."""
        self.step()
        while any(lane.slot is not None or lane.proc is not None for lane in self.lanes):
            fds = [lane.proc.recv_fd for lane in self.lanes if lane.proc is not None]
            select.select(fds, [], [], POLL_S)
            self.step()

    def mark_hung(self, wait_s: float = 1.0) -> None:
        """Ask every worker still running to mark its configs in flight hung (USR1, see
        ``unit_worker``) and give them ``wait_s`` to write those lines before the kill. A worker
        stuck where no handler runs writes nothing: its configs still count as plain deaths."""
        self.signal(signal.SIGUSR1)
        deadline = time.monotonic() + wait_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill(self) -> None:
        """Start no more units, SIGKILL every worker still running and reap it (its configs in
        flight stay started, so they count as attempts that died on them)."""
        self.stop()
        self.signal(signal.SIGKILL)
        for lane in self.lanes:
            if lane.proc is not None:
                lane.proc.wait()

    def finish(self) -> list[dict[str, Any]]:
        """How each unit ended (``waiting``: the task stopped before a GPU took it); a worker
        that died without a word gets its reason written."""
        for lane in self.lanes:
            self._read(lane)
        for slot in self.slots:
            if slot.state == "running" and slot.proc is not None:
                self._ended(slot, slot.proc.wait())
        for lane in self.lanes:
            if lane.proc is not None and lane.proc.poll() is not None:
                lane.proc.close()
        return [s.outcome() for s in self.slots]

    def _ended(self, slot: Slot, code: int) -> None:
        """How ``slot``'s unit ended, from its worker's ``code`` (its message's, or the exit
        code of a worker that died with it: negative, the signal)."""
        if code == 0:
            slot.state = "done"
        elif code == STOPPED:
            slot.state = "stopped"
        elif code == NOT_STARTED:
            slot.state, slot.gpu, slot.cpus = "waiting", None, []
        elif code == HELD:
            slot.state = "held"
            slot.reason = read_failure(slot.log, slot.unit, "not started") or "another live worker holds it"
        elif code < 0:
            slot.state, slot.reason = "failed", death_reason(-code, slot.oom_before)
            self._say_failed(slot)
        else:
            slot.state = "failed"
            slot.reason = read_failure(slot.log, slot.unit)
        if slot.state == "failed" and self.disk.probe():
            slot.reason = slot.reason or self.disk.no_room(code, "its log gives no reason")
            self._stop_for_disk()
        elif slot.state == "failed" and slot.reason is None:
            slot.reason = f"the worker exited with code {code}"

    def _stop_for_disk(self) -> None:
        """The disk is full: start no further unit (each would fail on it); say so in the task's
        log, and as the last line of each unit not started, in its own log where the disk takes
        it and in the task's (``status`` reads either)."""
        waiting = [s for s in self.slots if s.state == "waiting"]
        self.stopping = True
        if not waiting:
            return
        log.error("%s", self.disk.stopped("the task", len(waiting)))
        reason = self.disk.stopped("its task")
        for slot in waiting:
            slot.state, slot.reason = "failed", reason
            log.error("%s", failure_line(slot.unit, reason))
            self._say_failed(slot)

    def _say_failed(self, slot: Slot) -> None:
        """Why ``slot``'s unit failed, as its log's last line, where the disk takes it."""
        try:
            with open_append(slot.log, "ab") as out:
                self._note(out, failure_line(slot.unit, slot.reason or "").removeprefix("tilesweep: "))
        except OSError as exc:  # a full disk: the task's log holds what it knows
            log.warning("unit %s: its log %s takes no line (%s)", slot.unit, slot.log, exc.strerror)
