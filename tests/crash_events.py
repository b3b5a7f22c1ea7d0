"""Where the crash trials' stops land: events in the files a process writes, watched for.

A stop that waits a guessed time lands wherever the machine's speed puts it, or after the
process has ended: then it stops nothing. A stop that waits for an event (an attempt's header,
the n-th record line, a half-written line) finds its process at that point of its work however
fast or slow the machine is, and the same seed stops at the same places.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

EVENT_TIMEOUT_S = 300.0  # a process that shows no sign of the awaited event this long has stalled


def wait_for(
    proc: subprocess.Popen[str], path: Path, test: Callable[[bytes], bool], timeout: float = EVENT_TIMEOUT_S
) -> bool:
    """Wait until ``test(path's bytes)`` holds (True), or the process has ended or ``timeout``
    passed without it (False)."""
    return wait_until(proc, lambda: test(read_bytes(path)), timeout)


def wait_until(proc: subprocess.Popen[str], happened: Callable[[], bool], timeout: float = EVENT_TIMEOUT_S) -> bool:
    """Wait until ``happened()`` (True), or the process has ended or ``timeout`` passed (False)."""
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        if happened():
            return True
        time.sleep(0.0005)
    return False


def mid_line(data: bytes) -> bool:
    """A line is being written: the partial does not end with its newline."""
    return len(data) > 0 and not data.endswith(b"\n")


def record_lines(data: bytes) -> int:
    """The record lines of a partial (every one follows its header's newline)."""
    return data.count(b'\n{"id":')


def records_at_least(n: int) -> Callable[[bytes], bool]:
    """Whether a partial holds ``n`` record lines (after its header)."""

    def enough(data: bytes) -> bool:
        return record_lines(data) >= n

    return enough


def headers_at_least(n: int) -> Callable[[bytes], bool]:
    """Whether a partial holds ``n`` attempts' headers: the ``n``-th attempt has started."""

    def started(data: bytes) -> bool:
        return data.count(b'{"header":') >= n

    return started


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def worker_moment(path: Path, n_items: int, rng: random.Random) -> tuple[str, Callable[[bytes], bool]] | None:
    """Where the next stop of a worker on the partial at ``path`` lands: once its attempt has
    started, or after its n-th record, always before its last (so it is still at work); None
    when every item is recorded already."""
    data = read_bytes(path)
    done, attempts = record_lines(data), data.count(b'{"header":')
    if done >= n_items:
        return None
    after = rng.randint(0, n_items - done - 1)
    if after == 0:
        return "start", headers_at_least(attempts + 1)
    return f"record {done + after}", records_at_least(done + after)
