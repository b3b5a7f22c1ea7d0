"""Reuse through a document's key index, on the bytes of its record texts: no record parsed.

The key index (``keyindex``) says which records of the document are items of the plan (by item
id), where their texts lie, and which are damaged (refused as such). What judging a record needs
beyond that is read off its text, which the merger writes one field a line
(``texts.record_text``: a record's own fields at three spaces of indent, nothing else there):
whether it has an ``error``, is ``screened``, has a virtual ``timer`` (a replayed record, where
the document's blocks name no replay: else ``store.reuse`` parses), carries a ``device``, and its
``unit`` where the document's blocks measured in more than one way. A chunk of texts without a
needle skips the search for it record by record.

Never trusted over the document: each text must begin with the identity and config fields of
the item the index names, byte for byte as the merger writes that item's record
(``texts.record_text``); a text that does not is parsed and its id checked
(``reuse_sources.checked``), so an index gone wrong without its stamp seeing it costs the
measurements of the records it misnames, never a record filed under another item. A record
taken is held by its place (``carry.Carried``), read and checked again when the reuse unit is
written.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import defaultdict
from typing import Any

from orchestrator.planning import WorkItem
from orchestrator.store import keyindex
from orchestrator.store.carry import Carried
from orchestrator.store.document import paused_gc
from orchestrator.store.partials import loads
from orchestrator.store.replayed import VIRTUAL
from orchestrator.store.reuse_accept import WHY_OF, Chosen, Judge, offer, say
from orchestrator.store.reuse_sources import Source, checked, distrust
from orchestrator.store.texts import record_text


def _needle(key: str) -> bytes:
    """How a record's own field ``key`` begins in its text."""
    return f'\n   "{key}": '.encode()


_ERROR, _SCREENED, _TIMER, _DEVICE, _UNIT = map(_needle, ("error", "screened", "timer", "device", "unit"))
_TRUE = _SCREENED + b"true"
_VIRTUAL = _TIMER + json.dumps(VIRTUAL).encode()
_ENDS = (b",", b"\n")


class _Expected:
    """Whether a text begins with an item's identity and config fields as the merger writes
    them (``check``), the text made once per problem and once per config. What sets the
    problems of one plan apart is its dtype, head_dim, seq, mode, config kind and variant
    (batch, heads, tag and kernel are the spec's)."""

    def __init__(self) -> None:
        self.problems: dict[tuple[Any, ...], bytes] = {}
        self.configs: dict[str, dict[tuple[Any, ...], bytes]] = defaultdict(dict)

    def check(self, buf: bytes, a: int, it: WorkItem) -> bool:
        """Whether the text at ``buf[a:]`` begins as the record of ``it``."""
        head = self.problems.get((it.dtype, it.head_dim, it.seq, it.mode, it.config, it.causal, it.kv_heads))
        if head is None:
            head = self._head(it)
        if not buf.startswith(head, a):
            return False
        params = it.params
        if not params:
            return True
        tail = self.configs[it.mode].get(params)
        if tail is None:
            tail = self._tail(it)
        return buf.startswith(tail, a + len(head))

    def _head(self, it: WorkItem) -> bytes:
        fields = it.record_fields()
        for name in it.param_names:
            del fields[name]
        key = (it.dtype, it.head_dim, it.seq, it.mode, it.config, it.causal, it.kv_heads)
        head = self.problems[key] = record_text(fields)[:-4] + b",\n"
        return head

    def _tail(self, it: WorkItem) -> bytes:
        tail = record_text(dict(zip(it.param_names, it.params, strict=True)))[2:-4] + b",\n"
        self.configs[it.mode][it.params] = tail
        return tail


def _flag(buf: bytes, needle: bytes, a: int, b: int) -> bool:
    """Whether the text ``buf[a:b]`` has the field line beginning ``needle`` (a whole value)."""
    i = buf.find(needle, a, b)
    return i >= 0 and buf[i + len(needle) : i + len(needle) + 1] in _ENDS


def _value(buf: bytes, needle: bytes, a: int, b: int) -> tuple[bool, Any]:
    """(whether the text ``buf[a:b]`` has the field of ``needle``, its value)."""
    i = buf.find(needle, a, b)
    if i < 0:
        return False, None
    i += len(needle)
    j = buf.find(b"\n", i, b)
    return True, loads(buf[i : b if j < 0 else j].rstrip(b","))


