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


def what_it_is(path: str | os.PathLike[str]) -> str:
    """What ``path`` is (a link followed), as a line that refuses it names it: "a directory", "a
    device" (/dev/null, a terminal), "a named pipe", "a socket", "a file" (a regular one);
    "nothing" where there is nothing there to look at."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "nothing"
    return kind_of(mode)


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in ``what_it_is``'s words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a file"
