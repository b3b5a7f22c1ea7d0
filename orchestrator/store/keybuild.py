"""A key index built for a results document that has none (``keyindex``'s layout): the
document parsed once, in batches, its records checked as ``document.scan`` checks them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from orchestrator.store.document import BATCH_BYTES, check_records, parse_json, paused_gc, results_bounds
from orchestrator.store.keyindex import SEPARATOR, KeyIndex, Keys, write
from orchestrator.store.record_values import refused_values

_BETWEEN = re.compile(rb"\n  \},\n  \{")  # a record's end, the separator, the next record's start


def build(doc: Path, name: str, persist: bool = True) -> KeyIndex | None:
    """Parse the document at ``doc`` (the merger's layout; None for another, or one without
    records) and write its index. Its records are checked as ``document.scan`` checks them
    (``ResultsError`` naming the document as ``name``), and one holding a value no worker writes
    (``record_values.refused_values``) is listed as damaged. Reads the whole document, as
    ``scan`` does: what a reader without an index pays once. ``persist`` False: the index is
    returned, not written (a dry run writes nothing)."""
    try:
        data = doc.read_bytes()
    except OSError:
        return None
    bounds = results_bounds(data)
    if bounds is None:
        return None
    first, stop = bounds
    ends = [m.start() + 4 for m in _BETWEEN.finditer(data, first, stop)] + [stop]
    lengths = [end - start for start, end in zip([first, *(e + len(SEPARATOR) for e in ends[:-1])], ends, strict=True)]
    keys = Keys([], [])
    with paused_gc():
        for pos, size in _batches(first, lengths):
            batch = parse_json(b"[" + data[pos : pos + size] + b"]", name)
            check_records(batch, name, len(keys.ids))
            refused = refused_values(batch)
            for j, rec in enumerate(batch):
                keys.add(rec, refused.get(j))
    del data
    return write(doc, first, lengths, keys.ids, keys.tags, keys.odd - len(keys.damaged), keys.damaged, persist=persist)


def _batches(first: int, lengths: Sequence[int], budget: int = BATCH_BYTES) -> Iterator[tuple[int, int]]:
    """(offset, bytes) of runs of whole records of about ``budget`` bytes, separators between."""
    pos, size = first, 0
    for n in lengths:
        if size and size + n > budget:
            yield pos, size
            pos, size = pos + size + len(SEPARATOR), 0
        size += n + (len(SEPARATOR) if size else 0)
    if size:
        yield pos, size
