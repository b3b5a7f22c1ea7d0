"""Merging partials into the one results document, in the reference format.

The merger is the only writer of the document. Under a lock on the document (hard or soft,
see ``mergelock``) it reads every unit's partial (as cached segments, see ``mergecache``:
unchanged partials are not re-parsed, grown ones only from where they were last read),
dedupes by item (the newest attempt wins: latest attempt start, then the later unit in the
unit index, then the later line), orders records by plan order, streams the document into a
temp file and renames it into place, so a reader never sees a half-written document. Merging
is idempotent: if a lock silently fails (flock on NFS), the cost is a redo, never a lost
record. Plan order comes from the unit files, so merging never re-expands the spec.

What is not merged, and what happens to it:
- a torn or invalid line (wrong field set or types for the schema's record layout, an id that
  is not its identity's hash, an item not in its unit): skipped with a warning naming file
  and line; the worker redoes that item on resume (``read_partial`` skips it the same way);
- a whole partial of another spec, environment, unit or schema version, or not a partial at
  all: moved to ``SWEEP/quarantine/`` with a warning (see ``quarantine`` for why not refuse);
- a file in ``partials/`` that belongs to no unit of the index: left alone, with a warning.

Document: ``{"device", "config", "results"}`` exactly as the reference run wrote it (bytes
identical to ``json.dumps(doc, indent=1)``, no trailing newline), plus a documented
``"tilesweep"`` key: sweep directory, spec and its fingerprint, the environment fingerprint,
planned count, merge time, and per unit its attempts (attempt, host, pid, SLURM job, start),
so each record's ``unit`` and ``attempt`` trace it to the job that measured it. Records carry
the reference fields in reference order, then documented extras: ``timer``, ``pruned``,
``smem_bytes``, ``compile_cached``, ``unit``, ``attempt`` (and ``device`` when devices are
mixed). With ``append: true`` the existing document's records are kept untouched and in
place, except those of the same identity as a record of this sweep: the newer of the two
stays (a record whose measurement time the document cannot tell, as in a reference-run
document, counts as older), and further copies are dropped. A document of another device is
refused unless ``merge.mix_devices`` is set, and then every record carries its device.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.errors import ResultsError
from orchestrator.spec.records import IDENTITY_FIELDS, item_id
from orchestrator.store.locks import MergeLock, lock_path_for
from orchestrator.store.partials import loads
from orchestrator.store.quarantine import Quarantined, quarantine
from orchestrator.store.segments import CACHE_DIR, Segment, any_record_text, check_headers, segment
from orchestrator.store.sweepdir import SweepDir, atomic_open, now_iso, remove_dead_temps

log = logging.getLogger(__name__)

DEVICE_KEYS = ("jax", "backend", "devices", "python", "device_kind")
_PLACEHOLDER = "\x00tilesweep-results\x00"
_CHUNK = 4096

__all__ = ["MergeSummary", "merge", "lock_path_for", "load_document", "DEVICE_KEYS"]


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


# ---------------------------------------------------------------------------- collecting


def collect(sd: SweepDir, *, use_cache: bool = True) -> tuple[list[Segment], list[Quarantined], dict[str, Any] | None]:
    """Every usable partial of the sweep as a segment (unit-index order), the partials moved
    to quarantine, and the environment fingerprint the records were measured in."""
    fingerprint = sd.spec.fingerprint()
    env = sd.recorded_env()
    segs: list[Segment] = []
    moved: list[Quarantined] = []
    known = set()
    for entry in sd.unit_index():
        uid = entry["id"]
        path = sd.partial_path(uid)
        known.add(path.name)
        seg = segment(sd.root, uid, path, use_cache=use_cache)
        if env is None and seg.headers and seg.foreign is None:
            env = seg.headers[0].get("env")  # no env.json: the first worker's environment rules
        why = seg.foreign or check_headers(seg, fingerprint, env)
        if why is not None:
            q = quarantine(sd.root, path, why)
            if q is not None:
                moved.append(q)
            continue
        for lineno, reason in seg.skipped:
            log.warning("%s line %d is %s; skipped, its item will be redone", path, lineno, reason)
        segs.append(seg)
    if sd.partials.is_dir():
        for p in sd.partials.iterdir():
            if p.name not in known and not p.name.startswith("."):
                log.warning("%s is not the partial of any unit in %s; not merged", p, sd.root / "units.json")
    return segs, moved, env


@dataclass
class _Slots:
    """The winning record of each plan position."""

    text: list[str | None]
    ids: list[str | None]
    err: bytearray
    found: int = 0
    superseded: int = 0
    key: list[int] = field(default_factory=list)  # (attempt rank << 32) | line of each winner
    started: list[str] = field(default_factory=list)  # attempt rank -> its start time

    def __iter__(self) -> Iterator[str]:
        return (t for t in self.text if t is not None)

    def started_of(self, pi: int) -> str:
        """When the attempt that measured the record at plan position ``pi`` started."""
        return self.started[self.key[pi] >> 32]


def pick_newest(segs: list[Segment], planned: int) -> _Slots:
    """Dedupe by plan position: the record of the latest-started attempt wins (then the later
    unit in the index, then the later line)."""
    size = max([planned, *(max(s.idx) + 1 for s in segs if s.idx)])
    attempts = sorted(
        (str(h.get("started") or ""), pos, h.get("attempt")) for pos, s in enumerate(segs) for h in s.headers
    )
    rank = {(pos, a): r + 1 for r, (_, pos, a) in enumerate(attempts)}
    key = [-1] * size
    slots = _Slots([None] * size, [None] * size, bytearray(size), key=key, started=["", *(a[0] for a in attempts)])
    text, ids, err = slots.text, slots.ids, slots.err
    for pos, s in enumerate(segs):
        ranks = {a: rank.get((pos, a), 0) << 32 for a in set(s.att)}
        for pi, a, ln, t, e, iid in zip(s.idx, s.att, s.ln, s.texts, s.err, s.ids, strict=True):
            k = ranks[a] | ln
            old = key[pi]
            if k > old:
                if old >= 0:
                    slots.superseded += 1
                key[pi] = k
                text[pi] = t
                ids[pi] = iid
                err[pi] = e
            else:
                slots.superseded += 1
    slots.found = size - key.count(-1)
    return slots


# ---------------------------------------------------------------------------- the document


def _tilesweep_block(sd: SweepDir, segs: list[Segment], env: dict[str, Any] | None) -> dict[str, Any]:
    spec = sd.spec
    attempts = {
        s.unit: [
            {
                "attempt": h.get("attempt"),
                "host": h.get("host"),
                "pid": h.get("pid"),
                "slurm_job_id": h.get("slurm_job_id"),
                "started": h.get("started"),
            }
            for h in s.headers
        ]
        for s in segs
        if s.headers
    }
    return {
        "sweep_dir": str(sd.root),
        "fingerprint": spec.fingerprint(),
        "env": env,
        "merged": now_iso(),
        "planned": sd.planned,
        "spec": spec.model_dump(mode="json"),
        "attempts": attempts,
    }


def _device(segs: list[Segment]) -> dict[str, Any]:
    for s in segs:
        for h in s.headers:
            if isinstance(h.get("device"), dict):
                return {k: h["device"].get(k) for k in DEVICE_KEYS}
    return {}


def write_document(path: Path, head: dict[str, Any], records: Iterable[str]) -> None:
    """Stream ``head`` with ``records`` (record texts) as its ``results`` into ``path``,
    atomically; the bytes equal ``json.dumps({... "results": [...] ...}, indent=1)``."""
    text = json.dumps({**head, "results": _PLACEHOLDER}, indent=1)
    before, after = text.split(json.dumps(_PLACEHOLDER), 1)
    with atomic_open(path) as f:
        f.write(before)
        _write_results(f, records)
        f.write(after)


def _write_results(f: IO[str], records: Iterable[str]) -> None:
    it = iter(records)
    first = next(it, None)
    if first is None:
        f.write("[]")
        return
    f.write("[\n  ")
    f.write(first)
    buf: list[str] = []
    for t in it:
        buf.append(t)
        if len(buf) >= _CHUNK:
            f.write(",\n  " + ",\n  ".join(buf))
            buf.clear()
    if buf:
        f.write(",\n  " + ",\n  ".join(buf))
    f.write("\n ]")


def load_document(path: Path) -> dict[str, Any]:
    try:
        doc = loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ResultsError(
            f"{path} is not a readable results document ({exc}); move it away or set append: false"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not isinstance(doc.get("device"), dict):
        raise ResultsError(
            f"{path} is not a results document (needs device, config, results); move it away or set append: false"
        )
    return doc


def _with_device(text: str, kind: Any) -> str:
    return text[:-4] + ',\n   "device": ' + json.dumps(kind) + "\n  }"


def append_into(
    existing: dict[str, Any], head: dict[str, Any], slots: _Slots, *, mix_devices: bool, path: Path
) -> tuple[dict[str, Any], list[str], int, int]:
    """Records of this sweep replace same-identity records of ``existing`` in place, unless
    the document's record was measured later (by its unit and attempt's start time in the
    document's tilesweep blocks); the others are kept untouched; new identities follow in
    plan order. Returns the new head, the record texts, how many records were kept and how
    many of them are errors."""
    old_kind = existing["device"].get("device_kind")
    new_kind = head["device"].get("device_kind") if head["device"] else old_kind
    mixing = old_kind != new_kind
    if mixing and not mix_devices:
        raise ResultsError(
            f"{path} holds results of device {old_kind!r}, this sweep ran on {new_kind!r}; "
            "set merge.mix_devices: true to mix them (records then carry their device), or write to another output"
        )
    fresh = {iid: pi for pi, iid in enumerate(slots.ids) if iid is not None}
    # When each kept record was measured, where the document says (records of tilesweep
    # documents carry unit and attempt; their tilesweep blocks the attempts' start times).
    measured: dict[tuple[Any, Any], str] = {}
    old_ts = existing.get("tilesweep") if isinstance(existing.get("tilesweep"), dict) else {}
    for block in [*(e for e in old_ts.get("earlier", []) if isinstance(e, dict)), old_ts]:
        attempts = block.get("attempts")
        for unit, atts in attempts.items() if isinstance(attempts, dict) else ():
            for a in atts if isinstance(atts, list) else ():
                if isinstance(a, dict) and isinstance(a.get("started"), str):
                    measured[(unit, a.get("attempt"))] = a["started"]
    used: set[int] = set()
    texts: list[str] = []
    kept = kept_errors = 0
    old = existing["results"]
    for i, rec in enumerate(old):
        old[i] = None  # let the parsed record go as soon as it is written out
        pi = None
        if isinstance(rec, dict) and all(k in rec for k in IDENTITY_FIELDS):
            try:
                pi = fresh.get(item_id(rec))
            except KeyError:  # a config field missing: not an identity of ours
                pi = None
        if pi is not None and pi in used:  # a second copy of one of our items: superseded
            slots.superseded += 1
            continue
        if pi is not None:
            used.add(pi)
            theirs = measured.get((rec.get("unit"), rec.get("attempt")))
            if theirs is None or theirs <= slots.started_of(pi):  # newest wins; unknown age: ours
                t = slots.text[pi]
                texts.append(_with_device(t, new_kind) if mixing else t)
                continue
            slots.err[pi] = 0  # the kept record is counted below, ours is not written
        if mixing and isinstance(rec, dict) and "device" not in rec:
            rec = {**rec, "device": old_kind}
        texts.append(any_record_text(rec) if isinstance(rec, dict) else json.dumps(rec, indent=1).replace("\n", "\n  "))
        kept += 1
        kept_errors += isinstance(rec, dict) and "error" in rec
    for pi, t in enumerate(slots.text):
        if t is not None and pi not in used:
            texts.append(_with_device(t, new_kind) if mixing else t)
    new_head = dict(head)
    new_head["device"] = head["device"] if mixing or not existing["device"] else existing["device"]
    earlier = []
    if old_ts:
        earlier = [e for e in old_ts.get("earlier", []) if isinstance(e, dict)]
        if old_ts.get("fingerprint") != head["tilesweep"]["fingerprint"]:
            earlier.append({k: v for k, v in old_ts.items() if k != "earlier"})
    if earlier:
        new_head["tilesweep"] = {**head["tilesweep"], "earlier": earlier}
    return new_head, texts, kept, kept_errors


def merge(sd: SweepDir, *, output: Path | None = None, use_cache: bool = True) -> MergeSummary:
    """Merge the sweep's partials into its output document (atomically, under a lock)."""
    spec = sd.spec
    out = Path(output) if output is not None else sd.output
    with MergeLock(lock_path_for(out), spec.merge.lock, spec.merge.lock_timeout_s):
        for p in remove_dead_temps(out) + remove_dead_temps(sd.root / CACHE_DIR):
            log.info("removed %s, left by a merge that was killed", p)
        segs, moved, env = collect(sd, use_cache=use_cache)
        planned = sd.planned
        slots = pick_newest(segs, planned)
        head = {
            "device": _device(segs),
            "config": spec.reference_config(),
            "tilesweep": _tilesweep_block(sd, segs, env),
        }
        summary = MergeSummary(
            out,
            0,
            planned,
            planned - slots.found,
            0,
            superseded=slots.superseded,
            skipped_lines=sum(len(s.skipped) for s in segs),
            quarantined=moved,
            partials=len(segs),
            partials_cached=sum(s.cached for s in segs),
        )
        del segs
        if spec.append and out.exists():
            head, texts, kept, kept_errors = append_into(
                load_document(out), head, slots, mix_devices=spec.merge.mix_devices, path=out
            )
            write_document(out, _ordered(head), texts)
            summary.records, summary.kept_from_existing = len(texts), kept
            summary.errors = sum(slots.err) + kept_errors
        else:
            write_document(out, _ordered(head), slots)
            summary.records, summary.errors = slots.found, sum(slots.err)
    log.info("merged %d records into %s (%d of %d planned missing)", summary.records, out, summary.missing, planned)
    return summary


def _ordered(head: dict[str, Any]) -> dict[str, Any]:
    """Top-level keys in reference order, tilesweep's own last."""
    return {"device": head["device"], "config": head["config"], "results": None, "tilesweep": head["tilesweep"]}
