"""Assertions several test files share."""

from __future__ import annotations

import subprocess


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """A user error as the CLI must report it: exit code 2, exactly one line on stderr, no
    traceback, and the line names each of ``needles``. Returns the line."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
