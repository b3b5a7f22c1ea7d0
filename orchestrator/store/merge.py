"""Merging partials into the one results document, in the reference format.

The merger is the only writer of the document. Under a lock on the document (hard or soft,
see ``locks``) it reads every unit's partial (as cached segments, see ``segments``:
unchanged partials are not re-parsed, grown ones only from where they were last read),
dedupes by item (``newest``: the newest attempt wins: latest attempt start, then the later
unit in the unit index, then the later line), orders records by plan order, streams the
document into a temp file and renames it into place, so a reader never sees a half-written
document. Merging is idempotent: if a lock silently fails (flock on NFS), the cost is a
redo, never a lost record. Plan order comes from the unit files, so merging never
re-expands the spec.

What is not merged, and what happens to it (``partials.classify`` says what each line is,
for the merger and ``read_partial`` alike, so resume redoes exactly what is not merged):
- a torn or invalid line (wrong field set or types for the schema's record layout, an id that
  is not its identity's hash, an item not in its unit): skipped with a warning naming file
  and line; the worker redoes that item on resume;
- a whole partial of another spec, environment, unit or schema version, or not a partial at
  all: moved to ``SWEEP/quarantine/`` with a warning (see ``quarantine`` for why not refuse);
- a file in ``partials/`` that belongs to no unit of the index: left alone, with a warning.

Document: ``{"device", "config", "results"}`` exactly as the reference run wrote it (bytes
identical to ``json.dumps(doc, indent=1)``, no trailing newline), plus a documented
``"tilesweep"`` key: sweep directory, spec and its fingerprint, the environment fingerprint,
planned count, merge time, per unit its attempts (attempt, host, pid, SLURM task, GPU, start),
and, for a sweep run on SLURM, the GPU-hours its tasks used (``gpu_hours``, from sacct),
so each record's ``unit`` and ``attempt`` trace it to the job that measured it. Records carry
the reference fields in reference order, then documented extras: ``timer``, ``pruned``,
``smem_bytes``, ``compile_cached``, ``unit``, ``attempt`` (and ``device`` when devices are
mixed). With ``append: true`` the existing document's records are kept (see ``append``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator import PROG, word
from orchestrator.errors import ResultsError
from orchestrator.spec.sections import REPLAY
from orchestrator.store import keyindex, unitfile
from orchestrator.store.append import Ours, append_into, load_target
from orchestrator.store.document import paused_gc
from orchestrator.store.files import atomic_open, remove_dead_temps, write_advice
from orchestrator.store.keyindex import Keys
from orchestrator.store.locks import MergeLock, lock_path_for
from orchestrator.store.merge_head import device_of, tilesweep_of
from orchestrator.store.merge_output import cache_space, merge_elsewhere, output_file, refuse_unwritable_folder
from orchestrator.store.newest import Slots, pick_newest
from orchestrator.store.parse_procs import parse_ahead, remove_dead_shares
from orchestrator.store.partials import UnitItems, log_skipped
from orchestrator.store.provenance import DocumentHead
from orchestrator.store.quarantine import Quarantined, quarantine
from orchestrator.store.searchrounds import planned_total
from orchestrator.store.segments import CACHE_DIR, Segment, check_headers, open_skipped, segment
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.target import (
    Target,
    inspect,
    keep,
    plan_of,
    prev_path,
    refuse_foreign,
    stash,
    write_stamp,
)
from orchestrator.store.torn_said import TornSaid

log = logging.getLogger(__name__)

_PLACEHOLDER = "\x00tilesweep-results\x00"
_CHUNK = 4096

__all__ = ["MergeSummary", "merge", "lock_path_for", "write_document"]


@dataclass
class MergeSummary:
    output: Path
    records: int
    planned: int
    missing: int
    errors: int
    kept_from_existing: int = 0
    superseded: int = 0  # records replaced by a newer record of the same item
    skipped_lines: int = 0  # torn or invalid lines (their items are redone on resume)
    quarantined: list[Quarantined] = field(default_factory=list)
    partials: int = 0
    partials_cached: int = 0  # partials taken from the merge cache without reading them
    written: bool = True  # False: every partial with records was quarantined, the output is untouched
    replaced: int = 0  # records the document held before this merge replaced it
    prev: Path | None = None  # where that document was kept, when it held more records than the new one
    # unit -> the bytes of its partial this merge read (the output stamp keeps them, so status tells
    # a document that lacks records appended since from one that holds them all)
    read: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------- collecting


def collect(
    sd: SweepDir, *, use_cache: bool = True, units: dict[str, UnitItems] | None = None
) -> tuple[list[Segment], list[Quarantined], dict[str, Any] | None]:
    """Every usable partial of the sweep as a segment (unit-index order), the partials moved
    to quarantine, and the environment fingerprint the records were measured in. ``units``:
    the units' items already read (``target.inspect`` read them to judge the document), each
    let go once its partial is read, so they never all sit beside the records."""
    fingerprint = sd.spec.fingerprint()
    env = sd.recorded_env()
    segs: list[Segment] = []
    moved: list[Quarantined] = []
    known = set()
    index = sd.unit_index()
    parsed: dict[str, Segment] = {}  # this process's share, while the workers parse theirs

    def here(uid: str) -> None:
        parsed[uid] = segment(sd.root, uid, sd.partial_path(uid), items=(units or {}).pop(uid, None))

    said = TornSaid(sd.root, use=use_cache)  # an incomplete line is warned of by the first merge that finds it
    ahead = parse_ahead(sd, [e["id"] for e in index], here) if use_cache else set()  # on the other CPUs
    for entry in index:
        uid = entry["id"]
        path = sd.partial_path(uid)
        known.add(path.name)
        seg = parsed.pop(uid, None)  # a Segment without records is falsy: no `or` here
        if seg is None:
            seg = segment(sd.root, uid, path, use_cache=use_cache, items=(units or {}).pop(uid, None))
        seg.cached = seg.cached and uid not in ahead  # parsed by this merge, in another process
        if seg.cached:  # parsed by an earlier merge: its unit file, edited since, is refused as a parse refuses it
            unitfile.check(sd.root, uid)
        if env is None and seg.headers and seg.foreign is None:
            env = seg.headers[0].get("env")  # no env.json: the first worker's environment rules
        why = seg.foreign or check_headers(seg, fingerprint, env)
        if why is not None:
            q = quarantine(sd.root, path, why)
            if q is not None:
                moved.append(q)
            continue
        seg.skipped = open_skipped(seg, entry.get("n_items"))
        for lineno, reason, *_ in said.to_say(seg, seg.skipped):
            log_skipped(path, lineno, reason)
        segs.append(seg)
    said.save()
    if sd.partials.is_dir():
        for p in sd.partials.iterdir():
            if p.name not in known and not p.name.startswith("."):
                log.warning("%s is not the partial of any unit in %s; not merged", p, sd.root / "units.json")
    return segs, moved, env


# ---------------------------------------------------------------------------- the document


def write_document(path: Path, head: Mapping[str, object], records: Sequence[bytes]) -> int:
    """Stream ``head`` with ``records`` (record texts, ``texts``) as its ``results`` into
    ``path``, atomically; the bytes equal ``json.dumps({... "results": [...] ...}, indent=1)``.
    Returns where the first record's text starts (``keyindex``)."""
    text = json.dumps({**head, "results": _PLACEHOLDER}, indent=1)
    before, after = (part.encode() for part in text.split(json.dumps(_PLACEHOLDER), 1))
    with atomic_open(path, "wb") as f:
        f.write(before)
        _write_results(f, records)
        f.write(after)
    return len(before) + len(b"[\n  ")


