"""The key index of a results document: which item each record is, and where it lies.

Planning against a document of a million records (reuse) and a merge judging the document it
would replace (``target``) need to know which items the document's records are, not what they
measured. Parsing the records to learn it costs seconds and gigabytes; so the merger, its only
writer, leaves beside each document it writes a compact index of its records' keys
(``.NAME.keys`` next to ``NAME``), and readers take the keys from there.

What it holds, per record in document order: its item id (``records.item_id``: identity and
config fields, tag included; "" for a record that has none), its tag, and its place (the byte
span of its text), so a reader parses only the records it wants. Written with ``write``, the one
writer, read with ``read``; ``keybuild.build`` makes one by parsing a document in the merger's layout
(``json.dumps(doc, indent=1)``) that has none.

Never trusted over the document: the header names the document it describes by inode, size,
mtime and a hash of its first and last 64 KiB (its head, and its tail, where the ``tilesweep``
block's merge time changes with every merge); a document that differs in any of them is
"stale" and ``read`` gives None, so callers rebuild the index or parse the document. Reuse,
which reads the records it carries at their places, checks each one against the item the
index names before using it (``reuse_indexed``: on its bytes, else its id parsed). A merge judging the
document it replaces (``target``) takes the ids of a current index as they are, as it takes its
own output stamp: what neither sees is a document edited in place beyond the hashed edges with
its size and mtime put back.

Records whose identity values are not of the layout's types (a float head_dim, a boolean heads,
as other tools may write) are "odd": their key may still equal an item's (64.0 == 64) while their
id cannot, so a reader that must match them as keys (reuse) parses such a document instead.
Records whose layout is not a worker's (a result of the wrong type, an unknown field:
``carry.damage``), which reuse refuses, are listed as ``damaged`` with the reason where the
writer knows them (``build``, which parses every record); a writer that is handed parsed records
without passing their damage on counts them odd instead (``Keys``), so a reader parses.

Layout (version ``VERSION``): a JSON header line (``KeysHeader``), a JSON line with the ids, then
``records + 1`` little-endian uint64 running sums of the record texts' lengths and ``records``
little-endian uint16 tag numbers (into the header's ``tags``). Record ``k`` starts at
``first + sums[k] + k * len(SEPARATOR)``. A file of another version, or damaged, is stale.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import os
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, islice
from pathlib import Path
from typing import IO, Any, NotRequired, TypedDict

from orchestrator.spec.records import (
    DEFAULT_IMPL,
    FIELD_TYPES,
    IDENTITY_FIELDS,
    OPTIONAL_DEFAULTS,
    config_fields,
    item_id,
)
from orchestrator.store.carry import damage
from orchestrator.store.document import BATCH_BYTES
from orchestrator.store.files import atomic_open, beside
from orchestrator.store.partials import loads
from orchestrator.store.texts import dumps

log = logging.getLogger(__name__)

FORMAT = "tilesweep-keys"
VERSION = 2  # 2: the damaged records
SEPARATOR = b",\n  "  # between two record texts (``merge.write_document``)
_EDGE = 64 << 10  # bytes of the document's head and tail that its stamp hashes
_AROUND = 64  # bytes read on either side of the records to check that the results list holds them


class DocumentStamp(TypedDict):
    """Which document an index describes."""

    ino: int
    size: int
    mtime_ns: int
    edges: str  # blake2b of the first and the last _EDGE bytes


class KeysHeader(TypedDict):
    format: str
    version: int
    document: DocumentStamp
    records: int
    first: int  # byte offset of the first record's text
    tags: list[str]
    odd: int  # records whose identity values are not of the layout's types (or damaged, where not listed)
    damaged: dict[str, str]  # record (its number, in decimal) -> why its layout is not a worker's
    plan: NotRequired[str]  # the plan every record is an item of, where the merger wrote only its own (``claim``)


@dataclass
class Keys:
    """What the merger knows of the records it writes, in document order: each one's item id
    ("" where it has none) and tag, and how many are odd (``key_of``)."""

    ids: list[str]
    tags: list[str]
    odd: int = 0
    damaged: dict[int, str] = field(default_factory=dict)  # record -> why its layout is not a worker's

    def add(self, rec: Mapping[str, Any], refused: str | None = None) -> None:
        """One more record, a document's own (its key read from it). One whose layout is not a
        worker's (``carry.damage``), or a value of which its reader ``refused``
        (``record_values.refused_values``), is ``damaged``, and counted odd too: an index written
        without the ``damaged`` records (the merger's) sends reuse to parse its document."""
        iid, odd = key_of(rec)
        why = None if odd or not iid else damage(rec) or refused
        if why is not None:
            self.damaged[len(self.ids)] = why
            odd = True
        tag = rec.get("tag")
        self.ids.append(iid)
        self.tags.append(tag if isinstance(tag, str) else "")
        self.odd += odd


@dataclass(frozen=True)
class KeyIndex:
    """An index read back: each record's id and tag, and where its text lies."""

    path: Path  # the document
    ids: list[str]
    tags: list[str]
    tag_of: array  # per record, its tag's number in ``tags``
    sums: array  # running sums of the record texts' lengths
    first: int
    odd: int
    damaged: dict[int, str]  # record -> why its layout is not a worker's (``carry.damage``)

    def bounds(self) -> tuple[int, int]:
        """(start of the first record's text, end of the last one's): ``document.results_bounds``."""
        return self.first, self.span(len(self.ids) - 1)[1]

    def span(self, k: int) -> tuple[int, int]:
        """(start, end) of record ``k``'s text in the document."""
        start = self.first + self.sums[k] + k * len(SEPARATOR)
        return start, start + self.sums[k + 1] - self.sums[k]


def index_path(doc: Path) -> Path:
    """Where the index of the document at ``doc`` lies."""
    return beside(doc, ".", ".keys")


def stamp(doc: Path) -> DocumentStamp | None:
    """The document's stamp as it is now; None where it cannot be read."""
    try:
        with open(doc, "rb") as f:
            st = os.fstat(f.fileno())
            h = hashlib.blake2b(f.read(_EDGE), digest_size=16)
            f.seek(max(0, st.st_size - _EDGE))
            h.update(f.read(_EDGE))
    except OSError:
        return None
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "edges": h.hexdigest()}


