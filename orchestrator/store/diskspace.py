"""Whether a sweep directory's disk still takes a write: what a local run asks once a worker
failed, since a worker on a full disk may have had no room left for its own reason (its log is
empty), and every unit started after it would fail the same way.

The answer is a real write (a small file, flushed to the disk, then removed), not the free
space ``statvfs`` reports: a filesystem can report a few blocks free and refuse a page (tmpfs),
and a quota is not in ``statvfs`` at all.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from orchestrator.store.files import temp_path

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


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem ``path`` is on (what ``df`` names)."""
    path = path.absolute()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path
