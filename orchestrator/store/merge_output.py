"""What a merge checks of the file it writes: which file an output names (a link's target), the
outputs it refuses before it reads a partial (a directory, a device, the spec file the sweep was
planned from, a file of the sweep directory itself, a folder that takes no new file), and what
to say of the merge cache's space where a full disk stopped the document."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from orchestrator import PROG, word
from orchestrator.devicefiles import what_it_is
from orchestrator.errors import ResultsError
from orchestrator.store.files import folder_refuses, link_target
from orchestrator.store.segments import CACHE_DIR
from orchestrator.store.sweep_paths import is_spec_file, own_file
from orchestrator.store.sweepdir import SweepDir


def output_file(sd: SweepDir, out: Path) -> Path:
    """The file a merge writes for ``out``: a link's target (the link stays); refused where it is a
    directory, a device, a pipe or a socket, or the sweep's spec file (the document renamed into
    place would replace it)."""
    out = link_target(out)
    if own_file(sd.root, out):
        raise ResultsError(
            f"the output {out} is a file of the sweep directory {sd.root} (or in one of its folders), which the "
            f"document would replace: merge into a file outside them (`{PROG} merge {word(sd.root)} --output FILE`)"
        )
    spec = sd.meta.get("spec_source")
    if is_spec_file(out, spec):
        raise ResultsError(
            f"the output {out} is the spec file {spec} the sweep {sd.root} was planned from, which the document "
            f"would replace: merge into another file (`{PROG} merge {word(sd.root)} --output FILE`)"
        )
    if out.is_dir():
        raise ResultsError(
            f"the output {out} is a directory, not a results document; merge into a file "
            f"(`{PROG} merge {word(sd.root)} --output FILE`)"
        )
    if out.exists() and not out.is_file():
        raise ResultsError(
            f"the output {out} is {what_it_is(out)}, not a regular file, which the merge would replace; "
            f"merge into a file (`{PROG} merge {word(sd.root)} --output FILE`)"
        )
    return out


def refuse_unwritable_folder(sd: SweepDir, out: Path) -> None:
    """Refuse an output whose folder takes no new file (read-only, immutable): the document is
    written beside it first, then renamed into place."""
    refused = folder_refuses(out)
    if refused is not None:
        folder, why = refused
        raise ResultsError(
            f"cannot write {out}: its folder {folder} takes no new files ({why or 'not a directory'}), and the "
            f"document is written beside it first; it is unchanged: make the folder writable, or merge into "
            f"another file (`{PROG} merge {word(sd.root)} --output FILE`)"
        )


def cache_space(sd: SweepDir, out: Path, exc: OSError) -> str:
    """Where a full disk stopped the document and the sweep's merge cache takes space on the same
    disk: how much, and that it is safe to delete (derived data, rebuilt by the next merge)."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return ""
    cache = sd.root / CACHE_DIR
    try:
        if os.stat(cache).st_dev != os.stat(out.parent).st_dev:
            return ""
        size = sum(p.stat().st_size for p in cache.iterdir() if p.is_file())
    except OSError:
        return ""
    if not size:
        return ""
    amount = f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{max(1, round(size / 1e3))} kB"
    return f" (the sweep's merge cache {cache} takes {amount} there, and is safe to delete)"
