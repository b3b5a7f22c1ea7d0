"""Where a spec's sweep directory is by default, which files are a sweep directory's own
(``own_file``: an output must be none of them), and what to say when a command that reads a
sweep directory is given a file instead; ``log_folder``: the folder its workers log to, made
before a worker starts, or a file in its place said in one line; ``check_takes_files``: a planned
sweep directory that takes no new file (a read-only mount), said before anything in it.

The common slip is a spec file (``tilesweep status sweep.json``, after ``tilesweep run
sweep.json``): the answer names the sweep directory that spec runs in by default, when it is
there. A results document names the sweep directory it was merged from (its ``tilesweep``
block). Anything else gets the plain answer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import PROG, word
from orchestrator.errors import SweepDirError, TilesweepError
from orchestrator.store.files import read_file

if TYPE_CHECKING:
    from orchestrator.spec.model import SweepSpec


def default_root(spec_path: str, spec: SweepSpec) -> Path:
    """``sweeps/<spec name>-<fingerprint>``: the same spec always finds its own directory."""
    return Path("sweeps") / f"{Path(spec_path).stem}-{spec.fingerprint()[:8]}"


LISTED = f"`{PROG} ls` lists the sweep directories under a folder"
NAME_ONE = f"pass a sweep directory that `{PROG} run`, `plan` or `submit` made (its --sweep-dir)"


def file_given(path: Path) -> str:
    """The one-line message for ``path``, a file passed where a sweep directory goes."""
    from orchestrator.spec.files import load_spec

    merged_from = _merged_from(path)
    if merged_from is not None:
        return (
            f"{path} is a results document, not a sweep directory; "
            f"pass the sweep directory it was merged from: {merged_from}"
        )
    try:
        spec = load_spec(path)
    except TilesweepError:
        return f"{path} is a file, not a sweep directory; {NAME_ONE} ({LISTED})"
    guess = default_root(str(path), spec)
    if guess.is_dir():
        return (
            f"{path} is a spec file, not a sweep directory; pass the sweep directory it ran in: {guess} "
            f"(where `{PROG} run` and `{PROG} submit` put it without --sweep-dir)"
        )
    return (
        f"{path} is a spec file, not a sweep directory; pass the --sweep-dir it was run with (without one, "
        f"`{PROG} run` and `{PROG} submit` use {guess}, which does not exist here; {LISTED})"
    )


def _merged_from(path: Path) -> str | None:
    """The sweep directory a results document names, or None where ``path`` is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or "results" not in data:
        return None
    block = data.get("tilesweep")
    where = block.get("sweep_dir") if isinstance(block, dict) else None
    return str(where) if where else "(its tilesweep block names none)"


# The folders ``SweepDir.create`` makes first, then an empty unit index, then ``sweep.json``, last
FOLDERS = ("units", "partials", "done", "logs")
# What it writes before ``sweep.json``: those folders, empty, and the index (``.keep``: a folder kept
# in version control)
_SKELETON = {*FOLDERS, "units.json", ".keep"}


def unused(root: Path) -> bool:
    """Empty, or only what a ``create`` interrupted before its sweep.json left (empty folders,
    an empty unit index): safe to create the sweep in."""
    for p in root.iterdir():
        if p.name not in _SKELETON or (p.is_dir() and any(p.iterdir())):
            return False
        if p.name == "units.json" and read_file(p).decode("utf-8", "replace").strip() not in ("", "[]"):
            return False
    return True


def cut_short(root: Path) -> bool:
    """Whether the folder ``root`` holds a plan cut short (a Ctrl-C of ``run``, ``plan`` or
    ``submit`` while it planned) before its ``sweep.json`` was written: no ``sweep.json``, the
    folders a plan makes first, empty, and nothing but an empty unit index beside them."""
    return not (root / "sweep.json").exists() and all((root / f).is_dir() for f in FOLDERS) and unused(root)


def finish_command(root: Path, spec: str | None = None) -> str:
    """The commands that finish the plan cut short in ``root`` (the one that started it, run again);
    ``spec``: its spec file, where its ``sweep.json`` names it (SPEC otherwise)."""
    spelled = word(spec) if spec else "SPEC"
    return (
        f"`{PROG} run {spelled} --sweep-dir {word(root)}` (or `{PROG} plan` or `{PROG} submit` with that --sweep-dir)"
    )


