"""Why a unit failed, in one line: written where it happens, read by status, wait and run.

A unit's worker writes its own reason as the last line of the unit's log when it gives up
(``failure_line``: a broken environment, such as a GPU task whose jax sees no GPU, or a
crash), or says it was interrupted when a stop signal ended it (``interrupted_line``: Ctrl-C,
SIGTERM; not a failure, its finished records are kept); the process that started it writes
the reason when the worker died without a word (killed by a signal, or by the kernel's OOM
killer: ``node`` on SLURM, ``local_controller`` here). Readers take the last such line of the
log (``read_failure``, ``last_word``), and fall back on the last exception line of a Python
traceback in a log (a task that failed before any worker started). Reading the tail of a log
is cheap, and only failed units are read.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from orchestrator import PROG, word

_TAIL_BYTES = 64 * 1024
_MARK = "tilesweep: unit "
_LINE = re.compile(r"tilesweep: unit (\S+) (failed|not started|interrupted): (.+)$")
INTERRUPTED = "interrupted"
# The attribute a worker sets on the log record of its unit's own line (``UNIT_LINE``: failed,
# interrupted). The line is the unit's log's, which status reads; a command that runs a unit in its
# own process (the debug executor) says how the unit ended itself, as it does for a worker process,
# so its console leaves the line out.
UNIT_LINE_ATTR = "tilesweep_unit_line"
UNIT_LINE = {UNIT_LINE_ATTR: True}
# the last line of a Python traceback: "pkg.mod.SomeError: message" (or the bare name)
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Crashed|Held))(?::\s*(.*))?$")


def failure_line(unit: str, reason: str) -> str:
    """The line a unit's log ends with when the unit failed (``read_failure`` finds it)."""
    return f"{_MARK}{unit} failed: {' '.join(reason.split())}"


def crash_reason(exc: BaseException) -> str:
    """A worker's reason for an error it did not expect, in one line: a write the user must
    fix (a full disk, a quota, a read-only mount) as ``files.cannot_write`` says it, naming the
    file, its filesystem and the fix; anything else as its type and message."""
    from orchestrator.control.scheduler import one_line
    from orchestrator.store.files import WRITE_ERRNOS, cannot_write

    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return cannot_write(exc)
    return f"{type(exc).__name__}: {one_line(exc)}"


def not_started_line(unit: str, reason: str) -> str:
    """The line a unit's log gets when a worker was not started on it (another live worker holds it)."""
    return f"{_MARK}{unit} not started: {' '.join(reason.split())}"


def interrupted_line(unit: str, reason: str) -> str:
    """The line a unit's log ends with when a stop signal ended its worker (``last_word``)."""
    return f"{_MARK}{unit} {INTERRUPTED}: {' '.join(reason.split())}"


def last_word(path: str | Path | None, unit: str) -> tuple[str, str] | None:
    """The unit's last line of any kind in a log: ("failed" | "not started" | "interrupted",
    its reason), or None where the log has none."""
    if not path:
        return None
    for line in reversed(_tail(Path(path))):
        m = _LINE.search(line)
        if m and m.group(1) == unit:
            return m.group(2), m.group(3).strip()
    return None


def _tail(path: Path) -> list[str]:
    from orchestrator.store.files import open_file

    try:
        with open_file(path) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def read_failure(path: str | Path | None, unit: str | None = None, kind: str = "failed") -> str | None:
    """The reason a unit failed from its log: the last ``failure_line`` (of ``unit`` when
    given), else the last exception line of a traceback, else None. ``kind="not started"``
    reads the last ``not_started_line`` instead (no traceback fallback)."""
    if not path:
        return None
    lines = _tail(Path(path))
    for line in reversed(lines):
        m = _LINE.search(line)
        if m and m.group(2) == kind and (unit is None or m.group(1) == unit):
            return m.group(3).strip()
    if kind != "failed":
        return None
    for line in reversed(lines):
        m = _EXC.match(line.strip())
        if m:
            name = m.group(1).rsplit(".", 1)[-1]
            return f"{name}: {m.group(2)}" if m.group(2) else name
    return None


# submitit's last word on a task whose time limit came with no requeue left (executor.max_requeues
# used up): its UncompletedJobError, "Job not requeued because: timed-out too many times."
REQUEUES_RAN_OUT = "timed-out too many times"


def out_of_time(minutes: int, sweep: str, spec_file: str | None, full: str | None = None) -> str:
    """What a unit whose SLURM task hit its time limit (TIMEOUT) tells a user: what happened and
    the two fixes ``resume`` takes (a longer limit from the spec file, or more, smaller units).
    ``full``: the partition whose whole time limit ``minutes`` is, where no longer one is had."""
    return (
        f"its task ran out of its time limit (executor.timeout_min: {minutes} min{_all_of(full)}); its finished "
        "records are kept: " + _more_time(_LONGER if full else "raise executor.timeout_min", sweep, spec_file)
    )


