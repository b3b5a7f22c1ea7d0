"""Whether a sweep directory's disk still takes a write: what whoever starts units (a local run,
the debug executor, a SLURM task's workers) asks once a worker failed, since a worker on a full
disk may have had no room left for its own reason (its log is empty), and every unit started
after it would fail the same way (``FullDisk``); and what ``status`` asks of a failed unit whose
logs say nothing.

The answer is a real write (a small file, flushed to the disk, then removed), not the free
space ``statvfs`` reports: a filesystem can report a few blocks free and refuse a page (tmpfs),
and a quota is not in ``statvfs`` at all.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import PROG, word
from orchestrator.store.files import mount_point, temp_path

# about what a worker appends for a few configs: a disk without this much room fails its next unit
PROBE_BYTES = 16 * 1024
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(folder: Path) -> OSError | None:
    """The error a write of ``PROBE_BYTES`` in ``folder`` meets where its disk (or the user's
    quota on it) is full; None where the write is taken, or fails for another reason."""
    probe = temp_path(folder / "disk-probe")
    try:
        with open(probe, "xb") as f:
            f.write(bytes(PROBE_BYTES))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc if exc.errno in FULL_ERRNOS else None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return None


@dataclass
class FullDisk:
    """A sweep directory's disk as the one who starts its units sees it: probed once a worker
    failed (``disk_full``), and, once full, full for the rest of the units it was to start
    (none of them starts: each would fail the same way)."""

    root: Path
    full: OSError | None = None  # the error a write met there
    once: bool = False  # probe it once at most (a reader's view of it, ``status``)
    _probed: bool = field(default=False, init=False, repr=False)

    def probe(self) -> bool:
        """Whether the disk is full (it stays so once it was)."""
        if self.full is None and not (self.once and self._probed):
            self.full, self._probed = disk_full(self.root), True
        return self.full is not None

    def no_room(self, code: int | str, log: str = "its log is empty") -> str:
        """The reason of a worker that failed on the full disk (exit ``code``) with no word of
        its own (``log``: what its log holds)."""
        why = self.full.strerror if self.full is not None else "full"
        return (
            f"its worker could not write to the sweep directory, whose disk is full ({why}); {log} (exit code {code})"
        )

    def stopped(self, who: str, not_started: int | None = None) -> str:
        """The line of ``who`` (the run, the task) that the full disk stopped: where, what was
        kept, what to do; ``not_started``: how many units it then did not start (None: one
        unit's own line, which says it was not started)."""
        if not_started is None:
            started = f"{who} started no further unit, this one included,"
        else:
            left = f" ({not_started} unit{'s' if not_started != 1 else ''} not started)" if not_started else ""
            started = f"{who} started no further unit{left}"
        return f"{self._is_full()}: {started} and every record written is kept; {self._fix()}"

    def unsaid(self, what: str) -> str:
        """Why a unit failed whose logs say nothing (``what``: how it ended), where the disk is
        full: a full disk takes no reason, and fails every unit run on it."""
        return f"{what}, with no word in its logs, and {self._is_full()}: {self._fix()}"

    def _is_full(self) -> str:
        why = self.full.strerror if self.full is not None else "full"
        return f"the disk of {self.root} (the filesystem at {mount_point(self.root)}) is full ({why})"

    def _fix(self) -> str:
        return f"free space on it (or raise the quota), then `{PROG} resume {word(self.root)}` runs what is missing"
