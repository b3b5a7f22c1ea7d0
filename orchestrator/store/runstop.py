"""Why the last run here of a sweep stopped on a full disk (``SWEEP/run-stop.json``): the fact
``status`` reads to say so, where it would otherwise see only a worker process gone.

A full disk takes no new write, so the note's room is taken while there is some: a run that
starts workers here writes the file first, padded to ``RESERVED`` bytes and flushed to the disk,
and once a full disk stops it, the run writes its reason over those same bytes in place, which
asks the filesystem for no new block. A run that ends otherwise removes the file (a removal
needs no room either). On a filesystem that copies on every write (btrfs, ZFS) a full disk may
refuse even that: the run logs it, and status says only what the workers' logs say.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import PROG, word
from orchestrator.store.files import atomic_open, now_iso, read_file

log = logging.getLogger(__name__)

RUN_STOP_FILE = "run-stop.json"
RESERVED = 4096  # one page: a stop's reason, the sweep's mount point and the failed units' jobs
DISK_FULL = "disk full"


@dataclass
class RunStop:
    """A run stopped on its sweep directory's full disk: the error the disk's write met, the
    filesystem's mount point, and unit -> the job (local process) that failed there."""

    root: Path
    error: str
    mount: str
    failed: dict[str, str] = field(default_factory=dict)
    not_started: int = 0
    at: float = 0.0  # when it stopped (epoch seconds): a job submitted since ran after it

    def where(self) -> str:
        return f"the disk of {self.root} (the filesystem at {self.mount})"

    def advice(self) -> str:
        """What finishes the sweep: free space, then resume."""
        return f"free space on it (or raise the quota), then `{PROG} resume {word(self.root)}` runs what is missing"

    def line(self) -> str:
        """What ``status`` says of the stop: what the run said when it stopped."""
        return f"the last run stopped: {self.where()} was full ({self.error}); {self.advice()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "stopped": DISK_FULL,
            "error": self.error,
            "mount": self.mount,
            "at": self.at,
            "stopped_at": _dt.datetime.fromtimestamp(self.at, _dt.UTC).isoformat(timespec="seconds"),
            "not_started": self.not_started,
            "failed": self.failed,
        }


class StopNote:
    """The room a run took for its note: ``stopped`` writes over it, ``discard`` removes it."""

    def __init__(self, root: Path) -> None:
        self.path = root / RUN_STOP_FILE
        self.reserved = False

    def reserve(self) -> None:
        """Take the note's room while the disk has some (a run starting); where it has none,
        log it: the run's own stop line still says what happened."""
        try:
            with atomic_open(self.path, "wb") as f:
                f.write(_padded({"stopped": None, "started": now_iso()}))
            self.reserved = True
        except OSError as exc:
            log.warning("no room for %s (%s): status will not know why the run stopped", self.path, exc.strerror)

    def stopped(self, stop: RunStop) -> None:
        """Write the stop over the reserved bytes, in place (units' jobs dropped that do not fit)."""
        if not self.reserved:
            return
        data = stop.to_json()
        while len(json.dumps(data)) > RESERVED - 1 and data["failed"]:
            data["failed"] = dict(list(data["failed"].items())[:-1])
        try:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, _padded(data), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("could not note in %s why the run stopped (%s)", self.path, exc.strerror)

    def discard(self) -> None:
        """The run ended without a full disk stopping it: no note is left behind."""
        if self.reserved:
            try:
                self.path.unlink()
            except OSError:
                pass


def _padded(data: dict[str, Any]) -> bytes:
    text = json.dumps(data).encode()
    return text + b" " * (RESERVED - 1 - len(text)) + b"\n"


def read_stop(root: Path) -> RunStop | None:
    """The stop the last run here noted, where a full disk stopped it; None otherwise (no note,
    a run still running or killed before it could say, a damaged note)."""
    try:
        data = json.loads(read_file(root / RUN_STOP_FILE))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("stopped") != DISK_FULL or not isinstance(data.get("at"), float):
        return None
    failed = data.get("failed")
    return RunStop(
        root=root,
        error=str(data.get("error")),
        mount=str(data.get("mount")),
        failed={str(k): str(v) for k, v in failed.items()} if isinstance(failed, dict) else {},
        not_started=int(data.get("not_started") or 0),
        at=float(data.get("at") or 0.0),
    )