class _Chunk:
    """Which needles a chunk of texts holds at all (``n`` records lie in it)."""

    def __init__(self, buf: bytes, n: int, one_block: bool) -> None:
        self.error = _ERROR in buf
        self.screened = _TRUE in buf
        self.virtual = _VIRTUAL in buf
        self.device = _DEVICE in buf
        # every record has a unit and every unit is measured alike: no need to read which
        self.any_unit = one_block and buf.count(_UNIT + b'"') == n

    def marked(self, buf: bytes, spans: list[tuple[int, int]]) -> set[int]:
        """Which of the chunk's records (by place among ``spans``) may hold a needle: the rest
        are ``_PLAIN`` where ``any_unit`` holds."""
        found: set[int] = set()
        starts = [a for a, _ in spans]
        for present, needle in ((self.error, _ERROR), (self.screened, _TRUE), (self.virtual, _VIRTUAL)):
            i = buf.find(needle) if present else -1
            while i >= 0:
                found.add(bisect_right(starts, i) - 1)
                i = buf.find(needle, i + 1)
        if self.device:
            i = buf.find(_DEVICE)
            while i >= 0:
                found.add(bisect_right(starts, i) - 1)
                i = buf.find(_DEVICE, i + 1)
        return found


def scan_indexed(src: Source, judge: Judge, chosen: Chosen, how: tuple[int, int]) -> None:
    """``store.reuse._scan`` through the key index of ``src`` (the module doc): offer each record
    of an item of the plan that ``judge`` accepts; price the first one met of each item left
    (``how``: the document's (repeats, warmup))."""
    index = src.index
    assert index is not None
    scan = _Scan(src, judge, chosen, how)
    rows = [k for k, iid in enumerate(index.ids) if iid in judge.want.by_id]
    with open(src.path, "rb") as f, paused_gc():
        for chunk in keyindex.chunks(index, rows):
            f.seek(chunk.start)
            scan.chunk(f.read(chunk.end - chunk.start), chunk)
    if scan.lied:
        distrust(src, scan.lied)


