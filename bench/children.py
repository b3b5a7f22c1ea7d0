"""Benchmark children: a bench that measures each variant in a fresh interpreter (nothing warm
from another variant: imports, jax's caches, the GIL's holders) runs itself with ``--child`` and
reads back the one ``RESULT {json}`` line the child prints (``report``). The child's hidden
arguments (``--child VARIANT --work DIR [--extra VALUE]``) are declared here too
(``add_child_arguments``), so the parent's command line and the child's parser cannot drift."""

from __future__ import annotations

import argparse
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


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden arguments a bench's child is run with (``run_child``)."""
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--extra", help=argparse.SUPPRESS)


def run_child(module: str, variant: str, work: Path, extra: str | None = None) -> dict[str, Any]:
    """Run ``python -m MODULE --child VARIANT --work WORK [--extra EXTRA]`` from the checkout and
    return what it reported; stop the bench, with the child's stderr, when it fails."""
    args = ["--child", variant, "--work", str(work), *(("--extra", extra) if extra else ())]
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise SystemExit(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith(PREFIX))
    return json.loads(line[len(PREFIX) :])
