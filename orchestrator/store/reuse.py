"""Reuse: records an earlier results document already holds are carried into a sweep at
planning time instead of being measured again.

Sources, in order of preference: the sweep's output document, then the documents named with
``--reuse`` and in the spec's ``reuse.documents``. A record stands for an item of the new plan
when it has the item's identity (identity and config fields, tag included: its item id, through
the document's key index, else as ``records.key_getter`` reads them plus the tag), fits the
record layout with the exact types it asks (``layouts.check_layout``: so the record's
``item_id`` is the item's), and was measured in a compatible environment with compatible
settings (``spec.compat``: the one home of that rule). Only items the worker would compile and
time are reused (pruned and invalid ones cost nothing). Error records are reused only when asked
(a new jax may fix a compile failure). Of several compatible records of
one item a full one beats a screened one (halving needs no screen of a config timed in full),
then a success beats an error, then the earlier source.

How a document's records were measured is read from its tilesweep blocks (its own and the
``earlier`` ones of appended sweeps): a record's ``unit`` names the block whose ``attempts``
hold it; a record of a unit no block names falls to the document's own block (a sweep of the
same fingerprint appended into it replaced the block). A record without a ``unit`` (a
reference-run document, another tool) has no known settings and is not reused; such a document
still gives its costs to the cost model.

How a source document is read (through its key index, else batch by batch), ``reuse_sources``
says. What a sweep accepts and why it refuses a record (another device, jax or measurement; a
replayed record in a measured sweep) is ``reuse_accept``'s. Where carried records live in the
sweep directory, ``carried`` says.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kernels.spelling import as_json
from orchestrator.errors import ResultsError
from orchestrator.planning import WorkItem
from orchestrator.planning.costs import CostTable, measured_cost
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import DEFAULT_IMPL, head_getter, key_getter
from orchestrator.store.append import source_times
from orchestrator.store.carry import (
    carried_records,
    finish,
    flags_of,
    is_replayed_carry,
    measurement_of,
    origin,
    strip,
)
from orchestrator.store.compact import CompactRecord
from orchestrator.store.document import ResultsDoc, paused_gc
from orchestrator.store.layouts import MODES_CONFIGS, check_layout
from orchestrator.store.provenance import TilesweepBlock, attempts_of, blocks, own_block
from orchestrator.store.record_values import refused_values
from orchestrator.store.replayed import VIRTUAL, replayed_of
from orchestrator.store.reuse_accept import REFUSALS, WHY_OF, Chosen, Judge, SourceCount, Wanted, offer, say, wanted
from orchestrator.store.reuse_indexed import scan_indexed
from orchestrator.store.reuse_sources import Source, indexed_records

log = logging.getLogger(__name__)


@dataclass
class Found:
    """Reuse decided for a plan: the reused records by plan index, and what each source gave."""

    records: Chosen = field(default_factory=dict)  # index -> (record, source)
    sources: list[SourceCount] = field(default_factory=list)
    env: dict[str, Any] | None = None  # the environment records were checked against
    env_from: str = ""
    costs: CostTable | None = None  # measured costs of every source, for the items still planned
    heads: dict[str, Any] = field(default_factory=dict)  # source path -> its head's tilesweep value

    def measured(self, carried: Mapping[str, str]) -> dict[str, str]:
        """When each carried record (its ``reused_from`` -> its source document) was measured
        in its source (``append.source_times``), keyed by the measurement it is
        (``carry.measurement_of``): the reuse block keeps it."""
        times: dict[str, dict[str, str]] = {}
        out: dict[str, str] = {}
        for reused_from, source in carried.items():
            of_source = times.get(source)
            if of_source is None:
                of_source = times[source] = source_times(self.heads.get(source), source)
            key = measurement_of(reused_from)
            if key in of_source:
                out[key] = of_source[key]
        return out

    @property
    def reused(self) -> int:
        return len(self.records)

    def summary(self) -> dict[str, Any]:
        return {
            "reused": self.reused,
            "env": self.env,
            "env_from": self.env_from,
            "sources": [asdict(s) for s in self.sources],
        }


# ---------------------------------------------------------------------------- sources


def document_env(doc: ResultsDoc) -> dict[str, Any] | None:
    """The environment a document's own sweep measured in (its tilesweep block's ``env``, else
    its device block); None for a document that names none."""
    own = own_block(doc.extra.get("tilesweep"))
    env = own.get("env") if own is not None else None
    if isinstance(env, dict):
        return env_fingerprint(env)
    return env_fingerprint(doc.device) if doc.device.get("device_kind") else None


def _blocks(doc: ResultsDoc) -> tuple[dict[str, TilesweepBlock], TilesweepBlock | None]:
    """Unit -> the tilesweep block that measured it, and the document's own block."""
    every = blocks(doc.extra.get("tilesweep"))
    return {unit: block for block in every for unit in attempts_of(block)}, (every[-1] if every else None)


