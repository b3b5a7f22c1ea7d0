"""Reused records in the sweep directory: one more unit, written at plan time.

Where carried records live: ``write_reuse_unit`` writes them, at plan time, as one more unit
of the sweep (origin ``reuse`` in ``units.json``), with its partial (a header naming the
sources, then one record line per reused item, each record saying ``reused_from``) and its
completion marker, before the unit enters the index. So every reader treats them as it treats
measured records, with no special case: status counts the unit done, the merger (and the final
merge job on SLURM) merges its partial, resume finds its items recorded, round 2 of halving
reads them as screens or full records, and a document appended into (or a table exported from
several documents) ranks them by the newest rule at the time their source measured them
(``reuse.json``'s ``measured``, kept in the document's reuse block). The header's environment
is the one the records were checked against: if the workers turn out to run elsewhere, the merger quarantines
the unit's partial (its environment differs from ``env.json``) and resume measures its items.
``reuse.json`` in the sweep directory says what was reused from where and what was not, and why.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from orchestrator.planning import Unit, WorkItem
from orchestrator.store.carry import carried_records, flags_of, source_of
from orchestrator.store.filekinds import holds_file
from orchestrator.store.files import atomic_open, atomic_write_json, now_iso, read_json
from orchestrator.store.lines import encode_line, header_line, partial_header, record_line
from orchestrator.store.markers import reuse_summary, write_marker
from orchestrator.store.partials import read_partial
from orchestrator.store.reuse import Found
from orchestrator.store.sweepdir import SweepDir

REUSE_FILE = "reuse.json"
ORIGIN = "reuse"


def reuse_unit(items: list[WorkItem], found: Found, index: int, sweep: str) -> Unit:
    """The unit that holds the reused items (plan order); its id (``unit_id``) hashes the
    sweep's fingerprint ``sweep`` and them, marked reuse."""
    unit = Unit(index, [it for it in items if it.index in found.records])
    unit.finalize(sweep, tag=ORIGIN)
    return unit


def write_reuse_unit(sd: SweepDir, unit: Unit, found: Found) -> None:
    """The reuse unit's partial and completion marker, then its place in the index (the caller
    holds the sweep's lock), and ``reuse.json``."""
    header = partial_header(
        unit=unit.id,
        sweep=sd.spec.fingerprint(),
        attempt=1,
        device={"device_kind": (found.env or {}).get("device_kind")},
        env=found.env,
        host=socket.gethostname(),
        pid=os.getpid(),
        slurm_job_id=None,
        started=now_iso(),
        reuse={c.path: c.reused for c in found.sources if c.reused},
    )
    records = [found.records[it.index][0] for it in unit.items]
    sources: dict[str, str] = {}  # the measurements carried (``reused_from``) -> their source
    with atomic_open(sd.partial_path(unit.id)) as f:
        f.write(encode_line(header_line(header)) + "\n")
        for it, rec in zip(unit.items, carried_records(records), strict=True):  # read a batch at a time
            f.write(encode_line(record_line(it.id, 1, dict(rec))) + "\n")
            sources[str(rec["reused_from"])] = found.records[it.index][1]
    flags = [flags_of(rec) for rec in records]
    errors = sum(error for _, error in flags)
    screened = sum(screened for screened, _ in flags)
    summary = reuse_summary(unit.id, records=len(records), errors=errors, screened=screened)
    write_marker(sd, summary, records=len(records), errors=errors)
    sd.add_units([unit], origin=ORIGIN)
    summary_file = {
        "unit": unit.id,
        "created": now_iso(),
        **found.summary(),
        "measured": found.measured(sources),
    }
    atomic_write_json(sd.root / REUSE_FILE, summary_file, indent=1)


def read_summary(sd: SweepDir) -> dict[str, Any] | None:
    """What planning reused (``reuse.json``), or None where nothing was."""
    path = sd.root / REUSE_FILE
    if not holds_file(path):
        return None
    data = read_json(path, "reuse summary")
    return data if isinstance(data, dict) else None


def carried_from_output(sd: SweepDir, out: Path) -> bool:
    """Whether the sweep's plan carried records from its own output document ``out`` (``reuse.json``
    names it among the sources it reused from) and that document is still as the plan read it
    (not changed since ``reuse.json`` was written): the records it holds are those this sweep
    carried, as the sweep that measured them merged them, not another sweep's in this sweep's place."""
    summary = read_summary(sd)
    sources = summary.get("sources") if summary is not None else None
    if not isinstance(sources, list):
        return False
    named = [s for s in sources if isinstance(s, dict) and s.get("reused")]
    try:
        same = any(os.path.samefile(str(s.get("path")), out) for s in named)
        return same and out.stat().st_mtime_ns <= (sd.root / REUSE_FILE).stat().st_mtime_ns
    except OSError:
        return False


def carried_ids(sd: SweepDir) -> set[str]:
    """The ids of the items the sweep's reuse unit carries for good, which no worker measures:
    its records but screens (halving's round 2, or a screened search's, may time a carried
    screen in full); none where the merger quarantined its partial (resume measures its items)."""
    ids: set[str] = set()
    for entry in sd.unit_index():
        if entry.get("origin") == ORIGIN:
            content = read_partial(sd.partial_path(entry["id"]), warn=False)
            ids.update(iid for iid, (_, rec) in content.records.items() if not flags_of(rec)[0])
    return ids


def carried_from(sd: SweepDir) -> dict[str, str]:
    """The items the sweep's reuse unit carries a record of (screens too), each with the document
    that measured it (``carry.source_of`` its ``reused_from``): what the kept plan's
    ``plan --dry-run --json`` says of them."""
    out: dict[str, str] = {}
    for entry in sd.unit_index():
        if entry.get("origin") == ORIGIN:
            content = read_partial(sd.partial_path(entry["id"]), warn=False)
            for iid, (_, rec) in content.records.items():
                reused_from = rec.get("reused_from")
                if isinstance(reused_from, str):
                    out[iid] = source_of(reused_from)
    return out


def found_ids(items: list[WorkItem], found: Found) -> set[str]:
    """``carried_ids`` of a plan not written yet: the ids of the ``items`` whose record ``found``
    carries for good (a screen aside)."""
    return {it.id for it in items if it.index in found.records and not flags_of(found.records[it.index][0])[0]}
