"""What a merge replaces: the results document already at the output, judged before it is
overwritten, so that no merge drops records it did not produce.

A merge without ``append`` writes this sweep's records only. If the document it would replace
holds records whose identity (``records.item_id``) is not an item of this sweep's plan (another
sweep appended into it, another tool wrote it, it is not a results document at all), the merge
refuses in one line, naming how many records and whose, unless the user passes ``--overwrite``.
Whose: the document's ``tilesweep`` blocks (its own and the ``earlier`` ones kept by appends)
say which sweep directory and spec fingerprint measured each unit, and records carry their
unit; a record no block claims is "not written by tilesweep".

Whenever a merge writes fewer records than the document it replaces holds (``--overwrite``, a
partial quarantined since the last merge, duplicates dropped by an append), or replaces one that
another sweep (or another tool) wrote, even with records of the same items, the old document is
kept beside the new one as ``<output>.prev`` (one generation) and the merge says so. A merge
with no record at all does not replace a document that holds records (unless ``--overwrite``).

Judging a document means knowing each record's identity, which a merge over its own previous
output need not pay (a second per million records): after writing, the merger leaves a stamp
(inode, size, mtime and record count of what it wrote) in ``SWEEP/merge-cache/``; a document
that still matches the stamp is the merger's own output, unchanged, so it holds only this
sweep's records. The key index it writes beside the document says the same where the merge
cache is gone: a merge without append claims in it that every record is an item of its plan
(``plan_of``: the sweep, its spec and its unit files as they were); a document its current
index claims for this plan as it is now holds nothing else. Anything else (replaced, appended
into, edited, planned since) is judged by the ids of its key index where that is current
(``keyindex``: only the records not of this sweep are parsed, to say whose they are), else
parsed batch by batch (``document.scan``), so judging a document never holds all its records
at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from orchestrator.errors import ResultsError
from orchestrator.spec.records import item_id
from orchestrator.store import keyindex
from orchestrator.store.document import head_of, paused_gc, read_bytes, read_head, results_bounds, scan
from orchestrator.store.files import atomic_write_json, beside, read_text, temp_path
from orchestrator.store.partials import UnitItems
from orchestrator.store.provenance import attempts_of, blocks
from orchestrator.store.segments import CACHE_DIR
from orchestrator.store.sweepdir import SweepDir

log = logging.getLogger(__name__)

STAMP_FILE = "output-stamps.json"
NOT_TILESWEEP = "not written by tilesweep"


@dataclass
class Target:
    """The file a merge would replace: how many records it holds, how many of them are not
    this sweep's (by owner), or why it is not a results document at all."""

    path: Path
    exists: bool = False
    records: int = 0
    foreign: Counter[str] = field(default_factory=Counter)
    not_a_document: str | None = None
    elsewhere: bool = False  # records measured by another sweep (or not by tilesweep): kept as .prev if replaced

    @property
    def n_foreign(self) -> int:
        return sum(self.foreign.values())


def prev_path(out: Path) -> Path:
    """Where the document a merge replaces with fewer records is kept."""
    return beside(out, "", ".prev")


