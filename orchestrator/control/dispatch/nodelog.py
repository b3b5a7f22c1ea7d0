"""Logging on the node: every process of a task (the task itself, each unit's worker, the
merge job) logs INFO and up to its stderr, timestamped; that stderr is the log ``tilesweep
status`` and ``tilesweep logs`` read. Whoever starts a unit's worker (a SLURM task's
``node``, a local run, a local job's controller, the debug run) first writes the line that
names the unit and where it runs into the log it gives the worker (``starting_line``): each
attempt's output in a unit's log opens with it, whatever the worker then writes first."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.store.files import now_iso, open_append

NODE_LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def starting_line(unit: str, where: str) -> bytes:
    """The line naming ``unit`` and where its worker runs (``where``: its GPU, CPUs, task)."""
    return f"{now_iso()} tilesweep: starting unit {unit} on {socket.gethostname()}, {where}\n".encode()


def note_start(log: str | Path, unit: str, where: str) -> int:
    """Append ``starting_line`` to ``log``; the bytes written: none where it cannot be written (a
    full disk: the worker then fails on it, and says so where it can)."""
    line = starting_line(unit, where)
    try:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        with open_append(log, "ab") as out:
            out.write(line)
    except OSError:
        return 0
    return len(line)


def configure_node_logging() -> None:
    """INFO and up to stderr, timestamped (a no-op where logging is set up already, as in
    the debug executor's process)."""
    logging.basicConfig(level=logging.INFO, format=NODE_LOG_FORMAT)


class _DebugJobNotice(logging.Filter):
    """Drops the warning submitit's debug job logs on the root logger as each job starts
    (``Logging is written both to stderr/stdout and to ...``): the debug run's console shows it
    once per unit, succeeding or not, and it names nothing a user can act on. Every other record,
    tilesweep's own warnings among them, passes."""

    def __init__(self) -> None:
        super().__init__()
        from submitit.local import debug

        self.source = debug.__file__

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and record.pathname == self.source)


@contextmanager
def quiet_debug_jobs() -> Iterator[None]:
    """While the debug run's jobs run in this process: submitit's own notice of where each
    job logs dropped (``_DebugJobNotice``), on the console and in the job's log alike."""
    notice = _DebugJobNotice()
    root = logging.getLogger()
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)
