"""A sweep directory's entries that are no file and no folder: a named pipe (whose reading waits
for a writer for ever), a device (/dev/zero: a reading that never ends), a socket, or a link to
one. ``SweepDir.open`` looks through the whole directory for one before any command reads a file
of it (``refuse_odd_entries``), and ``files.open_file`` refuses one at the read itself, so a
``mkfifo`` in a sweep directory is one line naming it, never a command that hangs."""

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


def refuse_odd_entries(root: Path) -> None:
    """Raise ``refusal`` for the first entry under the sweep directory ``root`` (its folders
    included, a link followed to what it names) that no reader may open: one ``scandir`` per
    folder, which reads each entry's kind without opening or stat-ing it."""
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:  # not a folder, or not readable: the reader that needs it says why
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
                continue
            if entry.is_file(follow_symlinks=False):
                continue
            try:  # a link (to what it names) or an odd entry
                what = odd_kind(os.stat(entry.path).st_mode)
            except OSError:  # a link to nothing: its reader says it is missing
                continue
            if what is not None:
                raise refusal(Path(entry.path), what)
