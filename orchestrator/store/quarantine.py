"""Moving a partial that must not be merged out of the way, never deleting it.

Chosen over refusing the whole merge: on a sweep of hundreds of tasks one foreign or damaged
file (copied from another sweep, another jax or GPU, another tilesweep schema, or not a
partial at all) would otherwise block every merge, the final job's included, until a person
moves it by hand. Instead the merger renames it into ``SWEEP/quarantine/`` (same filesystem,
so the rename is atomic and nothing is copied or lost), logs one warning naming the file,
where it went, why, and what to do, and appends the same to ``quarantine/quarantine.jsonl``.
The unit's items then count as missing, so ``status`` shows them and ``resume`` redoes them.
Where the move itself fails (a read-only sweep directory) the merge refuses with
``PartialError`` naming the file instead: a bad file is never silently merged or skipped.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import PartialError, SweepDirError
from orchestrator.store.files import now_iso, open_append

log = logging.getLogger(__name__)

LOG_NAME = "quarantine.jsonl"


@dataclass(frozen=True)
class Quarantined:
    source: Path
    moved_to: Path
    reason: str


def quarantine_dir(sweep_root: Path) -> Path:
    return Path(sweep_root) / "quarantine"


def quarantine(sweep_root: Path, path: Path, reason: str) -> Quarantined | None:
    """Move ``path`` into the sweep's quarantine folder. None if it is already gone (another
    merger moved it first)."""
    qdir = quarantine_dir(sweep_root)
    stamp = now_iso().replace(":", "").replace("+0000", "Z")
    dest = qdir / f"{path.name}.{stamp}.{socket.gethostname()}-{os.getpid()}"
    try:
        qdir.mkdir(exist_ok=True)
        os.rename(path, dest)
    except FileNotFoundError:
        if not path.exists():
            return None
        raise PartialError(
            f"{path} cannot be merged ({reason}) and could not be moved to {qdir}; "
            f"move it out of the sweep directory, then merge again"
        ) from None
    except OSError as exc:
        raise PartialError(
            f"{path} cannot be merged ({reason}) and could not be moved to {qdir} ({exc}); "
            f"move it out of the sweep directory, then merge again"
        ) from None
    log.warning(
        "%s not merged: %s; moved to %s (nothing deleted; its unit's items count as missing, "
        "`tilesweep resume` redoes them)",
        path,
        reason,
        dest,
    )
    try:
        with open_append(qdir / LOG_NAME) as f:
            f.write(json.dumps({"time": now_iso(), "file": str(path), "moved_to": dest.name, "reason": reason}) + "\n")
    except (OSError, SweepDirError):  # the log is a note beside the moved file: the move is what counts
        pass
    return Quarantined(path, dest, reason)
