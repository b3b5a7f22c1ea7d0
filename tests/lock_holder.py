"""The locks of ``tests/test_lock_guarantees.py`` by kind, and the holder process that takes one
and holds it (``python -c "from tests.lock_holder import hold_main; hold_main()" KIND PATH LIMIT_S``):
a module of its own so that each holder imports only the locks, not pytest and the tests."""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import filelock

from orchestrator.store.locks import SoftLock

OURS = "ours"
LEASE = "SoftFileLease"
STRICT = "StrictSoftFileLock"
LIFETIME = "SoftFileLock(lifetime)"

AnyLock = SoftLock | filelock.BaseFileLock


def make_lock(kind: str, path: Path, limit_s: float, timeout_s: float) -> AnyLock:
    """One lock of ``kind`` on ``path``; ``limit_s``: how long its holder may stay silent
    before a contender may take the lock (for ours: a holder on another host only)."""
    if kind == OURS:
        return SoftLock(path, timeout_s, extra={"gpu": "3", "job": "71_2"}, foreign_stale_s=limit_s)
    if kind == LEASE:
        return filelock.SoftFileLease(path, lease_duration=limit_s, timeout=timeout_s)
    if kind == STRICT:
        return filelock.StrictSoftFileLock(path, timeout=timeout_s)
    if kind == LIFETIME:
        with warnings.catch_warnings():  # that lifetime can overlap a live holder: a thing tested here
            warnings.simplefilter("ignore", filelock.SoftFileLockLifetimeWarning)
            return filelock.SoftFileLock(path, timeout=timeout_s, lifetime=limit_s)
    raise ValueError(kind)


def hold_main() -> None:
    """The holder process: take the lock, say so, then hold it until killed."""
    kind, path, limit_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    lock = make_lock(kind, path, limit_s, 5)  # kept: filelock lets go of a lock it collects
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
