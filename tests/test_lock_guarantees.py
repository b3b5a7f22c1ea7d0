"""The guarantees the soft lock and the leases stand on, held against ours (store/locks.py)
and against filelock's soft locks, with real holder processes.

Each test states one guarantee and runs it against every lock that could carry it: ours
must pass; a filelock class that lacks the guarantee is marked ``xfail(strict=True)`` with the
reason, and fails only by the test's own assertion (a precondition that does not hold raises
something else and is a real failure). The classes are the installed filelock's (a class it
does not have is skipped). The day a filelock release gains a guarantee, its test passes, the
strict mark turns that into a failure, and the module docstring of store/locks.py, which
cites these tests, is due for another look.

Another host is simulated the only way a test on one machine can: the holder is killed and
its lock file rewritten to name another host. From here that is exactly what a holder on
another node looks like: a file whose process cannot be checked.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import filelock
import pytest

from orchestrator.errors import LockTimeout
from tests.conftest import REPO
from tests.lock_holder import LEASE, LIFETIME, OURS, STRICT, make_lock

if TYPE_CHECKING:  # what pytest.param returns (pytest.ParameterSet from pytest 9.2 on)
    from _pytest.mark.structures import ParameterSet

ELSEWHERE = "node-elsewhere"
SHORT_S = 0.5  # a staleness limit (ours: foreign_stale_s; filelock: lease_duration, lifetime) a test outwaits
LONG_S = 600.0  # one it never reaches

# filelock releases that have the class (SoftFileLease came in 3.30); the pin admits older ones
_INSTALLED = {
    OURS: True,
    LEASE: hasattr(filelock, "SoftFileLease"),
    STRICT: hasattr(filelock, "StrictSoftFileLock"),
    LIFETIME: hasattr(filelock, "SoftFileLockLifetimeWarning"),
}


def _of(kind: str, lacks: str | None = None) -> ParameterSet:
    """``kind`` as a test's parameter, skipped where the installed filelock has no such lock;
    ``lacks``: why that lock lacks the test's guarantee, a strict xfail."""
    marks = [pytest.mark.skipif(not _INSTALLED[kind], reason=f"filelock {filelock.__version__} has no {kind}")]
    if lacks is not None:
        marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=lacks))
    return pytest.param(kind, marks=marks)


@contextmanager
def holder(kind: str, path: Path, limit_s: float) -> Iterator[subprocess.Popen[str]]:
    """A live process holding the lock for the block (it is killed after it)."""
    code = "from tests.lock_holder import hold_main; hold_main()"
    argv = [sys.executable, "-c", code, kind, str(path), str(limit_s)]
    p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline().strip()
        if line != "held":
            raise RuntimeError(f"the holder did not take {path}: {p.stderr.read()}")
        yield p
    finally:
        p.kill()
        p.communicate()


def left_by_dead_holder(kind: str, path: Path, limit_s: float) -> int:
    """The lock file a holder left when SIGKILL ended it; its pid."""
    with holder(kind, path, limit_s) as p:
        pid = p.pid
    if not path.exists():
        raise RuntimeError(f"the killed holder left no {path}")
    return pid


def take(kind: str, path: Path, limit_s: float, timeout_s: float) -> bool:
    """Whether a contender takes the lock within ``timeout_s`` (it lets go at once)."""
    lock = make_lock(kind, path, limit_s, timeout_s)
    try:
        lock.acquire()
    except (LockTimeout, filelock.Timeout):
        return False
    lock.release()
    return True


def rewrite_marker(kind: str, path: Path, **fields: str | int) -> None:
    """Rewrite a dead holder's lock file: ours is JSON; SoftFileLock's is its pid, host and
    start token, a line each; the other filelock markers are ``key=value`` records."""
    text = path.read_text(encoding="utf-8")
    if kind == OURS:
        text = json.dumps({**json.loads(text), **fields}) + "\n"
    elif kind == LIFETIME:
        lines = text.splitlines()
        lines[0], lines[1] = str(fields.get("pid", lines[0])), str(fields.get("host", lines[1]))
        text = "".join(f"{line}\n" for line in lines)
    else:
        for key, value in fields.items():
            text, n = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.MULTILINE)
            if n != 1:
                raise RuntimeError(f"no {key}= line in {text!r}")
    path.write_text(text, encoding="utf-8")


def as_if_from_another_host(kind: str, path: Path) -> None:
    if kind == OURS:
        rewrite_marker(kind, path, host=ELSEWHERE, boot_id="another-boot", pidns="pid:[1]")
    else:
        rewrite_marker(kind, path, host=ELSEWHERE)


def age(path: Path, seconds: float) -> None:
    """Make the lock file look last refreshed ``seconds`` ago."""
    old = time.time() - seconds
    os.utime(path, (old, old))


@pytest.mark.parametrize(
    "kind",
    [OURS, _of(LEASE), _of(LIFETIME), _of(STRICT, "fail-closed: a claim goes only by its owner or force_break()")],
)
def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.lock"
    left_by_dead_holder(kind, path, LONG_S)
    assert take(kind, path, LONG_S, timeout_s=5)  # well before any staleness limit


