"""What a merge checks of the file it writes: which file an output names (a link's target), the
outputs it refuses before it reads a partial (a directory, a device, the spec file the sweep was
planned from, a file of the sweep directory itself, a folder that takes no new file), the
document refused before anything runs (one holding records not the sweep's: ``check_target``,
which ``run``, ``submit``, ``resume`` and ``wait`` ask), and what to say of the merge cache's
space where a full disk stopped the document."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from orchestrator import PROG, word
from orchestrator.devicefiles import what_it_is
from orchestrator.errors import ResultsError
from orchestrator.store.files import folder_refuses, link_target
from orchestrator.store.page_file import page_path, page_target
from orchestrator.store.segments import CACHE_DIR
from orchestrator.store.sweep_paths import is_spec_file, own_file
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.target import inspect, refuse_foreign


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


def check_target(
    sd: SweepDir, output: Path | None = None, *, overwrite: str | None = None, elsewhere: str | None = None
) -> None:
    """Refuse early what ``merge`` would refuse: an output holding records that are not this
    sweep's (``run`` asks before it runs anything; ``overwrite``: how the caller replaces it,
    where not by ``--overwrite``; ``elsewhere``: how it writes another file, where not by
    ``merge --output``: ``ANOTHER_OUTPUT`` for the commands that take ``--output``). Append
    merges keep every record: no check."""
    out = Path(output) if output is not None else sd.output
    if sd.spec.report.html:
        page_target(page_path(out))
    if not (sd.spec.append and out.exists()):
        target = inspect(sd, out)
        if target.n_foreign or target.not_a_document:
            where = elsewhere or merge_elsewhere(sd)
            refuse_foreign(target, elsewhere=where, **({"overwrite": overwrite} if overwrite else {}))


# how `run` and `submit`, which take --output, write the results document elsewhere
ANOTHER_OUTPUT = "another `--output FILE`"


def merge_elsewhere(sd: SweepDir) -> str:
    """How a merge of ``sd`` writes its records into another file than its output."""
    return f"`{PROG} merge {word(sd.root)} --output FILE`"