def _write_results(f: IO[bytes], records: Sequence[bytes]) -> None:
    """The ``results`` list: a chunk of record texts joined at a time, no loop per record (a
    million of them at the scale of ``bench/merge``)."""
    if not records:
        f.write(b"[]")
        return
    f.write(b"[\n  ")
    for start in range(0, len(records), _CHUNK):
        if start:
            f.write(keyindex.SEPARATOR)
        f.write(keyindex.SEPARATOR.join(records[start : start + _CHUNK]))
    f.write(b"\n ]")


def merge(
    sd: SweepDir,
    *,
    output: Path | None = None,
    use_cache: bool = True,
    extra: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    skip_empty: bool = False,
) -> MergeSummary:
    """Merge the sweep's partials into its output document (``output``, default the spec's),
    atomically and under the document's lock.

    ``extra``: more keys of the ``tilesweep`` block (a SLURM sweep's GPU-hours). Not appending, a
    document that holds records not this sweep's is refused unless ``overwrite``; one replaced by
    fewer records is kept as ``<output>.prev`` (``target``). Where every partial with records was
    quarantined nothing is written (``MergeSummary.written`` is false), nor, with ``skip_empty``
    (a sweep's end: ``run``, ``wait``, the final merge job), where no partial holds a record."""
    spec = sd.spec
    out = output_file(sd, Path(output) if output is not None else sd.output)
    with MergeLock(lock_path_for(out), spec.merge.lock, spec.merge.lock_timeout_s, sweep=sd.root):
        # a temp of a process that is gone is a killed writer's (the document's and its index's writers
        # hold this lock; the cache's are merges and their workers): removed at once, so a retry has its space
        dead = remove_dead_temps(out, min_age_s=0) + remove_dead_temps(keyindex.index_path(out), min_age_s=0)
        dead += remove_dead_temps(sd.root / CACHE_DIR, min_age_s=0) + remove_dead_shares(sd.root / CACHE_DIR)
        for p in dead:
            log.info("removed %s, left by a merge that was killed", p)
        refuse_unwritable_folder(sd, out)  # before the partials are read, not once the document is ready
        appending = spec.append and out.exists()
        units: dict[str, UnitItems] = {}
        plan = "" if appending else plan_of(sd)  # before anything is read: a unit planned since is not claimed
        # a million records parsed and written, none in a cycle: the collector would walk them again and again
        with paused_gc():
            target = inspect(sd, out, units, plan) if not appending else None
            if target is not None and (target.n_foreign or target.not_a_document) and not overwrite:
                refuse_foreign(target, elsewhere=merge_elsewhere(sd))
            segs, moved, env = collect(sd, use_cache=use_cache, units=units)
            planned = planned_total(sd)
            slots = pick_newest(segs, planned)
            head: DocumentHead = {
                "device": device_of(segs),
                "config": spec.reference_config(),
                "tilesweep": tilesweep_of(sd, segs, env, extra),
            }
            summary = _found(out, planned, slots, segs, moved)
            del segs
            if not slots.found and _writes_nothing(summary, out, quarantined=bool(moved), skip_empty=skip_empty):
                return summary
            if target is not None and target.records and not slots.found and not overwrite:
                raise ResultsError(
                    f"no partial of {sd.root} holds a record, and {out} holds {target.records}: merging would "
                    f"empty it, so it is left as it is (pass --overwrite to empty it)"
                )
            if appending:
                _write_appended(sd, out, head, slots, summary)
            else:
                _write_fresh(sd, out, head, slots, summary, target, plan, overwrite=overwrite)
    log.info("merged %d records into %s (%d of %d planned missing)", summary.records, out, summary.missing, planned)
    return summary