# ---------------------------------------------------------------------------- writing


def write(
    doc: Path,
    first: int,
    lengths: Iterable[int],
    ids: Sequence[str],
    tags: Sequence[str],
    odd: int = 0,
    damaged: Mapping[int, str] | None = None,
    plan: str | None = None,
    persist: bool = True,
) -> KeyIndex | None:
    """Write the index of the document just written at ``doc``: its record texts (of
    ``lengths``, in order, the first at byte ``first``) are the records of ``ids`` and ``tags``;
    returns it as ``read`` would. ``plan``: every record is an item of the plan it names (the
    merger's own records alone, ``claim``). A document without records has none (readers parse
    it: there is nothing to parse). Derived data: a failure to write it is logged and costs a
    later reader a parse. ``persist`` False: returned, not written (a dry run writes nothing)."""
    current = stamp(doc) if ids else None
    if current is None:
        if persist:
            index_path(doc).unlink(missing_ok=True)
        return None
    names = list(dict.fromkeys(tags))
    number = {t: k for k, t in enumerate(names)}
    header: KeysHeader = {
        "format": FORMAT,
        "version": VERSION,
        "document": current,
        "records": len(ids),
        "first": first,
        "tags": names,
        "odd": odd,
        "damaged": {str(k): why for k, why in (damaged or {}).items()},
    }
    if plan is not None:
        header["plan"] = plan
    sums = array("Q", accumulate(lengths, initial=0))
    tag_of = array("H", map(number.__getitem__, tags))
    ids = ids if isinstance(ids, list) else list(ids)
    index = KeyIndex(doc, ids, names, tag_of, sums, first, odd, dict(damaged or {}))
    if len(sums) != len(ids) + 1:
        raise ValueError(f"{len(sums) - 1} record texts for {len(ids)} ids")
    if sys.byteorder != "little":  # pragma: no cover - the layout is little-endian everywhere
        sums, tag_of = array("Q", sums), array("H", tag_of)
        sums.byteswap()
        tag_of.byteswap()
    if not persist:
        return index
    try:
        with atomic_open(index_path(doc), "wb", fsync=False) as f:
            f.write(dumps(header) + b"\n")
            _write_ids(f, index.ids)
            f.write(sums.tobytes())
            f.write(tag_of.tobytes())
    except OSError as exc:
        log.info("key index of %s not written (%s); readers will parse the document", doc, exc.strerror or exc)
    return index