def _stat_key(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


class OutputStamp(TypedDict):
    """What a merge wrote to an output (``SWEEP/merge-cache/output-stamps.json``, by path)."""

    stat: list[int] | None  # inode, size and mtime (ns) of the document written
    records: int
    read: NotRequired[dict[str, int]]  # unit -> the bytes of its partial the merge read


def _stamps(sd: SweepDir) -> dict[str, OutputStamp]:
    """The stamps as written (``inspect`` checks one before it trusts it)."""
    try:
        data = json.loads(read_text(sd.root / CACHE_DIR / STAMP_FILE))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_stamp(sd: SweepDir, out: Path, records: int, read: dict[str, int]) -> None:
    """Remember what this merge wrote to ``out`` and how much of each partial it read (derived
    data: a lost stamp costs a parse, and status judges the document by its mtime instead)."""
    stamps = _stamps(sd)
    stamps[str(out)] = {"stat": _stat_key(out), "records": records, "read": read}
    try:
        atomic_write_json(sd.root / CACHE_DIR / STAMP_FILE, stamps)
    except OSError as exc:  # a read-only sweep directory: the next merge parses the document
        log.debug("output stamp not written: %s", exc)


def wrote_last(sd: SweepDir, out: Path) -> OutputStamp | None:
    """The stamp of what a merge of this sweep wrote to ``out`` last, where ``out`` is that,
    unchanged; else None."""
    stamp = _stamps(sd).get(str(out))
    return stamp if isinstance(stamp, dict) and stamp.get("stat") == _stat_key(out) else None


def plan_of(sd: SweepDir) -> str:
    """What names this sweep's plan in its key index's claim (``keyindex.claim``): the sweep
    directory, the spec's fingerprint and each unit file by id, size and mtime, so a unit added
    or rewritten, another spec or another sweep directory names another plan."""
    units = []
    for entry in sd.unit_index():
        st = _stat_key(sd.unit_path(entry["id"]))
        units.append([entry["id"], *(st[1:] if st is not None else [])])
    text = json.dumps([str(sd.root), sd.spec.fingerprint(), units])
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def planned_ids(sd: SweepDir, units: dict[str, UnitItems] | None = None) -> set[str]:
    """Every item id of the sweep's plan, from its unit files (as the merger orders records).
    ``units``: the units' items read so far, by unit; those read here join them."""
    units = {} if units is None else units
    ids: set[str] = set()
    for entry in sd.unit_index():
        uid = entry["id"]
        items = units.get(uid)
        if items is None:
            items = units[uid] = UnitItems(sd.root, uid)
        ids.update(items.positions)
    return ids


def _owners(tilesweep: object) -> dict[object, str]:
    """unit -> which sweep measured it, from a document's tilesweep blocks (keyed as records'
    ``unit`` values are looked up, whatever their type)."""
    owners: dict[object, str] = {}
    for b in blocks(tilesweep):
        who = f"of sweep {b.get('sweep_dir')} (spec fingerprint {b.get('fingerprint')})"
        for unit in attempts_of(b):
            owners[unit] = who
    return owners


def _ours(sd: SweepDir, tilesweep: object) -> bool:
    """Whether a document's tilesweep blocks name this sweep: its directory, or its spec where
    the directory they name is not another sweep directory here (a path relative to where an
    earlier command ran, this directory moved). Another directory of the same spec measured
    the same items apart (a second run, ``--remeasure``): its document is another sweep's, kept
    as ``.prev`` when replaced."""
    me, fingerprint = str(sd.root), sd.spec.fingerprint()
    return any(
        b.get("sweep_dir") == me or (b.get("fingerprint") == fingerprint and not _another_sweep(b.get("sweep_dir"), sd))
        for b in blocks(tilesweep)
    )


def holds_sweep(sd: SweepDir, out: Path) -> bool:
    """Whether the document at ``out`` holds records of this sweep: its key index claims it for
    this plan, or its tilesweep blocks name this sweep (``_ours``; an append keeps the blocks of
    the sweeps appended into it). What status asks of a document this sweep's last merge did not
    leave as it is: another sweep of the same output may have replaced it. The head alone is
    parsed where the key index is current; a document no reader takes holds none."""
    if keyindex.claim(out, plan_of(sd)) is not None:
        return True
    index = keyindex.read(out)
    try:
        head = read_head(out, index.bounds()) if index is not None and not index.odd else scan(out).doc
    except (ResultsError, OSError):
        return False
    return _ours(sd, head.extra.get("tilesweep"))


def _another_sweep(named: object, sd: SweepDir) -> bool:
    """Whether ``named`` is a sweep directory on this machine other than ``sd``'s."""
    if not isinstance(named, str) or not os.path.isfile(os.path.join(named, "sweep.json")):
        return False
    try:
        return not os.path.samefile(named, sd.root)
    except OSError:
        return False


def inspect(sd: SweepDir, out: Path, units: dict[str, UnitItems] | None = None, plan: str | None = None) -> Target:
    """What the document at ``out`` holds, as far as a merge without append is concerned.
    ``units``: as for ``planned_ids``, so the merge after it reads no unit file twice; ``plan``:
    ``plan_of(sd)``, where the caller has it."""
    target = Target(out, exists=out.exists())
    if not target.exists:
        return target
    stamp = wrote_last(sd, out)
    if stamp is not None and type(stamp.get("records")) is int:
        target.records = stamp["records"]  # our own last output, unchanged since
        return target
    claimed = keyindex.claim(out, plan if plan is not None else plan_of(sd))
    if claimed is not None:  # our own output as far as its current index says, of this plan
        target.records = claimed
        return target
    index = keyindex.read(out)
    try:
        if index is not None and not index.odd:
            _judge_by_index(sd, target, index, units)
        else:
            _judge_by_scan(sd, target, units)
    except ResultsError as exc:
        target.not_a_document = _why_not(exc.message, out)
    return target


def _why_not(message: str, out: Path) -> str:
    """Why the reader refused ``out`` as a results document, as the refusal to merge over it says
    it: what the file is instead (a spec, a tuned table), without the advice the reader gives
    whoever passed it as a document to read, or what in it is no document."""
    what, sep, _ = message.removeprefix(f"{out} is ").partition(", not a results document")
    if sep and what != message:
        return f"it is {what}"
    return message.removeprefix(f"{out}: ").removeprefix("not a results document: ")


def _judge_by_scan(sd: SweepDir, target: Target, units: dict[str, UnitItems] | None) -> None:
    """Count the records of ``target`` not of this sweep, reading the document batch by batch."""
    scanned = scan(target.path)
    planned = planned_ids(sd, units)
    owners = _owners(scanned.doc.extra.get("tilesweep"))
    target.elsewhere = not _ours(sd, scanned.doc.extra.get("tilesweep"))
    with paused_gc():
        for batch in scanned.batches:
            target.records += len(batch)
            for rec in batch:
                try:
                    ours = item_id(rec) in planned
                except (KeyError, TypeError):  # a config field missing: not an identity of any plan
                    ours = False
                if not ours:
                    target.foreign[owners.get(rec.get("unit"), NOT_TILESWEEP)] += 1


def _judge_by_index(sd: SweepDir, target: Target, index: keyindex.KeyIndex, units: dict[str, UnitItems] | None) -> None:
    """``_judge_by_scan`` from the key index: the document's head and the records not of this
    sweep are the only parts parsed."""
    planned = planned_ids(sd, units)
    target.records = len(index.ids)
    strangers = [k for k, iid in enumerate(index.ids) if iid not in planned]
    if not strangers:  # the head alone says whose records they are: only the bytes around them are read
        target.elsewhere = not _ours(sd, read_head(target.path, index.bounds()).extra.get("tilesweep"))
        return
    name, data = read_bytes(target.path)
    bounds = results_bounds(data)
    if bounds is None:
        raise ResultsError(f"{name}: not a results document: not in the layout its key index describes")
    tilesweep = head_of(data, bounds, name).extra.get("tilesweep")
    target.elsewhere = not _ours(sd, tilesweep)
    owners = _owners(tilesweep)
    for rec in keyindex.records_at(data, index, strangers):
        target.foreign[owners.get(rec.get("unit") if isinstance(rec, dict) else None, NOT_TILESWEEP)] += 1


def refuse_foreign(target: Target, *, elsewhere: str, overwrite: str = "pass --overwrite to replace it") -> None:
    """One line naming what a merge without append would drop, and the ways out (``elsewhere``:
    how this command writes another file, ``overwrite``: how it replaces this one)."""
    keep = f"the old one is then kept as {prev_path(target.path).name}"
    if target.not_a_document is not None:
        raise ResultsError(
            f"{target.path} exists and is not a results document ({target.not_a_document}); merging would replace "
            f"it: write elsewhere ({elsewhere}), or {overwrite} ({keep})"
        )
    n = target.n_foreign
    whose = ", ".join(f"{k} {owner}" for owner, k in target.foreign.most_common())
    raise ResultsError(
        f"{target.path} holds {n} record{'s' if n != 1 else ''} that {'are' if n != 1 else 'is'} not this sweep's "
        f"({whose}); merging would drop them: set append: true to merge into it, write elsewhere ({elsewhere}), "
        f"or {overwrite} ({keep})"
    )


def stash(out: Path) -> Path:
    """A second name for the document about to be replaced (a hard link, or a copy where links
    are not allowed); ``keep`` makes it ``<output>.prev`` once the new document is in place."""
    tmp = temp_path(prev_path(out))
    try:
        os.link(out, tmp)
    except OSError:
        shutil.copy2(out, tmp)
    return tmp


def keep(stashed: Path, out: Path) -> Path:
    prev = prev_path(out)
    os.replace(stashed, prev)
    return prev