def _writes_nothing(summary: MergeSummary, out: Path, *, quarantined: bool, skip_empty: bool) -> bool:
    """Whether a merge that found no record writes nothing (``summary.written`` false): where
    every partial with records was quarantined, or, with ``skip_empty``, where none was written."""
    if not (quarantined or skip_empty):
        return False
    summary.written = False
    if quarantined:
        log.warning("every partial with records was quarantined: %s is left as it was", out)
    else:
        log.info("no partial holds a record: %s is not written", out)
    return True


def _found(out: Path, planned: int, slots: Slots, segs: list[Segment], moved: list[Quarantined]) -> MergeSummary:
    """What the partials hold, before anything is written (records and errors: ``_write_*``)."""
    return MergeSummary(
        out,
        records=0,
        planned=planned,
        missing=planned - slots.found,
        errors=0,
        superseded=slots.superseded,
        skipped_lines=sum(len(s.skipped) for s in segs),
        quarantined=moved,
        partials=len(segs),
        partials_cached=sum(s.cached for s in segs),
        read={s.unit: s.size for s in segs if s.mtime_ns},  # mtime 0: no partial
    )


def _write_appended(sd: SweepDir, out: Path, head: DocumentHead, slots: Slots, summary: MergeSummary) -> None:
    """Append: the document at ``out`` keeps its records, this sweep's replace those of the same
    identity measured before them (``append.append_into``)."""
    existing = load_target(out)
    summary.replaced = len(existing.results)
    ours = Ours(sd.spec.tag, frozenset(e["id"] for e in sd.unit_index()), sd.spec.kernel.impl == REPLAY)
    appended = append_into(existing, head, slots, ours, mix_devices=sd.spec.merge.mix_devices, path=out)
    summary.records = len(appended.texts)
    summary.kept_from_existing = appended.kept
    summary.errors = sum(slots.err) + appended.kept_errors
    keep_prev = appended.replaced_foreign > 0
    _replace(sd, out, _ordered(appended.head), appended.texts, appended.keys, summary, keep_prev=keep_prev)