@pytest.mark.parametrize("kind", [OURS, _of(LEASE), _of(LIFETIME)])
def test_a_holder_whose_pid_now_belongs_to_another_process_is_taken_over(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.lock"
    left_by_dead_holder(kind, path, LONG_S)
    rewrite_marker(kind, path, pid=os.getpid())  # alive, but started at another time than the holder
    assert take(kind, path, LONG_S, timeout_s=5)


@pytest.mark.parametrize(
    "kind",
    [OURS, _of(LEASE), _of(STRICT), _of(LIFETIME, "no heartbeat: lifetime expires a live holder that holds longer")],
)
def test_a_live_holder_on_this_host_is_never_broken_however_long_it_holds(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.lock"
    with holder(kind, path, SHORT_S):
        if kind == OURS:
            age(path, 10 * SHORT_S)  # ours keys on the pid, not on the file's age
        assert not take(kind, path, SHORT_S, timeout_s=4 * SHORT_S)


@pytest.mark.parametrize(
    "kind",
    [
        OURS,
        _of(STRICT),
        _of(LEASE, "a lease whose heartbeat stalls for lease_duration is taken, live holder or not"),
        _of(LIFETIME, "lifetime expires a live holder by its marker's age"),
    ],
)
def test_a_live_holder_whose_heartbeat_stalls_is_never_broken(tmp_path: Path, kind: str) -> None:
    """SIGSTOP freezes the holder, heartbeat thread and all, as Ctrl-Z does to a `tilesweep
    run` in its shell: alive, and silent for as long as it stays stopped."""
    path = tmp_path / "x.lock"
    with holder(kind, path, SHORT_S) as p:
        os.kill(p.pid, signal.SIGSTOP)
        age(path, 10 * SHORT_S)
        assert not take(kind, path, SHORT_S, timeout_s=4 * SHORT_S)


@pytest.mark.parametrize("kind", [OURS, _of(LEASE), _of(LIFETIME)])
def test_a_holder_on_another_host_is_not_broken_before_its_staleness_limit(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.lock"
    left_by_dead_holder(kind, path, LONG_S)
    as_if_from_another_host(kind, path)
    assert not take(kind, path, LONG_S, timeout_s=SHORT_S)


@pytest.mark.parametrize(
    "kind",
    [
        OURS,
        _of(LIFETIME),
        _of(LEASE, "expiry runs on the contender's clock from its first look, not from the last heartbeat"),
    ],
)
def test_a_holder_on_another_host_silent_past_its_limit_is_taken_over_at_once(tmp_path: Path, kind: str) -> None:
    """A worker that finds a dead node's lease tries once; a merger waits its lock timeout,
    shorter than the merge lock's hour: neither may have to watch the file for the limit."""
    path = tmp_path / "x.lock"
    left_by_dead_holder(kind, path, LONG_S)
    as_if_from_another_host(kind, path)
    age(path, LONG_S + 60)
    assert take(kind, path, LONG_S, timeout_s=SHORT_S)


@pytest.mark.parametrize(
    "kind",
    [
        OURS,
        _of(LEASE, "filelock logs a take-over at most at DEBUG"),
        _of(LIFETIME, "filelock logs a take-over at most at DEBUG"),
    ],
)
def test_taking_over_a_holder_on_another_host_warns_naming_it(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "x.lock"
    left_by_dead_holder(kind, path, SHORT_S)
    as_if_from_another_host(kind, path)
    age(path, 10 * SHORT_S)
    lock = make_lock(kind, path, SHORT_S, timeout_s=10 * SHORT_S)
    with caplog.at_level(logging.DEBUG):
        lock.acquire()  # a timeout here is no xfail: the take-over itself must happen
    lock.release()
    assert any(r.levelno >= logging.WARNING and ELSEWHERE in r.getMessage() for r in caplog.records)


def _record(kind: str, path: Path) -> dict[str, object]:
    """What a lock file says of its holder, as its own class reads it."""
    if kind == OURS:
        record: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
        return record
    owner = filelock.SoftFileLease(path, lease_duration=LONG_S).owner
    if owner is None:
        raise RuntimeError(f"no owner record in {path}")
    return {"pid": owner.pid, "host": owner.hostname}


@pytest.mark.parametrize("kind", [OURS, _of(LEASE)])
def test_the_lock_file_names_the_holder_s_host_and_pid(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.lock"
    with holder(kind, path, LONG_S) as p:
        record = _record(kind, path)
    assert record["pid"] == p.pid and str(record["host"]).startswith(socket.gethostname())


@pytest.mark.parametrize(
    "kind", [OURS, _of(LEASE, "the marker is filelock's fixed record (pid, host, mode, token, duration, start)")]
)
def test_the_lock_file_names_the_gpu_and_job_status_shows(tmp_path: Path, kind: str) -> None:
    """A lease's holder says which GPU and SLURM task run its unit (``make_lock`` asks for
    GPU 3 and task 71_2 where the class can record them)."""
    path = tmp_path / "x.lock"
    with holder(kind, path, LONG_S):
        record = _record(kind, path)
    assert record.get("gpu") == "3" and record.get("job") == "71_2"
