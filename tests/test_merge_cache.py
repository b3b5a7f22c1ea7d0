"""The merge cache: an unchanged partial is not read again, a grown one only from where it was
last read, a damaged cache or a partial rewritten in place is read whole, and every way gives
the document a merge without the cache gives."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from orchestrator.spec.records import item_id
from orchestrator.store.merge import merge
from orchestrator.store.synthetic import header, record_for
from tests.merging import Sweep, append_lines, four_units, merge_without_cache, read_doc


@pytest.fixture
def sweep(tmp_path: Path) -> Sweep:
    return four_units(tmp_path)


def test_cache_reads_only_what_changed_and_gives_the_same_document(sweep: Sweep) -> None:
    sd, units = sweep
    first = merge(sd)
    assert first.partials_cached == 0
    cold = read_doc(sd.output)
    again = merge(sd)
    assert again.partials_cached == len(units)
    assert read_doc(sd.output)["results"] == cold["results"]
    # a partial grows (a resumed worker appends): only its new lines are read
    u = units[0]
    it = u.items[0]
    newer = record_for(it, random.Random(3))
    append_lines(
        sd.partial_path(u.id),
        [json.dumps(header(sd, u.id, 2)), json.dumps({"id": it.id, "attempt": 2, "record": newer})],
    )
    grown = merge(sd)
    assert grown.partials_cached == len(units) - 1
    got = next(r for r in read_doc(sd.output)["results"] if item_id(r) == it.id)
    assert got["attempt"] == 2 and got["median_ms"] == newer["median_ms"]
    assert read_doc(sd.output)["results"] == merge_without_cache(sd)


def test_damaged_or_rewritten_cache_inputs_are_rebuilt(sweep: Sweep, caplog: pytest.LogCaptureFixture) -> None:
    sd, units = sweep
    merge(sd)
    seg = sd.root / "merge-cache" / f"{units[1].id}.seg"
    data = bytearray(seg.read_bytes())
    data[-10] ^= 0x20
    seg.write_bytes(bytes(data))
    # a partial rewritten in place with other values (same size): must be re-read
    path = sd.partial_path(units[2].id)
    text = path.read_text()
    path.write_text(text.replace('"rel_err":0.00', '"rel_err":0.01'))
    with caplog.at_level(logging.WARNING):
        summary = merge(sd)
    assert "damaged" in caplog.text and str(seg) in caplog.text
    assert summary.partials_cached == len(units) - 2
    assert read_doc(sd.output)["results"] == merge_without_cache(sd)


def test_cache_with_arrays_of_different_lengths_is_rebuilt(sweep: Sweep, caplog: pytest.LogCaptureFixture) -> None:
    """The CRC covers the record texts only: per-record arrays that do not line up are damage too."""
    sd, units = sweep
    cold = merge(sd)
    seg = sd.root / "merge-cache" / f"{units[0].id}.seg"
    meta, arrays, payload = seg.read_bytes().split(b"\n", 2)
    short = json.loads(arrays)
    short["idx"].pop()
    seg.write_bytes(meta + b"\n" + json.dumps(short, separators=(",", ":")).encode() + b"\n" + payload)
    with caplog.at_level(logging.WARNING):
        again = merge(sd)
    assert "damaged" in caplog.text and str(seg) in caplog.text
    assert again.records == cold.records == sd.planned and again.partials_cached == len(units) - 1


def test_unterminated_complete_last_line_is_merged_but_not_cached(sweep: Sweep) -> None:
    """A record whose newline was not written yet is a finished record: merge it."""
    sd, units = sweep
    path = sd.partial_path(units[0].id)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert merge(sd).records == sd.planned
    assert merge(sd).records == sd.planned  # from the cache plus the re-read tail
