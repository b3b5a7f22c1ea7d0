"""Merging partials into the one results document, in the reference format.

The merger is the only writer of the document. Under a file lock it reads every partial,
dedupes by item id (the newest attempt wins), orders records by plan order, writes a temp
file and renames it into place, so a reader never sees a half-written document. Merging is
idempotent: if a lock silently fails (flock on NFS), the cost is a redo, never a lost record.

Document: ``{"device", "config", "results"}`` exactly as the reference run wrote it, plus a
documented ``"tilesweep"`` key (spec, environment, counts). Records carry the reference
fields in reference order, then documented extras: ``timer``, ``pruned``, ``smem_bytes``,
``compile_cached``, ``unit``, ``attempt`` (and ``device`` when devices are mixed).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from .errors import LockTimeout, MismatchError, ResultsError
from .partials import read_partial
from .plan import item_id
from .schema import env_fingerprint
from .sweepdir import SweepDir, atomic_write_text, now_iso

log = logging.getLogger(__name__)

DEVICE_KEYS = ("jax", "backend", "devices", "python", "device_kind")


@dataclass
class MergeSummary:
    output: Path
    records: int
    planned: int
    missing: int
    errors: int
    kept_from_existing: int = 0


def make_lock(path: Path, kind: str, timeout: float) -> filelock.BaseFileLock:
    """flock-based by default; a soft lock (O_EXCL lock file) where flock is unreliable."""
    cls = filelock.SoftFileLock if kind == "soft" else filelock.FileLock
    return cls(str(path), timeout=timeout)


def lock_path_for(output: Path) -> Path:
    """The lock every merger into ``output`` takes: a hidden file beside it."""
    return output.with_name(f".{output.name}.lock")


def locked(path: Path, kind: str, timeout: float) -> Any:
    lock = make_lock(path, kind, timeout)

    class _Ctx:
        def __enter__(self) -> None:
            try:
                lock.acquire()
            except filelock.Timeout:
                raise LockTimeout(
                    f"could not take the lock {path} within {timeout:g}s; another merge may be running "
                    f"(for a soft lock left by a dead process, delete {path})"
                ) from None

        def __exit__(self, *exc: object) -> None:
            lock.release()

    return _Ctx()


def collect(sd: SweepDir) -> tuple[dict[str, tuple[str, int, dict[str, Any]]], dict[str, Any] | None]:
    """Every record of the sweep's partials: id -> (unit, attempt, record); and the device block."""
    fingerprint = sd.spec.fingerprint()
    expected_env = sd.recorded_env()
    found: dict[str, tuple[str, int, dict[str, Any]]] = {}
    device: dict[str, Any] | None = None
    for entry in sd.unit_index():
        unit_id = entry["id"]
        content = read_partial(sd.partial_path(unit_id))
        for h in content.headers:
            if h.get("sweep") != fingerprint:
                raise MismatchError(
                    f"{content.path} was written for another spec (fingerprint {h.get('sweep')} != {fingerprint}); "
                    "move it out of the sweep directory"
                )
            if expected_env is not None and h.get("env") != expected_env:
                raise MismatchError(
                    f"{content.path} was measured in another environment ({h.get('env')} != {expected_env}); "
                    "move it out of the sweep directory or merge it into a separate document"
                )
            if device is None:
                device = {k: h["device"].get(k) for k in DEVICE_KEYS}
        for iid, (attempt, rec) in content.records.items():
            prev = found.get(iid)
            if prev is None or attempt >= prev[1]:
                found[iid] = (unit_id, attempt, rec)
    return found, device


def build_document(sd: SweepDir, found: dict[str, tuple[str, int, dict[str, Any]]], device: dict[str, Any] | None) -> dict[str, Any]:
    spec = sd.spec
    results = []
    for it in sd.items():
        hit = found.get(it.id)
        if hit is None:
            continue
        unit_id, attempt, rec = hit
        rec = dict(rec)
        rec["unit"] = unit_id
        rec["attempt"] = attempt
        results.append(rec)
    return {
        "device": device or {},
        "config": spec.reference_config(),
        "results": results,
        "tilesweep": {
            "sweep_dir": str(sd.root),
            "fingerprint": spec.fingerprint(),
            "env": sd.recorded_env(),
            "merged": now_iso(),
            "planned": len(sd.items()),
            "spec": spec.model_dump(mode="json"),
        },
    }


def load_document(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path} is not a readable results document ({exc}); move it away or set append: false") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not isinstance(doc.get("device"), dict):
        raise ResultsError(f"{path} is not a results document (needs device, config, results); move it away or set append: false")
    return doc


def append_into(existing: dict[str, Any], new: dict[str, Any], *, mix_devices: bool, path: Path) -> tuple[dict[str, Any], int]:
    """Records of ``new`` replace same-identity records of ``existing`` in place; others are
    kept untouched; new identities are appended in plan order."""
    old_kind = existing["device"].get("device_kind")
    new_kind = new["device"].get("device_kind")
    mixing = old_kind != new_kind
    if mixing and not mix_devices:
        raise ResultsError(
            f"{path} holds results of device {old_kind!r}, this sweep ran on {new_kind!r}; "
            "set merge.mix_devices: true to mix them (records then carry their device), or write to another output"
        )
    fresh = {}
    for rec in new["results"]:
        if mixing:
            rec["device"] = new_kind
        fresh[item_id(rec)] = rec
    merged, kept = [], 0
    for rec in existing["results"]:
        iid = item_id(rec)
        if iid in fresh:
            merged.append(fresh.pop(iid))
        else:
            if mixing and "device" not in rec:
                rec = {**rec, "device": old_kind}
            merged.append(rec)
            kept += 1
    merged.extend(fresh.values())
    doc = dict(new)
    doc["device"] = existing["device"] if not mixing else new["device"]
    doc["results"] = merged
    return doc, kept


def merge(sd: SweepDir, *, output: Path | None = None) -> MergeSummary:
    """Merge the sweep's partials into its output document (atomically, under a lock)."""
    spec = sd.spec
    out = Path(output) if output is not None else sd.output
    with locked(lock_path_for(out), spec.merge.lock, spec.merge.lock_timeout_s):
        found, device = collect(sd)
        doc = build_document(sd, found, device)
        kept = 0
        if spec.append and out.exists():
            doc, kept = append_into(load_document(out), doc, mix_devices=spec.merge.mix_devices, path=out)
        text = json.dumps(doc, indent=1)
        atomic_write_text(out, text)
    n_errors = sum(1 for r in doc["results"] if "error" in r)
    planned = len(sd.items())
    summary = MergeSummary(out, len(doc["results"]), planned, planned - len(found), n_errors, kept)
    log.info("merged %d records into %s (%d of %d planned missing)", summary.records, out, summary.missing, planned)
    return summary