# ---------------------------------------------------------------------------- choosing


def _candidates(batch: list[dict[str, Any]], heads: set[tuple[Any, ...]], head: Any) -> list[dict[str, Any]]:
    """The records of ``batch`` whose problem and config kind the plan has, set aside at C speed
    (``records.head_getter``); a batch with an unhashable identity value is given whole."""
    try:
        return [rec for rec, h in zip(batch, map(head, batch), strict=True) if h in heads]
    except TypeError:
        return batch


def _timing(doc: ResultsDoc) -> tuple[int, int]:
    """(repeats, warmup) of a document's measurements, for ``measured_cost``."""
    config = doc.config
    timing = config.get("timing")
    timing = timing if isinstance(timing, dict) else {}
    return int(config.get("repeats") or 5), int(timing.get("warmup", 1))


def _matches(src: Source, want: Wanted) -> Iterator[tuple[dict[str, Any], WorkItem]]:
    """(record, item) for each record of ``doc`` with the identity of an item of the plan, tag
    included; the first record of each item's identity less the tag goes to ``want.priced`` with
    the document's timing, for the cost model (costs do not depend on a tag; priced only for the
    items left to measure, by ``find_reuse``)."""
    how = _timing(src.doc)
    priced = want.priced
    if src.keyed_by_id(want.tag):  # every record of an item of the plan has that item's id and tag
        for rec, item in indexed_records(src, want.by_id):
            if item.index not in priced:
                priced[item.index] = (rec, how, item)
            yield rec, item
        return
    getters = {(*kind, DEFAULT_IMPL): key_getter(*kind) for kind in MODES_CONFIGS}
    items = want.items
    head = head_getter()
    heads = want.heads
    for batch in src.batches:  # every record has the identity fields (``document.scan`` checks)
        for rec in _candidates(batch, heads, head):
            try:
                kind = (rec["mode"], rec["config"], rec.get("impl", DEFAULT_IMPL))
                getter = getters.get(kind) or getters.setdefault(kind, key_getter(*kind))
                key = getter(rec)
                it = items.get(key)
            except (KeyError, TypeError, ValueError):  # another mode or kernel, a field missing, an unhashable value
                continue
            if it is None:
                continue
            if it.index not in priced:
                priced[it.index] = (rec, how, it)
            if rec["tag"] == it.tag:
                yield rec, it


def _judge(src: Source, count: SourceCount, want: Wanted) -> Judge:
    units, own = _blocks(src.doc)
    return Judge(want, count, units, own, document_env(src.doc) or {})


def _scan(src: Source, count: SourceCount, want: Wanted, chosen: Chosen) -> None:
    """Offer every record of ``src`` that has an item of this plan. Through a current key index
    where only a record's own timer can say it is replayed, on the records' bytes
    (``reuse_indexed``: none parsed); else each record parsed (a hot loop: half a million matched
    records at the scale of ``bench/reuse``). A record taken is the source's own dict (read for
    this scan alone), stripped of its place in the source and given its provenance."""
    judge = _judge(src, count, want)
    rule = replayed_of(src.doc)
    by_unit = rule.possible  # else only a record's own timer says it is replayed
    if src.keyed_by_id(want.tag) and not by_unit:
        scan_indexed(src, judge, chosen, _timing(src.doc))
        return
    my_kind = want.env.get("device_kind")
    for rec, it in _matches(src, want):
        if not want.reuse:
            continue
        count.records += 1
        screened = rec.get("screened") is True
        replayed = rec.get("timer") == VIRTUAL or (by_unit and rule(rec))
        kind = rec.get("device", judge.doc_kind)
        why = judge(rec.get("unit"), screened, replayed, kind, "error" in rec)
        if why is None:
            body = rec  # priced (costs) too: stripping its place changes no measurement field
            unit, attempt, earlier = strip(body, want.marks_replayed(replayed))
            bad, order = check_layout(body)  # the identity matched the item's with the types the layout checks
            bad = bad or refused_values([body]).get(0)  # a value no worker writes (a hand edit): -5 ms
            if bad is not None:
                why = "damaged"
                say(count, f"{WHY_OF['damaged']} (first: {bad})")
        if why is not None:
            judge.refuse(why)
            continue
        device = str(kind) if kind is not None and kind != my_kind else None
        body = finish(body, order, origin(count.path, unit, attempt, replayed, earlier), device)
        offer(chosen, want, it.index, CompactRecord(body), count.path)


