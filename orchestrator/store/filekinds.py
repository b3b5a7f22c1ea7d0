"""A sweep directory's entries that are no file and no folder: a named pipe (whose reading waits
for a writer for ever), a device (/dev/zero: a reading that never ends), a socket, or a link to
one. Every reader of a sweep directory's files opens them through ``files.open_file`` (every
appender through ``files.open_append``), which opens without waiting and refuses one by
``fstat`` at the read itself; a file opened by what does not check it (filelock's lock file) is
``refuse_odd``-checked first. So a ``mkfifo`` in a sweep directory is one line naming it, never a
command that hangs, at the cost of what a command reads, never of the directory's size."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator import word
from orchestrator.devicefiles import kind_of
from orchestrator.errors import SweepDirError


def odd_kind(mode: int) -> str | None:
    """What a file of ``mode`` is where it is neither a regular file nor a folder (``devicefiles``'
    words: "a named pipe", "a device", "a socket"); None where it is one."""
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else kind_of(mode)


def refusal(path: Path, what: str) -> SweepDirError:
    """The one line for ``path``, a file of a sweep directory that is ``what`` (``odd_kind``)."""
    return SweepDirError(f"{path} is {what}, where a sweep directory holds a file: remove it (`rm {word(path)}`)")


def holds_file(path: Path) -> bool:
    """Whether ``path`` (a link followed) is a regular file to read: False where nothing, or a
    folder, is there; ``refusal`` where it is a pipe, a device or a socket, which ``is_file()``
    would pass over as if no file were there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    what = odd_kind(mode)
    if what is not None:
        raise refusal(path, what)
    return stat.S_ISREG(mode)


def refuse_odd(path: Path) -> None:
    """Raise ``refusal`` where ``path`` (a link followed) is a pipe, a device or a socket: one
    ``stat``, for a file that is opened by what does not check it (filelock's lock file)."""
    try:
        what = odd_kind(os.stat(path).st_mode)
    except OSError:  # not there (it is made), or a link to nothing: its opener says why
        return
    if what is not None:
        raise refusal(path, what)