def out_of_requeues(minutes: int, requeues: int, sweep: str, spec_file: str | None, full: str | None = None) -> str:
    """What a unit whose task submitit did not requeue again (``REQUEUES_RAN_OUT``) tells a user:
    the fixes of ``out_of_time``, and more requeues."""
    change = (
        f"raise executor.max_requeues, or {_LONGER}"
        if full
        else "raise executor.timeout_min (or executor.max_requeues)"
    )
    return (
        f"its task ran out of its time limit (executor.timeout_min: {minutes} min{_all_of(full)}) with no requeue "
        f"left (executor.max_requeues: {requeues}); its finished records are kept: "
        + _more_time(change, sweep, spec_file)
    )


# the fix of a time limit that is all its partition allows
_LONGER = "name a partition with a longer time limit in executor.slurm_partition (`sinfo -s` lists their limits)"


def _all_of(full: str | None) -> str:
    return f", all that partition {full} allows" if full else ""


def _more_time(change: str, sweep: str, spec_file: str | None) -> str:
    """The fixes ``resume`` takes for a unit out of time: ``change`` made in the spec file, or more units."""
    spec = word(spec_file) if spec_file else "SPEC"
    return (
        f"{change} in {spec}, then `{PROG} resume {word(sweep)} --spec {spec}`, or spread what is left over more "
        f"units: `{PROG} resume {word(sweep)} --units N`"
    )


# what ``never_taken`` says of a unit, which ``logs`` of that unit says as it is
NOT_TAKEN = "before one of its GPUs took this unit"


def never_taken(task_end: str) -> str:
    """Why a unit of a whole-node task failed that none of the task's GPUs took: the task ended
    first (``task_end``: what SLURM says of it), so nothing of the unit ran."""
    return f"its task died {NOT_TAKEN} ({task_end}), so none of it ran; `{PROG} resume` runs it"


def died_under(task_end: str) -> str:
    """Why a unit of a whole-node task failed that a GPU of the task ran when the task died, where
    its worker said nothing (SLURM ended it with the task before it could): ``task_end`` is what
    SLURM says of the task."""
    return (
        f"its task died while one of its GPUs ran this unit ({task_end}), and the unit's worker with it; its "
        f"finished records are kept: `{PROG} resume` runs the rest"
    )


# what to do about a worker the OOM killer ended, where it ran
_MORE_MEMORY = {
    "slurm": "give the task more memory: executor.mem_gb",
    "local": "run fewer units at once here (--workers, executor.local_workers) or free memory",
}


def signal_reason(signum: int, oom_killed: bool = False, *, where: str = "slurm") -> str:
    """What a death by signal tells a user: "killed by signal 9 (SIGKILL)", or "out of
    memory" and what to do (``where`` the worker ran: slurm or local) when the kernel's OOM
    killer did it."""
    if oom_killed:
        return f"out of memory (the kernel's OOM killer ended the worker; {_MORE_MEMORY[where]})"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "unknown"
    return f"killed by signal {signum} ({name})"


def death_reason(signum: int, oom_before: int | None, *, where: str = "slurm") -> str:
    """``signal_reason`` of a worker that signal ``signum`` ended, a SIGKILL told to be the OOM
    killer's where ``oom_kills`` grew since it read ``oom_before`` (when the worker started)."""
    now = oom_kills() if signum == signal.SIGKILL else None
    return signal_reason(signum, oom_before is not None and now is not None and now > oom_before, where=where)


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has ended in this process's memory cgroup
    (cgroup v2 ``memory.events`` or v1 ``memory.oom_control``), or None where it cannot say.
    Read before and after a worker dies by SIGKILL to tell an OOM kill from another kill."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "memory":
            files = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"]
        elif controllers == "":
            files = [
                Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events",
                Path("/sys/fs/cgroup/unified") / path.lstrip("/") / "memory.events",
            ]
        else:
            continue
        for f in files:
            try:
                text = f.read_text()
            except OSError:
                continue
            m = re.search(r"^oom_kill (\d+)$", text, re.M)
            if m:
                return int(m.group(1))
    return None


def exit_reason(exit_code: str) -> str | None:
    """sacct's ``ExitCode`` (``exit:signal``) as words, when it says more than "failed"."""
    code, _, sig = exit_code.partition(":")
    if sig.isdigit() and int(sig):
        return signal_reason(int(sig))
    if code.isdigit() and int(code):
        return f"exit code {int(code)}"
    return None