# A plan cut short after its ``sweep.json`` was written, before its units were: ``SweepDir.create``
# writes the empty unit index first, and a plan's units are added to it last, so a sweep directory
# whose index is empty is one, which the command that started it, run again, finishes (it plans the
# units of a directory so reopened, as it would a new one's)
UNITS_CUT_SHORT = "a plan cut short before its units were written (units.json is empty)"


def no_sweep_file(root: Path) -> str:
    """Why the folder ``root``, which holds no ``sweep.json``, is read as no sweep: a plan cut short
    before it was written whole (``cut_short``), which the command that started it, run again,
    finishes, or a folder no command made."""
    if cut_short(root):
        return (
            f"{root} holds a plan that was interrupted before it was written whole (no sweep.json yet); "
            f"run the command that started it again to finish it: {finish_command(root)}"
        )
    return f"{root} is not a sweep directory (no sweep.json); {NAME_ONE}"


# The files a sweep directory keeps at its top level (its folders hold its own files only).
_OWN_FILES = frozenset(
    {
        "sweep.json",
        "units.json",
        "jobs.jsonl",
        "env.json",
        "sweep.lock",
        "run.lease",
        "lowering.lease",
        "final-merge.json",
        "reuse.json",
        "round2.json",
        "run-stop.json",
        "status-tally.json",
        "tokamax-grid.json",
        "lowering.jsonl",
        "quarantine.jsonl",
    }
)


def own_file(root: Path, path: Path) -> bool:
    """Whether ``path`` is (or would be) a file of the sweep directory ``root`` itself: anything
    in one of its folders, or a file its top level keeps. A results document written there would
    replace it, or be taken for it."""
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return len(rel.parts) > 1 or rel.name in _OWN_FILES or rel.name.startswith("lowering-task")


def sweep_holding(path: Path) -> Path | None:
    """The sweep directory ``path`` is (or would be) a file of (``own_file``): the nearest folder
    above it that holds a ``sweep.json``, where ``path`` is one of its own files; None otherwise.
    For an output no command may write there (``export --out``, ``report --html``)."""
    for folder in Path(os.path.abspath(path)).parents:
        if (folder / "sweep.json").is_file():
            return folder if own_file(folder, path) else None
    return None


def is_spec_file(path: Path, spec_path: str | Path | None) -> bool:
    """Whether ``path`` is the spec file ``spec_path`` (the same file, through a link or another
    spelling) and holds a spec, not a results document: a results document written there would
    replace the spec the sweep runs. A results document given as the spec is the sweep's own
    document, which its merge replaces as it should (read only where the two are one file)."""
    if spec_path is None:
        return False
    try:
        if not (path.exists() and Path(spec_path).exists() and path.samefile(spec_path)):
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):  # unreadable, or not JSON (a TOML spec)
        return True
    return not (isinstance(data, dict) and {"config", "results"} <= data.keys())


def log_folder(logs: Path) -> Path:
    """A sweep's logs folder (``SweepDir.logs``), made where it is missing, before a worker is
    started or submitted that writes there; one that cannot be (a file in its place) is a
    ``SweepDirError`` naming it and the fix."""
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file, or a link to nothing, where the folder belongs
        what = "a link to nothing" if logs.is_symlink() and not logs.exists() else "a file"
        raise SweepDirError(
            f"{logs} is {what}, where the sweep keeps its workers' logs: move it away (or put the folder back) "
            "and run the command again"
        ) from None
    return logs


def check_takes_files(root: Path) -> None:
    """Refuse a planned sweep directory that takes no new file (a read-only mount, a folder not
    this user's, an immutable one) in one line naming it: its workers, its lowering and its merge
    all write into it, so it is the first thing to fix, before what is in it (its compile cache)."""
    from orchestrator.store.files import folder_refuses, mount_point

    refused = folder_refuses(root / "entry")  # a file made in root itself
    if refused is None:
        return
    folder, why = refused
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        fix = f"remount the filesystem at {mount_point(folder)} read-write (it is mounted read-only)"
    else:
        fix = "make it writable (chmod, or chattr -i where it is immutable)"
    raise SweepDirError(
        f"the sweep directory {folder} takes no new files ({why}), so no worker, lowering or merge could write in it; "
        f"{fix}, or copy it to a folder you can write and pass that as the sweep directory"
    )