class _Scan:
    """One source's records of the plan, a chunk at a time."""

    def __init__(self, src: Source, judge: Judge, chosen: Chosen, how: tuple[int, int]) -> None:
        assert src.index is not None
        self.src, self.index, self.judge, self.chosen, self.how = src, src.index, judge, chosen, how
        self.one_block = judge.own is not None and all(b is judge.own for b in judge.units.values())
        self.expected = _Expected()
        self.lied = 0
        self.mark = judge.want.marks_replayed(True)  # a replayed record taken is marked so
        self.verdicts: dict[_Facts, tuple[str | None, str | None]] = {}

    def chunk(self, buf: bytes, chunk: keyindex.Chunk) -> None:
        has = _Chunk(buf, chunk.rows[-1] - chunk.rows[0] + 1, self.one_block)
        if has.any_unit and self.taken(_PLAIN):
            self.plain(buf, chunk, has.marked(buf, chunk.spans), has)
            return
        ids, by_id = self.index.ids, self.judge.want.by_id
        for k, (a, b) in zip(chunk.rows, chunk.spans, strict=True):
            self.one(buf, chunk.start, k, by_id[ids[k]], (a, b), has)

    def one(self, buf: bytes, start: int, k: int, it: WorkItem, span: tuple[int, int], has: _Chunk) -> None:
        """Check and judge the record ``k`` of the item ``it``, its text at ``span`` of ``buf``."""
        a, b = span
        if self.expected.check(buf, a, it):
            facts = _facts(buf, a, b, has)
        else:
            rec = self.parsed(buf[a:b], it)
            if rec is None:
                return
            facts = _parsed_facts(rec)
        self.offer(k, it, (start + a, start + b), facts)

    def parsed(self, text: bytes, it: WorkItem) -> dict[str, Any] | None:
        """A text not as the merger writes the record of ``it``, parsed, its id checked; None
        (counted) where it is not that item's record."""
        rec = checked(text, it)
        if rec is None:
            self.lied += 1
        return rec

    def taken(self, facts: _Facts) -> bool:
        """Whether a record of these facts, of the document's device, not damaged, is taken."""
        want = self.judge.want
        return want.reuse and self.judge(facts[0], facts[1], facts[2], self.judge.doc_kind, facts[4]) is None

    def plain(self, buf: bytes, chunk: keyindex.Chunk, marked: set[int], has: _Chunk) -> None:
        """``chunk``, whose records not ``marked`` are ``_PLAIN`` and taken as such (the hot loop
        of a document of a million records: ``offer`` inlined)."""
        ids, by_id, check = self.index.ids, self.judge.want.by_id, self.expected.check
        chosen, priced, path, damaged = self.chosen, self.judge.want.priced, self.src.path, self.index.damaged
        flags, start, kind = (False, False, False, False), chunk.start, self.judge.doc_kind
        device = str(kind) if kind is not None and kind != self.judge.want.env.get("device_kind") else None
        taken = 0
        for j, (k, (a, b)) in enumerate(zip(chunk.rows, chunk.spans, strict=True)):
            it = by_id[ids[k]]
            if j in marked or (damaged and k in damaged) or not check(buf, a, it):
                self.one(buf, start, k, it, (a, b), has)
                continue
            taken += 1
            carried = Carried(path, (start + a, start + b), it.id, flags, device)
            index = it.index
            if index in chosen or priced:
                offer(chosen, self.judge.want, index, carried, path)
            else:
                chosen[index] = (carried, path)
        self.judge.count.records += taken

    def offer(self, k: int, it: WorkItem, span: tuple[int, int], facts: _Facts) -> None:
        """Judge the record ``k`` of the item ``it`` (its text at ``span``, ``facts`` read off it)."""
        want = self.judge.want
        unit, screened, virtual, device, error = facts
        carried = Carried(self.src.path, span, it.id, (screened, error, virtual, virtual and self.mark))
        priced = want.priced
        if not want.reuse:
            priced.setdefault(it.index, (carried, self.how, it))
            return
        self.judge.count.records += 1
        try:
            verdict = self.verdicts.get(facts) or self.verdicts.setdefault(facts, self.verdict(facts))
        except TypeError:  # a unit or device of a damaged record that is no string
            verdict = self.verdict(facts)
        why, carried.device = verdict
        if why is None and k in self.index.damaged:
            why = "damaged"
            say(self.judge.count, f"{WHY_OF['damaged']} (first: {self.index.damaged[k]})")
        if why is not None:
            self.judge.refuse(why)
            priced.setdefault(it.index, (carried, self.how, it))
            return
        if it.index in self.chosen:
            offer(self.chosen, want, it.index, carried, self.src.path)
        else:  # the common case, ``offer`` inlined: nothing taken for the item yet
            priced.pop(it.index, None)
            self.chosen[it.index] = (carried, self.src.path)

    def verdict(self, facts: _Facts) -> tuple[str | None, str | None]:
        """(``Judge``'s verdict on a record of these facts, the device it carries if taken)."""
        unit, screened, virtual, device, error = facts
        kind = device if device is not _NONE else self.judge.doc_kind
        why = self.judge(unit, screened, virtual, kind, error)
        return why, (str(kind) if kind is not None and kind != self.judge.want.env.get("device_kind") else None)


_NONE = object()  # a record without a device field
_Facts = tuple[Any, bool, bool, Any, bool]  # unit, screened, virtual timer, device (or _NONE), error
_PLAIN: _Facts = ("", False, False, _NONE, False)  # a unit measured as every other, and nothing else


def _facts(buf: bytes, a: int, b: int, has: _Chunk) -> _Facts:
    """What judging the record whose text is ``buf[a:b]`` needs, read off its bytes."""
    if has.any_unit:
        unit: Any = ""  # a unit, measured as every other
    else:
        present, unit = _value(buf, _UNIT, a, b)
        unit = unit if present else None
    device: Any = _NONE
    if has.device:
        present, value = _value(buf, _DEVICE, a, b)
        device = value if present else _NONE
    return (
        unit,
        has.screened and _flag(buf, _TRUE, a, b),
        has.virtual and _flag(buf, _VIRTUAL, a, b),
        device,
        has.error and buf.find(_ERROR, a, b) >= 0,
    )


def _parsed_facts(rec: dict[str, Any]) -> _Facts:
    """``_facts`` of a record parsed."""
    return (
        rec.get("unit"),
        rec.get("screened") is True,
        rec.get("timer") == VIRTUAL,
        rec.get("device", _NONE),
        "error" in rec,
    )
