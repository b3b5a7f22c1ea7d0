"""The files that ``report --html``, ``compare --html`` and ``export --out`` write: each is
refused, before anything is read or written, where writing it would destroy data the user has.

A path is refused when it names no file (empty, or ending in a slash), is one of the command's
own inputs, a directory, something other than a regular file (a device such as /dev/null, a
named pipe: the file is written beside and renamed into place, which would replace the device
itself), or an existing file that is not of the kind the command writes (a results document, a
spec, a log): overwriting one of those is a slip of the keyboard far more often than an intent.
An existing file of the kind written (an earlier page, an earlier tuned table) and an empty file
are replaced. A symbolic link is followed: the file it points to is written, the link stays.
A folder of the path that does not exist yet is made (``common.MAKES_FOLDERS``), as for every output
tilesweep writes (``--output``, ``--plots``): the line that says what was written names the path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from kernels.spelling import as_json
from kernels.tokamax_meta import holds_table
from orchestrator.cli.common import names_no_file
from orchestrator.devicefiles import what_it_is
from orchestrator.errors import TilesweepError
from orchestrator.store.files import folder_refuses, same_file, write_advice
from orchestrator.store.sweep_paths import sweep_holding


def is_tuned_table(path: Path) -> bool:
    """Whether ``path`` holds a tuned table (what ``export`` writes)."""
    from orchestrator.analysis.export import FORMAT

    try:
        obj = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("format") == FORMAT


def is_tokamax_table(path: Path) -> bool:
    """Whether ``path`` holds one of tokamax's autotuning tables (``export --format tokamax``):
    a JSON object whose keys are tokamax's keys of a problem."""
    try:
        obj = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return False
    return holds_table(obj) or obj == {}


def refuse_unwritable(flag: str, given: str, target: Path, *, instead: str, another: str) -> None:
    """Refuse, before the command reads or prints anything, an output path where no file could
    be made (``files.folder_refuses``): its folder is a file (``instead``: what to name), or
    takes no new files (``another``: what to name where it cannot be made writable)."""
    refused = folder_refuses(target)
    if refused is None:
        return
    folder, why = refused
    if why is None:
        raise TilesweepError(f"{flag} {given}: {folder} is not a directory; {instead}")
    raise TilesweepError(
        f"{flag} {given}: the folder {folder} takes no new files ({why}); make it writable or {another}"
    )


def check_output(out: str, inputs: Sequence[str], *, writes: str, flag: str, of_kind: Callable[[Path], bool]) -> str:
    """The path to write ``writes`` at for ``out`` (a link's target where ``out`` is a symbolic
    link); refused (a one-line ``TilesweepError``) where writing there would replace one of
    ``inputs``, a directory, a device or a pipe, or a file of another kind than ``of_kind``
    accepts, and where ``out`` names no file or is ``-``."""
    if names_no_file(out):
        raise TilesweepError(f"{flag} {as_json(out)} names no file; name a file for the {writes}")
    if out == "-":  # a file of that name would be made: the shells' standard output is meant
        raise TilesweepError(f"{flag} - : the {writes} is written to a file, not to standard output; name a file")
    path = Path(os.path.realpath(out)) if os.path.islink(out) else Path(out)
    for given in inputs:
        if same_file(path, Path(given)):
            raise TilesweepError(
                f"{flag} {out} is a results document this command reads; name another file for the {writes}"
            )
    sweep = sweep_holding(path)
    if sweep is not None:
        raise TilesweepError(
            f"{flag} {out} is a file of the sweep directory {sweep} (or in one of its folders), which the {writes} "
            "would replace or be taken for; name a file outside it"
        )
    if path.is_dir():
        raise TilesweepError(f"{flag} {out} is a directory; name a file for the {writes}")
    refuse_unwritable(flag, out, path, instead="name a file in a folder", another="name another file")
    if not path.exists():
        return str(path)
    if not path.is_file():
        raise TilesweepError(
            f"{flag} {out} is {what_it_is(path)}, not a regular file, which writing the {writes} would replace; "
            "name a regular file"
        )
    try:
        if path.stat().st_size == 0 or of_kind(path):
            return str(path)
    except OSError as exc:
        raise TilesweepError(f"{flag} {out}: cannot read it ({exc.strerror or exc}); name another file") from None
    raise TilesweepError(
        f"{flag} {out} exists and is not a {writes}, so writing would destroy it; "
        "name another file, or remove it first if it is to go"
    )


def write_failed(out: str, writes: str, exc: OSError) -> str:
    """One line for a write of ``writes`` to ``out`` that failed (a full disk, a quota, a mount gone
    read-only): why, and what to do before the same command runs again (``files.write_advice``)."""
    return f"{out}: cannot write {writes} ({exc.strerror or exc}): {write_advice(exc)}, then export again"
