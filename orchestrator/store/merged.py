"""Whether a sweep's results document holds what its partials hold now: what ``status`` says
of a complete sweep whose ``run`` was killed before its merge, or whose merge failed.

The merger's output stamp (``target.write_stamp``) keeps, beside the document it wrote, how
many bytes of each partial it read. Partials are only appended to, so while the document is
that merge's output, unchanged, it holds every record of a partial still of that size (a copy
of the sweep directory too: new mtimes, same bytes); a partial that grew or appeared since
holds records it lacks. Where the document changed since (another sweep appended into it, or
replaced it: two specs naming one output) or no stamp says what was read (the merge cache was
deleted), it holds this sweep's records only where it says so (``target.holds_sweep``: its key
index, or its tilesweep blocks, which an append keeps), and then those of every partial last
written before it. Status already stats each partial, so this costs one stat of the document
and one read of the stamps, and the document's head where a merge of another sweep wrote it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from orchestrator.store.files import link_target
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.target import holds_sweep, wrote_last


def output_of(sd: SweepDir) -> Path:
    """The file the sweep's merge writes: its output, or a link's target (``merge_output``)."""
    return link_target(sd.output)


def document_current(sd: SweepDir, partials: Mapping[str, tuple[int, int]]) -> bool:
    """Whether the sweep's document exists and holds what ``partials`` (unit -> its partial's
    size and mtime in ns, for each partial there is) hold now."""
    out = output_of(sd)
    try:
        written_ns = os.stat(out).st_mtime_ns
    except OSError:
        return False
    stamp = wrote_last(sd, out)
    read = stamp.get("read") if stamp is not None else None
    if isinstance(read, dict):
        return all(read.get(uid) == size for uid, (size, _) in partials.items())
    return all(mtime_ns <= written_ns for _, mtime_ns in partials.values()) and holds_sweep(sd, out)
