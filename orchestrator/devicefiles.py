"""A path that names a device (/dev/zero, /dev/full, a terminal), whose reading never ends or
never comes: every reader of a file a user names asks this first (the spec, a results
document, a sweep's files), so that such a path is one line, not a read that fills memory."""

from __future__ import annotations

import os
import stat


def not_a_file(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is where it is a device ("a device": /dev/zero, /dev/full, a terminal), whose
    reading never ends or never comes, not a file; None for anything else (a file, a pipe such as
    bash's ``<(...)``, a path that is not there: its reader says why)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else None
