"""The files that ``report --html``, ``compare --html`` and ``export --out`` write: each is
refused, before anything is read or written, where writing it would destroy data the user has.

A path is refused when it is one of the command's own inputs, a directory, or an existing file
that is not of the kind the command writes (a results document, a spec, a log): overwriting one
of those is a slip of the keyboard far more often than an intent. An existing file of the kind
written (an earlier page, an earlier tuned table) and an empty file are replaced.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.errors import TilesweepError

# how much of an existing page is read to tell it is a page
_HEAD_BYTES = 512


def is_page(path: Path) -> bool:
    """Whether ``path`` holds an HTML page (what ``--html`` writes)."""
    with path.open("rb") as f:
        head = f.read(_HEAD_BYTES).lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html"))


def is_tuned_table(path: Path) -> bool:
    """Whether ``path`` holds a tuned table (what ``export`` writes)."""
    from orchestrator.analysis.export import FORMAT

    try:
        obj = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("format") == FORMAT


def check_output(out: str, inputs: Sequence[str], *, writes: str, flag: str, of_kind: Callable[[Path], bool]) -> None:
    """Refuse ``out`` (a one-line ``TilesweepError``) where writing ``writes`` there would
    replace one of ``inputs``, a directory, or a file of another kind than ``of_kind`` accepts."""
    path = Path(out)
    for given in inputs:
        if _same_file(path, Path(given)):
            raise TilesweepError(
                f"{flag} {out} is a results document this command reads; name another file for the {writes}"
            )
    if path.is_dir():
        raise TilesweepError(f"{flag} {out} is a directory; name a file for the {writes}")
    if not path.is_file():
        return
    try:
        if path.stat().st_size == 0 or of_kind(path):
            return
    except OSError as exc:
        raise TilesweepError(f"{flag} {out}: cannot read it ({exc.strerror or exc}); name another file") from None
    raise TilesweepError(
        f"{flag} {out} exists and is not a {writes}, so writing would destroy it; "
        "name another file, or remove it first if it is to go"
    )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return a.resolve() == b.resolve()
