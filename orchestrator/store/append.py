"""Appending a sweep's records into an existing results document (``append: true``).

The existing document is read with the one results-document reader (``document.load``), so
what counts as a results document is the same for append, report, compare and ``--costs``.
Its records are kept untouched and in place, except those of the same identity as a record
of this sweep: the newer of the two stays (``newest``'s rule, by the start time of the
attempt that measured each; a record whose measurement time the document cannot tell, as in
a reference-run document, counts as older), except that a replayed record never takes the
place of a measured one, whatever their times (``store.replayed``: a replay's records are no
measurements), and further copies are dropped. Where a record that was not this sweep's own
is replaced or dropped, the merge keeps the old document as ``.prev``
(``Appended.replaced_foreign``). New identities follow in plan order. A document of another
device is refused unless ``merge.mix_devices`` is set, and then every record carries its
device. The document's own ``tilesweep`` block is kept under ``earlier`` when it came from
another spec, so provenance is never lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kernels.spelling import as_json
from orchestrator.errors import ResultsError
from orchestrator.spec.records import item_id
from orchestrator.store.carry import measurement_of, provenance
from orchestrator.store.document import ResultsDoc, load
from orchestrator.store.keyindex import Keys
from orchestrator.store.lines import DeviceBlock
from orchestrator.store.newest import Slots
from orchestrator.store.provenance import (
    DocumentHead,
    attempts_of,
    blocks,
    with_earlier,
    without_earlier,
)
from orchestrator.store.replayed import Replayed, replayed_of
from orchestrator.store.texts import any_record_text

APPEND_HINT = "merging appends to it (append: true): move it away or set append: false"


def load_target(path: Path) -> ResultsDoc:
    """The document to append into; a file that is not one is refused with the way out."""
    try:
        return load(path)
    except ResultsError as exc:
        raise ResultsError(f"{exc.message}; {APPEND_HINT}") from None


@dataclass
class Appended:
    """The appended document: its head, its record texts and their keys, and how many of the
    existing document's records were kept and how many of those are errors."""

    head: DocumentHead
    texts: list[bytes]
    keys: Keys
    kept: int
    kept_errors: int
    replaced_foreign: int = 0  # records not of this sweep's units that were replaced or dropped


@dataclass(frozen=True)
class Ours:
    """This sweep as an append sees it: its spec's ``tag``, its units (a record of one of them
    is its own, written by an earlier merge of it) and whether it is a replay."""

    tag: str
    units: frozenset[str]
    replay: bool


def append_into(
    existing: ResultsDoc, head: DocumentHead, slots: Slots, ours: Ours, *, mix_devices: bool, path: Path
) -> Appended:
    """Records of this sweep (``slots``) replace same-identity records of ``existing`` in place,
    unless the document's record was measured later (by its unit and attempt's start time in the
    document's tilesweep blocks) or is a measurement where this sweep replays; the others are
    kept untouched; new identities follow in plan order. Consumes ``existing.results`` as it
    goes, so a big document's parsed records are freed while its text is built."""
    old_kind = existing.device.get("device_kind")
    new_kind = head["device"].get("device_kind") if head["device"] else old_kind
    mixing = old_kind != new_kind
    if mixing and not mix_devices:
        raise ResultsError(
            f"{path} holds results of device {as_json(old_kind)}, this sweep ran on {as_json(new_kind)}; "
            "set merge.mix_devices: true to mix them (records then carry their device), or write to another output"
        )
    old_ts = existing.extra.get("tilesweep")
    keys = Keys([], [])
    judge = _Judge(measured_times(old_ts), replayed_of(existing), ours)
    texts, kept, kept_errors = _records(existing, slots, judge, mixing, new_kind, keys)
    new_head = head.copy()
    if existing.device and not mixing:
        new_head["device"] = cast(DeviceBlock, existing.device)
    old_blocks = blocks(old_ts)
    earlier = old_blocks[:-1]
    own = old_blocks[-1] if old_blocks else None
    if own and own.get("fingerprint") != head["tilesweep"]["fingerprint"]:
        earlier.append(without_earlier(own))
    if earlier:
        new_head["tilesweep"] = with_earlier(head["tilesweep"], earlier)
    return Appended(new_head, texts, keys, kept, kept_errors, judge.replaced_foreign)


@dataclass
class _Judge:
    """Which of two records of one identity stays: the document's (``rec``) or this sweep's."""

    measured: MeasuredTimes  # when the document's records were measured
    replayed: Replayed  # the document's rule of which of its records are replayed
    ours: Ours
    replaced_foreign: int = 0

    def ours_win(self, rec: dict[str, Any], started: str) -> bool:
        """Whether this sweep's record (of an attempt that ``started`` then) replaces ``rec``:
        a measurement beats a replay; else the newer wins, and a record of unknown age is older."""
        theirs_replayed = self.replayed(rec)
        if theirs_replayed != self.ours.replay:
            return theirs_replayed
        theirs = self.measured.of(rec)
        return theirs is None or theirs <= started

    def gone(self, rec: dict[str, Any]) -> None:
        """``rec`` leaves the document (replaced or a second copy): counted where not ours."""
        if rec.get("unit") not in self.ours.units:
            self.replaced_foreign += 1


