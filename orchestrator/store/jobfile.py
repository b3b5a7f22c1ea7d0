"""``jobs.jsonl``: a sweep's submission history, one JSON line per job of a unit and per event
(a resume, a cancel, a merge job), appended and fsynced, read by ``control.history``. Its log
paths are read as paths in the sweep directory as it is now: one written under another root
(the directory was moved or copied) or relative to where the command that wrote it ran (a
relative ``--sweep-dir``) is the file of the same name in its ``logs/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.store.files import naming, open_append, read_file
from orchestrator.store.jsonline import loads

FILE = "jobs.jsonl"
_LOG_KEYS = ("log", "stderr", "stdout")


def append(root: Path, entries: list[dict[str, Any]]) -> None:
    """Append ``entries`` to the sweep's history, one line each, fsynced."""
    path = root / FILE
    with naming(path), open_append(path) as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read(root: Path, logs: Path) -> list[dict[str, Any]]:
    """The history's lines (none: no file; a torn last line after a crash, or a line that is
    no object, skipped), their log paths taken to ``logs`` where the directory was moved or
    copied since they were written."""
    path = root / FILE
    if not path.exists():
        return []
    out = []
    here = os.fspath(root.absolute())
    for line in read_file(path).splitlines():
        try:
            entry = loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        for key in _LOG_KEYS:
            if isinstance(entry.get(key), str):
                entry[key] = _here(entry[key], here, logs)
        out.append(entry)
    return out


def _here(log: str, root: str, logs: Path) -> str:
    """``log`` as a path in the directory at ``root`` (module docstring)."""
    if os.path.isabs(log) and log.startswith(root + os.sep):
        return log
    _, sep, rest = (os.sep + log).rpartition(f"{os.sep}logs{os.sep}")
    return os.fspath(logs.absolute() / rest) if sep else log
