"""Which process is that: the pid space a process lives in, and whether a pid in it still runs.

A pid names a process only within one pid space: one host, one boot of its kernel, one pid
namespace (a container has its own). Within it a pid is recycled once its process ends, so a
pid is taken to be the same process only while its start time (``process_start``) is the same.
The soft lock's holder record and the sweep directory's stray temp files name their writers so.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any, TypedDict


class HostIdentity(TypedDict):
    """What makes two processes share a pid space: host name, kernel boot, pid namespace."""

    host: str
    boot_id: str | None
    pidns: str | None


def in_this_pid_space(record: Mapping[str, Any]) -> bool:
    """Whether the process a record names (its ``HostIdentity`` fields beside its pid) can be
    looked up from here: same host, boot and pid namespace."""
    me = host_identity()
    return all(record.get(k) == v for k, v in me.items())


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def host_identity() -> HostIdentity:
    """This process's pid space (see ``HostIdentity``)."""
    try:
        pidns: str | None = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = None
    return {"host": socket.gethostname(), "boot_id": _read("/proc/sys/kernel/random/boot_id"), "pidns": pidns}


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (the state first), or None."""
    stat = _read(f"/proc/{pid}/stat")
    return None if stat is None else stat.rsplit(")", 1)[-1].split()


STOPPED = ("T", "t")  # /proc/PID/stat's states of a process stopped by a signal or a debugger


def process_state(pid: int) -> str | None:
    """A pid's state letter (field 3 of /proc/PID/stat: ``R`` running, ``S`` asleep, ``T``
    stopped by a signal, ``t`` stopped by a debugger, ``Z`` ended), or None where /proc cannot say."""
    fields = _stat(pid)
    return None if not fields else fields[0]


def process_stopped(pid: int) -> bool:
    """Whether /proc says ``pid`` is stopped (Ctrl-Z, SIGSTOP, a debugger): it runs nothing until
    it is continued (``fg``, SIGCONT)."""
    return process_state(pid) in STOPPED


def process_start(pid: int) -> str | None:
    """A pid's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def pid_alive(pid: int, start: str | None) -> bool:
    """Whether ``pid`` still runs as the process that started at ``start`` (None: as any
    process; also where /proc cannot say). A process that has ended and waits only for its
    parent to collect it (a zombie) has ended. A pid of another user's process counts as alive."""
    fields = _stat(pid)
    if fields is not None:
        return fields[0] != "Z" and (start is None or fields[19] == start)
    if start is not None and os.path.isdir("/proc/self"):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