# ---------------------------------------------------------------------------- reading


def _write_ids(f: IO[bytes], ids: list[str], chunk: int = 1 << 16) -> None:
    """The ids as one JSON array and a newline, written a chunk at a time (the merger writes the
    index while it holds every record text: the array's text whole would add to its peak)."""
    f.write(b"[")
    for k in range(0, len(ids), chunk):
        f.write((b"," if k else b"") + dumps(ids[k : k + chunk])[1:-1])
    f.write(b"]\n")


def read(doc: Path) -> KeyIndex | None:
    """The index of the document at ``doc``, or None where there is none, or it is stale or
    damaged (the caller parses the document, or ``build``s one)."""
    current = stamp(doc)
    try:
        data = index_path(doc).read_bytes()
    except OSError:
        return None
    if current is None:
        return None
    try:
        nl1 = data.index(b"\n")
        head = loads(data[:nl1])
        if not _describes(head, current):
            return None
        nl2 = data.index(b"\n", nl1 + 1)
        ids = loads(data[nl1 + 1 : nl2])
        n = int(head["records"])
        sums, tag_of = array("Q"), array("H")
        sums.frombytes(data[nl2 + 1 : nl2 + 1 + 8 * (n + 1)])
        tag_of.frombytes(data[nl2 + 1 + 8 * (n + 1) :])
        if sys.byteorder != "little":  # pragma: no cover
            sums.byteswap()
            tag_of.byteswap()
        if not (len(ids) == n == len(tag_of) and len(sums) == n + 1):
            raise ValueError("columns of different lengths")
        damaged = {int(k): str(why) for k, why in head["damaged"].items()}
        index = KeyIndex(doc, ids, list(head["tags"]), tag_of, sums, int(head["first"]), int(head["odd"]), damaged)
        _check_places(index, current["size"])
        return index
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        log.info("key index %s is damaged (%s); it is not used", index_path(doc), exc)
        return None


def _check_places(index: KeyIndex, size: int) -> None:
    """ValueError unless the index's places can be the document's: record texts of rising
    ends, the first starting ``{`` right after the results list opens and the last ending
    ``}`` right before it closes, within the document's ``size`` bytes. A damaged index that
    its header's stamp still passes would otherwise send a reader to parse bytes that are no
    record, and blame the document."""
    sums, first = index.sums, index.first
    if not index.ids or sums[0] != 0 or not all(map(operator.lt, sums, islice(sums, 1, None))):
        raise ValueError("record places that do not rise")
    end = index.bounds()[1]
    if not 0 < first < end <= size:
        raise ValueError(f"record places {first}..{end} outside the document's {size} bytes")
    with open(index.path, "rb") as f:
        f.seek(max(0, first - _AROUND))
        before = f.read(first - max(0, first - _AROUND) + 1)
        f.seek(end - 1)
        after = f.read(_AROUND + 1)
    if not (before.endswith(b"{") and before[:-1].rstrip().endswith(b"[")):
        raise ValueError(f"no record starts at byte {first}")
    if not (after.startswith(b"}") and after[1:].lstrip().startswith(b"]")):
        raise ValueError(f"no record ends at byte {end}")


