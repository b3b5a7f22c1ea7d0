"""Several results documents as one, for a tuned table from many sweeps (``export A B ...``).

Sweeps of one model's shapes come from several runs, dates and clusters. Per record identity
(``records.item_id``) the newest record of the chosen device kind is kept: newest by when its
attempt started (the documents' tilesweep blocks say, per unit and attempt:
``store.append.measured_times``), a record whose time no block names counting as older than any
that has one, and between equals the later document on the command line. What is dropped is
counted and said: records of another device kind, and records superseded by a newer one of the
same identity (those measured with an older jax than the record that replaced them are counted
apart: that is the usual reason to rerun).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator.spec.records import item_id
from orchestrator.store.append import measured_times
from orchestrator.store.document import ResultsDoc


@dataclass
class Combined:
    """What combining kept and dropped, per reason and per document."""

    device_kind: Any
    kept: int = 0
    other_device: Counter = field(default_factory=Counter)  # document -> records of another device kind
    other_kinds: set = field(default_factory=set)
    older_jax: int = 0  # superseded by a record measured with a newer jax
    superseded: int = 0  # superseded by a newer record of the same jax (or of unknown jax)


def _version(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v or "")))


def _jax_of(doc: ResultsDoc) -> dict[Any, Any]:
    """Unit -> the jax version its tilesweep block names (None: the document's device block)."""
    ts = doc.extra.get("tilesweep")
    out: dict[Any, Any] = {None: doc.device.get("jax")}
    if not isinstance(ts, dict):
        return out
    earlier = ts.get("earlier")
    for block in [*(e for e in (earlier if isinstance(earlier, list) else []) if isinstance(e, dict)), ts]:
        env = found if isinstance(found := block.get("env"), dict) else {}
        attempts = block.get("attempts")
        for unit in attempts if isinstance(attempts, dict) else ():
            out[unit] = env.get("jax") or doc.device.get("jax")
    return out


def combine(docs: list[ResultsDoc], device_kind: Any = None) -> tuple[ResultsDoc, Combined]:
    """One document of the newest record per identity of ``device_kind`` (default: the first
    document's) over ``docs``; its device block is that of the document of that kind with the newest
    jax (the stack the table is mostly measured on)."""
    kind = device_kind if device_kind is not None else docs[0].device.get("device_kind")
    summary = Combined(kind)
    chosen: dict[str, tuple[tuple[str, int], Any, dict[str, Any]]] = {}
    order: list[str] = []
    device: dict[str, Any] = {}
    for pos, doc in enumerate(docs):
        ts = doc.extra.get("tilesweep")
        times = measured_times(ts if isinstance(ts, dict) else {})
        jax = _jax_of(doc)
        if doc.device.get("device_kind") == kind and _version(doc.device.get("jax")) >= _version(device.get("jax")):
            device = doc.device
        for rec in doc.results:
            rkind = rec.get("device", doc.device.get("device_kind"))
            if rkind != kind:
                summary.other_device[doc.name] += 1
                summary.other_kinds.add(rkind)
                continue
            try:
                iid = item_id(rec)
            except (KeyError, TypeError):
                continue
            when = (times.get((rec.get("unit"), rec.get("attempt")), ""), pos)
            version = jax.get(rec.get("unit"), jax[None])
            prev = chosen.get(iid)
            if prev is None:
                order.append(iid)
            elif prev[0] > when:
                _dropped(summary, version, prev[1])
                continue
            else:
                _dropped(summary, prev[1], version)
            chosen[iid] = (when, version, rec)
    summary.kept = len(chosen)
    results = [chosen[iid][2] for iid in order]
    config = docs[0].config
    return ResultsDoc(device=dict(device), config=dict(config), results=results, path="combined"), summary


def _dropped(summary: Combined, loser: Any, winner: Any) -> None:
    if _version(loser) and _version(winner) and _version(loser) < _version(winner):
        summary.older_jax += 1
    else:
        summary.superseded += 1


def describe(summary: Combined, n_docs: int) -> str:
    """One line: how many records from how many documents went in, and what was dropped and why."""
    text = (
        f"combined {n_docs} documents: kept the newest of {summary.kept} identities of device {summary.device_kind!r}"
    )
    dropped = []
    if summary.other_device:
        per = ", ".join(f"{n} in {name}" for name, n in summary.other_device.items())
        kinds = ", ".join(sorted(map(repr, summary.other_kinds)))
        dropped.append(f"{sum(summary.other_device.values())} of another device ({kinds}: {per})")
    if summary.older_jax:
        dropped.append(f"{summary.older_jax} superseded by a record measured with a newer jax")
    if summary.superseded:
        dropped.append(f"{summary.superseded} superseded by a newer record")
    return text + (f"; dropped {'; '.join(dropped)}" if dropped else "")
