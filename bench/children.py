"""Benchmark children: a bench that measures each variant in a fresh interpreter (nothing warm
from another variant: imports, jax's caches, the GIL's holders) runs itself with ``--child`` and
reads back the one ``RESULT {json}`` line the child prints (``report``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PREFIX = "RESULT "


def report(out: dict[str, Any]) -> None:
    """In the child: hand ``out`` back to the parent."""
    print(PREFIX + json.dumps(out))


def run_child(module: str, *args: str) -> dict[str, Any]:
    """Run ``python -m MODULE ARGS`` from the checkout and return what it reported; stop the
    bench, with the child's stderr, when it fails."""
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise SystemExit(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith(PREFIX))
    return json.loads(line[len(PREFIX) :])
