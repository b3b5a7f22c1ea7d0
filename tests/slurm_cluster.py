"""Find, or start, the local SLURM test cluster for tests that need a real one.

Tests that dispatch to SLURM call ``require_cluster()`` (directly or from a fixture). It
checks that the cluster answers (a usable node in ``sinfo`` and a working ``sacct``: submitit
polls job state with sacct, and without accounting a killed job's ``.result()`` blocks
forever) and, when it does not and we are root, starts it with ``slurm/start-local-slurm.sh``,
which is idempotent and cheap when the cluster already runs.

Without a usable cluster the test is skipped with a reason that says why and what to run.
CI sets ``TILESWEEP_REQUIRE_SLURM=1``: there a missing cluster is a failure, never a silent skip.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

REPO = Path(__file__).resolve().parents[1]
START_SCRIPT = REPO / "slurm" / "start-local-slurm.sh"
REQUIRE_ENV = "TILESWEEP_REQUIRE_SLURM"
# node states (sinfo %T, lower case, flags such as "+drain" or "*" for not responding absent)
USABLE_STATES = {"idle", "mixed", "allocated", "completing"}
START_TIMEOUT_S = 600  # a cold start installs Debian packages first
_TAIL_LINES = 25


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str] | str:
    """Run a command; on a missing binary or a timeout return the reason instead."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return f"`{cmd[0]}` is not on PATH"
    except subprocess.TimeoutExpired:
        return f"`{' '.join(cmd)}` did not answer within {timeout:.0f} s"


def _tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def probe_cluster() -> str | None:
    """None when the cluster is usable now, else why not (without trying to start it)."""
    for tool in ("sbatch", "sinfo", "sacct", "srun"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH (SLURM client tools not installed)"
    res = _run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=20)
    if isinstance(res, str):
        return res
    if res.returncode != 0:
        return f"sinfo failed (exit {res.returncode}): {_tail(res.stderr or res.stdout, 5)}"
    states = {line.split()[1] for line in res.stdout.splitlines() if len(line.split()) == 2}
    if not states & USABLE_STATES:
        shown = ", ".join(sorted(states)) or "no nodes"
        return f"no usable SLURM node (sinfo node states: {shown})"
    res = _run(["sacct", "-n", "-X", "-o", "JobID", "-S", "now"], timeout=20)
    if isinstance(res, str):
        return res
    if res.returncode != 0:
        return f"sacct does not work, so job states cannot be polled: {_tail(res.stderr, 5)}"
    return None


@functools.lru_cache(maxsize=1)
def ensure_cluster() -> str | None:
    """None when the local cluster is up and usable, else a human-readable reason.

    Starts the cluster when it is not usable and we are root. The answer is cached for the
    test session: one start attempt, not one per test.
    """
    first = probe_cluster()
    if first is None:
        return None
    if os.geteuid() != 0:
        return (
            f"{first}; not root (uid {os.geteuid()}), so the local cluster cannot be started here: "
            f"run `sudo bash slurm/start-local-slurm.sh` first"
        )
    if not START_SCRIPT.is_file():
        return f"{first}; {START_SCRIPT} is missing"
    res = _run([shutil.which("bash") or "/bin/bash", str(START_SCRIPT)], timeout=START_TIMEOUT_S)
    if isinstance(res, str):
        return f"{first}; starting the local cluster failed: {res}"
    if res.returncode != 0:
        return (
            f"{first}; `bash slurm/start-local-slurm.sh` exited {res.returncode}, last lines:\n"
            f"{_tail(res.stderr + res.stdout)}"
        )
    after = probe_cluster()
    if after is not None:
        return f"slurm/start-local-slurm.sh succeeded but the cluster is still unusable: {after}"
    return None


def require_cluster() -> None:
    """Skip the calling test (loudly) without a usable cluster; fail instead under CI.

    With ``TILESWEEP_REQUIRE_SLURM=1`` a missing cluster is a test failure, so a broken CI
    setup cannot pass by skipping every SLURM test.
    """
    reason = ensure_cluster()
    if reason is None:
        return
    message = f"local SLURM cluster unavailable: {reason}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message}\n({REQUIRE_ENV}=1, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(f"SKIPPED, NO SLURM: {message} (set {REQUIRE_ENV}=1 to make this a failure)")


def poll[T](
    predicate: Callable[[], T | None | Literal[False]], timeout_s: float, what: str, interval: float = 0.5
) -> T:
    """Call ``predicate`` until it returns something truthy (returned); fail the test after
    ``timeout_s`` naming ``what`` was awaited."""
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval)