def _scan_source(src: Source, count: SourceCount, want: Wanted, chosen: Chosen) -> None:
    """``_scan``; a damaged record in the output document (read in batches, so found only now)
    ends its scan with a warning, as a damaged head does (``load_sources``): the merger judges it."""
    try:
        _scan(src, count, want, chosen)
    except ResultsError as exc:
        if src.role != "output":
            raise
        log.warning("%s; nothing more reused from it", exc.message)


def find_reuse(
    spec: SweepSpec,
    items: list[WorkItem],
    sources: list[Source],
    env: dict[str, Any] | None,
    env_from: str,
    *,
    errors: bool,
    records: bool = True,
    replays: bool = False,
) -> Found:
    """Which items of ``items`` the ``sources`` hold a compatible record of (``records`` false:
    none, as ``--remeasure all`` asks; ``replays``: a measured sweep takes replayed records too),
    and the sources' measured costs of the plan's items."""
    found = Found(env=env, env_from=env_from)
    if not sources:
        return found
    keyed = not all(src.keyed_by_id(spec.tag) for src in sources)
    want = wanted(spec, items, env, errors=errors, reuse=records, replays=replays, keyed=keyed)
    chosen: Chosen = {}
    with paused_gc():
        for src in sources:
            count = SourceCount(src.path, src.role)
            _scan_source(src, count, want, chosen)
            if want.reuse:
                found.sources.append(count)
                found.heads[src.path] = src.doc.extra.get("tilesweep")
    by_source = {c.path: c for c in found.sources}
    found.records = chosen
    for body, source in chosen.values():
        c = by_source[source]
        c.reused += 1
        c.errors += flags_of(body)[1]
        c.replayed_reused += is_replayed_carry(body)
    for c in found.sources:
        c.superseded = c.records - c.reused - sum(getattr(c, k) for k in REFUSALS)
    found.costs = _costs(want, chosen, ", ".join(s.path for s in sources))
    _warn(found)
    return found


def _costs(want: Wanted, chosen: dict[int, Any], source: str) -> CostTable | None:
    """Measured seconds of the items left to measure, from the first record of each (``--costs``'
    rule, ``planning.costs.measured_cost``)."""
    costs: dict[tuple[Any, ...], float] = {}
    left = [(rec, how, it) for index, (rec, how, it) in want.priced.items() if index not in chosen]
    records = carried_records([rec for rec, _, _ in left], raw=True)  # one found through an index is read now
    for rec, ((repeats, warmup), it) in zip(records, ((how, it) for _, how, it in left), strict=True):
        cost = measured_cost(rec, repeats=repeats, warmup=warmup)
        if cost is not None:
            costs[it.record_key()] = cost
    return CostTable(costs, source=source) if costs else None


def _warn(found: Found) -> None:
    """One warning per source for records of another device kind, and per damaged source."""
    for c in found.sources:
        if c.other_device:
            log.warning(
                "%s: %d records of device %s, this sweep's is %s: not reused (merge.mix_devices: true "
                "reuses them, each carrying its device)",
                c.path,
                c.other_device,
                as_json(c.device_kind),
                as_json((found.env or {}).get("device_kind")),
            )
        if c.damaged:
            log.warning(
                "%s: %d damaged records not reused %s; their items are measured",
                c.path,
                c.damaged,
                next((w.removeprefix(f"{WHY_OF['damaged']} ") for w in c.why if w.startswith(WHY_OF["damaged"])), ""),
            )