def claim(doc: Path, plan: str) -> int | None:
    """How many records the document at ``doc`` holds, where its current index says that every
    one of them is an item of ``plan`` (written so by the merger); None otherwise. Reads the
    index's header line alone: a merge judging its own last output parses no id."""
    current = stamp(doc)
    try:
        with open(index_path(doc), "rb") as f:
            head = loads(f.readline())
    except (OSError, ValueError):
        return None
    if not isinstance(head, dict) or current is None or not _describes(head, current) or head.get("plan") != plan:
        return None
    records = head.get("records")
    return records if type(records) is int else None


def _describes(head: dict[str, Any], current: DocumentStamp) -> bool:
    """Whether an index header ``head`` is of this format and version and describes the
    document as it is now (``current``: its ``stamp``)."""
    return head.get("format") == FORMAT and head.get("version") == VERSION and head.get("document") == current


def records_at(data: bytes, index: KeyIndex, rows: Sequence[int]) -> list[dict[str, Any]]:
    """The records ``rows`` of the document whose bytes are ``data``, parsed in one go."""
    parts = [data[a:b] for a, b in map(index.span, rows)]
    return loads(b"[" + b",".join(parts) + b"]") if parts else []


@dataclass(frozen=True)
class Chunk:
    """Records of a document that lie close together: the bytes from ``start`` to ``end`` hold
    the texts at ``spans`` (offsets into those bytes) of the records ``rows``."""

    start: int
    end: int
    rows: list[int]
    spans: list[tuple[int, int]]

    def records(self, data: bytes) -> list[dict[str, Any]]:
        """The chunk's records, from its bytes ``data``, parsed in one go."""
        return loads(b"[" + b",".join([data[a:b] for a, b in self.spans]) + b"]") if self.rows else []


def chunks(index: KeyIndex, rows: Sequence[int], budget: int = BATCH_BYTES) -> Iterator[Chunk]:
    """``rows`` (sorted) in chunks whose texts lie within ``budget`` bytes (a text longer than
    that alone), so a reader holds one chunk's bytes at a time and parses its records in one
    call. The places of half a million rows are worked out as arrays, a chunk at a time."""
    if not len(rows):
        return
    import numpy as np  # here, not at the top: a run or merge that reads no index's places never loads it

    sums = np.frombuffer(index.sums, dtype=np.uint64).astype(np.int64)
    r = np.asarray(rows, dtype=np.int64)
    starts = index.first + sums[r] + r * len(SEPARATOR)
    ends = starts + (sums[r + 1] - sums[r])
    i, n = 0, len(r)
    while i < n:
        start = int(starts[i])
        j = max(i + 1, int(np.searchsorted(ends, start + budget, side="right")))
        offsets = list(zip((starts[i:j] - start).tolist(), (ends[i:j] - start).tolist(), strict=True))
        yield Chunk(start, int(ends[j - 1]), r[i:j].tolist(), offsets)
        i = j


def key_of(rec: Mapping[str, Any]) -> tuple[str, bool]:
    """(the record's item id, "" where its fields make none or it is odd; whether it is odd:
    an identity or config value not of the layout's type, whose key may equal an item's while
    its id cannot, or the reverse)."""
    try:
        iid = item_id(rec)
        names = IDENTITY_FIELDS + config_fields(rec["mode"], rec["config"], rec.get("impl", DEFAULT_IMPL))
    except (KeyError, TypeError, ValueError):  # a field missing, an unknown kernel implementation
        return "", False
    odd = any(type(rec[k]) not in FIELD_TYPES[k] for k in names) or any(
        type(rec[k]) not in FIELD_TYPES[k] for k in OPTIONAL_DEFAULTS if k in rec
    )
    return ("" if odd else iid), odd
