"""A record carried by reuse: what it loses and gains on the way into the reuse unit, and the
carried record held by its place in its source document until the reuse unit is written.

The one home of that rule, for both ways a record is found (``store.reuse``: a parsed record of
a document read batch by batch, or a record text found through the document's key index,
``reuse_indexed``): its place in its source (``unit``, ``attempt``, ``round``, an earlier
``reused_from`` and ``device``) is stripped, a replayed record carried into a measured sweep
says so (``timer: virtual``), its layout is checked as a worker's record is
(``layouts.check_layout``) and put in canonical key order, and it says where it came from
(``reused_from``) and, carried into a sweep of another device, its device.

A record found through the key index is not parsed at planning time: ``Carried`` holds where
its text lies and what judging it read off its bytes, and gives the finished record when it is
first read (``carried_records`` reads many at once, in plan order, a batch at a time).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from orchestrator.errors import ResultsError
from orchestrator.store.layouts import check_layout
from orchestrator.store.partials import loads
from orchestrator.store.replayed import VIRTUAL

STRIP = ("unit", "attempt", "reused_from", "device", "round")  # a record's place in its source
_BATCH = 8192  # records parsed in one call when many are read


def strip(rec: dict[str, Any], mark_replayed: bool) -> tuple[Any, Any, Any]:
    """Take the record's place in its source off it (in place), marking it replayed where asked;
    returns the (unit, attempt) that measured it there, and its ``reused_from`` where it was
    carried there from elsewhere (``origin``)."""
    unit, attempt, earlier = rec.get("unit"), rec.pop("attempt", None), rec.get("reused_from")
    for k in STRIP:
        rec.pop(k, None)
    if mark_replayed:  # carried into a measured sweep: the record says it
        rec.setdefault("timer", VIRTUAL)
    return unit, attempt, earlier


def damage(rec: Mapping[str, Any]) -> str | None:
    """Why the record, stripped of its place, is not a worker's record (``check_layout``); None
    where it is one. What the key index counts as odd (``keyindex.Keys``): judged once per
    layout of the record as it stands (its keys, their types, mode, config kind, kernel)."""
    try:
        lk = (tuple(rec), tuple(map(type, rec.values())), rec.get("mode"), rec.get("config"), rec.get("impl"))
        return _DAMAGE[lk]
    except KeyError:
        why = _DAMAGE[lk] = check_layout({k: v for k, v in rec.items() if k not in STRIP})[0]
        return why
    except TypeError:  # an unhashable mode, config kind or kernel
        return check_layout({k: v for k, v in rec.items() if k not in STRIP})[0]


_DAMAGE: dict[tuple[Any, ...], str | None] = {}


REPLAYED_MARK = " (replayed)"  # ends the ``reused_from`` of a replayed record carried


def provenance(path: str, unit: Any, attempt: Any, replayed: bool) -> str:
    """A carried record's ``reused_from``: the document, and the unit and attempt that measured it there."""
    return f"{path} unit {unit} attempt {attempt}" + (REPLAYED_MARK if replayed else "")


def origin(path: str, unit: Any, attempt: Any, replayed: bool, earlier: Any) -> str:
    """A carried record's ``reused_from``: ``provenance`` of the document it is carried from,
    or, where that document carried it from another (``earlier``: its ``reused_from`` there),
    that one's: the measurement it is, however many sweeps carried it since (the reuse block's
    ``measured`` time is kept under it)."""
    if isinstance(earlier, str) and earlier:
        return measurement_of(earlier) + (REPLAYED_MARK if replayed else "")
    return provenance(path, unit, attempt, replayed)


def source_of(reused_from: str) -> str:
    """The document a carried record came from (its ``reused_from`` as ``provenance`` writes it)."""
    return measurement_of(reused_from).rpartition(" unit ")[0] or measurement_of(reused_from)


def measurement_of(reused_from: str) -> str:
    """Which measurement a carried record is (its ``reused_from`` less the replayed mark): the
    key under which the reuse block keeps when it was measured (``store.append.MeasuredTimes``)."""
    return reused_from.removesuffix(REPLAYED_MARK)


