"""The documents reuse reads (``store.reuse``): each one's head, and its records of a plan's items.

A document with a current key index (``keyindex``: the merger writes one beside every document)
is read through it: the index says which records are items of the plan (by item id) and where
they lie, so only those are read, a few megabytes of text at a time (``reuse_indexed`` judges
them on their bytes; ``indexed_records`` parses them, for a document whose blocks name a replay);
the rest of the document is never read. A document in the merger's layout without a current index gets one
(``keybuild.build``: it is parsed once, the index written beside it where its folder allows).
A document of another layout, or one whose index holds records keyed otherwise than the plan
(another tag, or odd records: ``keyindex``), is read batch by batch (``document.scan``) and its
records matched by key, as any reader without an index would.

The index is never trusted over the document: ``keyindex.read`` gives none for a document that
changed since it was written. A record read through it is checked against the item the index
names before it is offered (its text begins as that item's record, else it is parsed and its id
checked: ``checked``): an index gone wrong
without its stamp seeing it (the document edited in place, its size and mtime put back) costs
the measurements of the records it misnames, never a record filed under another item (the
merger checks every carried record's id against its item too: ``partials.classify``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ResultsError
from orchestrator.planning import WorkItem
from orchestrator.spec.records import record_id
from orchestrator.store import keybuild, keyindex
from orchestrator.store.document import ResultsDoc, paused_gc, read_head, scan
from orchestrator.store.keyindex import KeyIndex
from orchestrator.store.partials import loads

log = logging.getLogger(__name__)


@dataclass
class Source:
    """One document offered for reuse: the output document or a named one; ``doc`` is its head
    (no records), ``index`` its key index where it has a current one, ``batches`` its records
    for a reader matching them by key (read once, and only when iterated)."""

    doc: ResultsDoc
    role: str  # "output", "--reuse" or "reuse.documents"
    path: str  # absolute: what reused records' ``reused_from`` says
    batches: Iterator[list[dict[str, Any]]] = field(default_factory=lambda: iter(()))
    index: KeyIndex | None = None

    def keyed_by_id(self, tag: str) -> bool:
        """Whether the index finds every record of the document that has an item of a plan of
        ``tag``: by id, which holds the tag (a record of another tag is matched by its key,
        tag aside, for its cost)."""
        return self.index is not None and not self.index.odd and set(self.index.tags) <= {tag}


def load_sources(
    output: Path, named: Iterable[str], from_spec: Iterable[str] = (), keep_index: bool = True
) -> list[Source]:
    """The output document when it exists (a file there that is not a results document is
    left to the merger, which refuses it in one line or, asked to, overwrites it: only logged
    here), then each document named
    with ``--reuse`` and in the spec's ``reuse.documents``, each a results document or a tokamax
    table (``store.tokamax_table``: it prices and seeds, none of it is reused); one line otherwise.
    ``keep_index`` False: a key index built for a document is not written beside it (a dry run)."""
    out: list[Source] = []
    seen: set[str] = set()
    if output.is_file():
        try:
            out.append(_source(output, "output", keep_index))
            seen.add(os.path.realpath(output))
        except ResultsError as exc:
            log.info("%s; nothing reused from it", exc.message)
    for role, paths in (("--reuse", named), ("reuse.documents", from_spec)):
        for path in paths:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            out.append(_source(Path(path), role, keep_index))
    return out


def _source(path: Path, role: str, keep_index: bool = True) -> Source:
    """The document at ``path`` as a source: through its key index (read, or built), else scanned."""
    name = f"{role} {path}" if role != "output" else str(path)
    index = keyindex.read(path) if path.is_file() else None
    if index is None and path.is_file():
        index = keybuild.build(path, name, persist=keep_index)
    if index is None:
        head = scan(path, role=None if role == "output" else role, tokamax=role != "output")
        return Source(head.doc, role, os.path.abspath(path), head.batches)
    doc = read_head(path, index.bounds(), role=None if role == "output" else role)
    return Source(doc, role, os.path.abspath(path), _scanned(path, role), index)


def _scanned(path: Path, role: str) -> Iterator[list[dict[str, Any]]]:
    """The document's records batch by batch, read when first asked for."""
    yield from scan(path, role=None if role == "output" else role).batches


def indexed_records(src: Source, items: dict[str, WorkItem]) -> Iterator[tuple[dict[str, Any], WorkItem]]:
    """(record, item) for each record of ``src`` that is one of ``items`` (by id), in document
    order, read through its key index, a few megabytes of the document at a time."""
    index = src.index
    assert index is not None
    ids = index.ids
    rows = [k for k, iid in enumerate(ids) if iid in items]
    lied = 0
    with open(src.path, "rb") as f, paused_gc():
        for chunk in keyindex.chunks(index, rows):
            f.seek(chunk.start)
            for k, rec in zip(chunk.rows, chunk.records(f.read(chunk.end - chunk.start)), strict=True):
                item = items[ids[k]]
                if _id_or_none(rec) == item.id:
                    yield rec, item
                else:
                    lied += 1
    if lied:
        distrust(src, lied)


def checked(text: bytes, item: WorkItem) -> dict[str, Any] | None:
    """The record of ``text`` parsed, where it is the item ``item`` (its id checked: ``_id_or_none``);
    None where it is not, or no record at all."""
    try:
        rec = loads(text)
    except ValueError:
        return None
    return rec if _id_or_none(rec) == item.id else None


def _id_or_none(rec: object) -> str | None:
    """The id of the record's identity and config fields (``records.record_id``: spelled by the
    layout's types, so a record of other types has none that equals an item's); None for a
    record without them."""
    try:
        return record_id(rec) if isinstance(rec, dict) else None
    except (KeyError, TypeError):
        return None


def distrust(src: Source, lied: int) -> None:
    """An index whose records are not the items it names: its document was changed in a way its
    stamp does not see (edited in place, size and mtime put back). Those records are not reused
    (their items are measured again) and the index is removed, so the next reader rebuilds it."""
    where = keyindex.index_path(Path(src.path))
    log.warning(
        "%s: %d record%s not the item%s its key index %s names (the document was changed behind it); "
        "not reused, the index removed (the next plan rebuilds it)",
        src.path,
        lied,
        " is" if lied == 1 else "s are",
        "" if lied == 1 else "s",
        where.name,
    )
    try:
        where.unlink(missing_ok=True)
    except OSError as exc:
        log.info("key index %s not removed (%s)", where, exc.strerror or exc)