def _write_fresh(
    sd: SweepDir,
    out: Path,
    head: DocumentHead,
    slots: Slots,
    summary: MergeSummary,
    target: Target | None,
    plan: str,
    *,
    overwrite: bool = False,
) -> None:
    """This sweep's records alone, in place of the document ``target`` judged before; its key
    index claims them for ``plan`` (``target.plan_of``). Fewer records than the document holds,
    where a ``.prev`` already keeps an earlier document, are refused unless ``overwrite``:
    keeping this one would replace that one (``refuse_second_shrink``)."""
    summary.replaced = target.records if target is not None else 0
    summary.records = slots.found
    summary.errors = sum(slots.err)
    if summary.replaced > summary.records and not overwrite:
        refuse_second_shrink(sd, out, summary)
    texts = slots.texts()
    keys = Keys(slots.winner_ids(), [sd.spec.tag] * len(texts))
    _replace(sd, out, _ordered(head), texts, keys, summary, target, plan)


def refuse_second_shrink(sd: SweepDir, out: Path, summary: MergeSummary) -> None:
    """A merge that writes fewer records than ``out`` holds keeps ``out`` as ``.prev``; where a
    ``.prev`` is there already (an earlier such merge's, or another sweep's document), that would
    lose it: refused in one line, nothing changed."""
    prev = prev_path(out)
    if prev.exists():
        raise ResultsError(
            f"{out} holds {summary.replaced} records and this merge would write {summary.records}: the others are "
            f"in no partial of {sd.root} (deleted or quarantined), and {prev} already keeps an earlier document, "
            "so both are left as they are: restore the partials, or move the .prev away and merge again "
            "(--overwrite replaces it)"
        )


def _replace(
    sd: SweepDir,
    out: Path,
    head: Mapping[str, object],
    records: list[bytes],
    keys: Keys,
    summary: MergeSummary,
    target: Target | None = None,
    plan: str | None = None,
    keep_prev: bool = False,
) -> None:
    """Write the document, then its key index (``keys``: of ``records``, in order; ``plan``: the
    plan all of them are items of, ``target.plan_of``, where they are this sweep's alone); keep
    the one it replaces as ``.prev`` when that held more records, or anything not this sweep's
    (``target``, judged before: ``--overwrite`` drops it, even where reused records make the new
    document as long; ``keep_prev``: an append replaced records not this sweep's). Nothing is
    changed when the output cannot be replaced (one line says why)."""
    dropped = target is not None and bool(target.n_foreign or target.not_a_document or target.elsewhere)
    keep_prev = keep_prev or dropped or summary.replaced > summary.records
    prev = prev_path(out)
    if keep_prev and out.exists() and prev.is_dir() and not prev.is_symlink():  # the rename into it would fail
        raise ResultsError(
            f"{prev} is a directory, where the merge keeps the document it replaces ({out}, {summary.replaced} "
            "records): both are left as they are; move it away and merge again"
        )
    existed = out.exists()
    stashed = stash(out) if existed and keep_prev else None
    try:
        first = write_document(out, head, records)
    except OSError as exc:
        if stashed is not None:
            stashed.unlink(missing_ok=True)
        raise ResultsError(
            f"cannot write {out} ({exc.strerror or exc}); {'it is unchanged' if existed else 'nothing was written'}: "
            f"{write_advice(exc)}{cache_space(sd, out, exc)}, or merge into another file "
            f"(`{PROG} merge {word(sd.root)} --output FILE`)"
        ) from None
    if stashed is not None:
        summary.prev = keep(stashed, out)
    keyindex.write(out, first, map(len, records), keys.ids, keys.tags, keys.odd, plan=plan)
    write_stamp(sd, out, summary.records, summary.read)


def _ordered(head: DocumentHead) -> dict[str, object]:
    """Top-level keys in reference order, tilesweep's own last."""
    return {"device": head["device"], "config": head["config"], "results": None, "tilesweep": head["tilesweep"]}