def finish(rec: dict[str, Any], order: Sequence[str] | None, reused_from: str, device: str | None) -> dict[str, Any]:
    """A stripped record of a valid layout (``order``: its canonical key order, where it differs)
    as it is carried."""
    body = {k: rec[k] for k in order} if order is not None else rec
    body["reused_from"] = reused_from
    if device is not None:
        body["device"] = device
    return body


class Carried(Mapping[str, Any]):
    """A record carried from the text at ``start:end`` of the document at ``path`` (absolute),
    judged on its bytes: the item ``item_id`` it was found as, whether it is screened, an error,
    replayed (and to be marked so), and the device it is to carry. Read as a mapping it is the
    finished record (parsed on first use; ``carried_records`` reads many at once)."""

    __slots__ = ("_record", "device", "end", "error", "item_id", "mark", "path", "replayed", "screened", "start")

    def __init__(
        self,
        path: str,
        span: tuple[int, int],
        item_id: str,
        flags: tuple[bool, bool, bool, bool],
        device: str | None = None,
    ) -> None:
        self.path, (self.start, self.end), self.item_id = path, span, item_id
        self.screened, self.error, self.replayed, self.mark = flags
        self.device = device
        self._record: dict[str, Any] | None = None

    def finished(self, raw: Any) -> dict[str, Any]:
        """The record parsed from this text (``raw``), finished as it is carried; ResultsError
        when it is no longer the item it was judged as (its document changed since)."""
        from orchestrator.spec.records import record_id

        if not isinstance(raw, dict):
            raise self._changed()
        unit, attempt, earlier = strip(raw, self.mark)
        why, order = check_layout(raw)
        try:
            same = why is None and record_id(raw) == self.item_id
        except (KeyError, TypeError):
            same = False
        if not same:
            raise self._changed()
        return finish(raw, order, origin(self.path, unit, attempt, self.replayed, earlier), self.device)

    def _changed(self) -> ResultsError:
        return ResultsError(
            f"{self.path} changed while this sweep was planned (bytes {self.start}-{self.end} are no longer "
            "the record planned); plan the sweep again"
        )

    def record(self) -> dict[str, Any]:
        if self._record is None:
            with open(self.path, "rb") as f:
                f.seek(self.start)
                self._record = self.finished(loads(f.read(self.end - self.start)))
        return self._record

    def __getitem__(self, key: str) -> Any:
        return self.record()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.record())

    def __len__(self) -> int:
        return len(self.record())

    def __repr__(self) -> str:
        return f"Carried({self.path!r}, {self.start}, {self.end})"


def carried_records(records: Sequence[Mapping[str, Any]], *, raw: bool = False) -> Iterator[Mapping[str, Any]]:
    """``records`` as they are carried, in their order: a ``Carried`` one read from its
    document (mapped once, a batch parsed in one call), any other as it is; ``raw``: a
    ``Carried`` one as its document holds it (what its cost is read from), not finished."""
    maps: dict[str, mmap.mmap] = {}
    try:
        for k in range(0, len(records), _BATCH):
            batch = records[k : k + _BATCH]
            texts = [_text(maps, r) for r in batch if isinstance(r, Carried) and r._record is None]
            parsed = iter(loads(b"[" + b",".join(texts) + b"]") if texts else [])
            for r in batch:
                if isinstance(r, Carried):
                    if r._record is None:
                        yield next(parsed) if raw else r.finished(next(parsed))
                    else:
                        yield r._record
                else:
                    yield r
    finally:
        for m in maps.values():
            m.close()


def _text(maps: dict[str, mmap.mmap], r: Carried) -> bytes:
    m = maps.get(r.path)
    if m is None:
        with open(r.path, "rb") as f:
            m = maps[r.path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if r.end > len(m):
        raise r._changed()
    return m[r.start : r.end]


def flags_of(rec: Mapping[str, Any]) -> tuple[bool, bool]:
    """(screened, error) of a carried record, without reading a ``Carried`` one's text."""
    if isinstance(rec, Carried):
        return rec.screened, rec.error
    return rec.get("screened") is True, "error" in rec


def is_replayed_carry(rec: Mapping[str, Any]) -> bool:
    """Whether a carried record's ``timer`` is virtual, without reading a ``Carried`` one's text
    (found through the key index only where a record's timer alone says it is replayed)."""
    if isinstance(rec, Carried):
        return rec.replayed
    return rec.get("timer") == VIRTUAL