def _records(
    existing: ResultsDoc, slots: Slots, judge: _Judge, mixing: bool, new_kind: Any, keys: Keys
) -> tuple[list[bytes], int, int]:
    """The record texts of the appended document, how many of the document's records were
    kept and how many of those are errors; the keys of the texts are added to ``keys``, this
    sweep's records being of its tag. When ``mixing`` devices, every record carries its device:
    the document's kind for its records, ``new_kind`` for this sweep's."""
    old_kind = existing.device.get("device_kind")
    fresh = {iid: pi for pi, iid in enumerate(slots.ids) if iid is not None}
    used: set[int] = set()
    texts: list[bytes] = []
    kept = kept_errors = 0
    tag = judge.ours.tag

    def ours(pi: int) -> bytes:
        t = slots.text[pi] or b""
        keys.ids.append(slots.ids[pi] or "")
        keys.tags.append(tag)
        return _with_device(t, new_kind) if mixing and b'\n   "device": ' not in t else t

    for rec in _drain(existing.results):
        try:
            pi = fresh.get(item_id(rec))
        except KeyError:  # a config field missing: not an identity of ours
            pi = None
        if pi is not None and pi in used:  # a second copy of one of our items: superseded
            slots.superseded += 1
            judge.gone(rec)
            continue
        if pi is not None:
            used.add(pi)
            if judge.ours_win(rec, slots.started_of(pi)):
                judge.gone(rec)
                texts.append(ours(pi))
                continue
            slots.err[pi] = 0  # the kept record is counted below, ours is not written
        if mixing and "device" not in rec:
            rec = {**rec, "device": old_kind}
        texts.append(any_record_text(rec))
        keys.add(rec)
        kept += 1
        kept_errors += "error" in rec
    texts.extend(ours(pi) for pi, t in enumerate(slots.text) if t is not None and pi not in used)
    return texts, kept, kept_errors


def _drain(records: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The records in order, each let go of by the list once handed out."""
    records.reverse()
    while records:
        yield records.pop()


@dataclass(frozen=True)
class MeasuredTimes:
    """When a document's records were measured: by (unit, attempt), the start times its
    tilesweep blocks give their attempts, and for a record carried by reuse (``reused_from``)
    when its source measured it, as its block's ``reused.measured`` kept it (a carried record
    was measured then, not when the sweep that carried it was planned)."""

    attempts: dict[tuple[Any, Any], str]
    carried: dict[str, str]

    def of(self, rec: Mapping[str, Any]) -> str | None:
        """When ``rec`` was measured, or None where the document cannot tell."""
        source = rec.get("reused_from")
        if isinstance(source, str):
            started = self.carried.get(measurement_of(source))
            if started is not None:
                return started
        return self.attempts.get((rec.get("unit"), rec.get("attempt")))


def measured_times(tilesweep: object) -> MeasuredTimes:
    """When each record of a document was measured, where its tilesweep blocks (its own and the
    ``earlier`` ones, ``provenance.blocks``; ``tilesweep``: the document's value of that key)
    say: records of tilesweep documents carry unit and attempt, their blocks the attempts' start
    times and, for the records they carried, the start times of the attempts that measured them."""
    measured: dict[tuple[Any, Any], str] = {}
    carried: dict[str, str] = {}
    for block in blocks(tilesweep):
        for unit, atts in attempts_of(block).items():
            for a in atts if isinstance(atts, list) else ():
                started = a.get("started") if isinstance(a, dict) else None
                if isinstance(started, str):
                    measured[(unit, a.get("attempt"))] = started
        reused = block.get("reused")
        kept = reused.get("measured") if isinstance(reused, dict) else None
        if isinstance(kept, dict):
            carried.update((k, v) for k, v in kept.items() if isinstance(v, str))
    return MeasuredTimes(measured, carried)


def source_times(tilesweep: object, path: str) -> dict[str, str]:
    """When each record of the document at ``path`` (its head's ``tilesweep`` value) was
    measured, keyed as a record carried from it says where it came from (``carry.measurement_of``):
    what a sweep that carries some of them keeps in its reuse block."""
    times = measured_times(tilesweep)
    out = {provenance(path, unit, attempt, False): t for (unit, attempt), t in times.attempts.items()}
    for key, t in times.carried.items():  # carried there from elsewhere: the time it was measured
        out.setdefault(key, t)
    return out


def _with_device(text: bytes, kind: Any) -> bytes:
    """A record text (as ``texts.record_text`` writes it) with ``device`` as its last field."""
    return text[:-4] + b',\n   "device": ' + json.dumps(kind).encode() + b"\n  }"
