"""The key index the merger writes beside a document: it finds every record, goes stale whenever
its document changes, lets planning with reuse read only the records it carries, and keeps a
merge over an existing document as lean as one into none (measured with tracemalloc, as a ratio
to the document's size: the same on any machine)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from orchestrator.control.reuseplan import Planned, plan_with_reuse
from orchestrator.errors import ResultsError
from orchestrator.spec.files import load_spec
from orchestrator.spec.records import item_id
from orchestrator.store import keybuild, keyindex
from orchestrator.store.merge import merge
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, small_spec
from orchestrator.store.target import inspect, plan_of
from tests.merging import read_doc


def merged(tmp_path: Path, n_seqs: int = 2, units: int = 4) -> SweepDir:
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=n_seqs), units, output=tmp_path / "results.json")
    merge(sd)
    return sd


def test_the_merger_writes_an_index_that_finds_every_record(tmp_path: Path) -> None:
    sd = merged(tmp_path)
    records = read_doc(sd.output)["results"]
    index = keyindex.read(sd.output)
    assert index is not None and keyindex.index_path(sd.output).name == ".results.json.keys"
    assert index.ids == [item_id(r) for r in records] and index.tags == ["h100_nvl"] and index.odd == 0
    data = sd.output.read_bytes()
    assert keyindex.records_at(data, index, range(len(records))) == records
    rows = list(range(0, len(records), 7))
    chunks = list(keyindex.chunks(index, rows, budget=20_000))
    assert len(chunks) > 1 and [k for c in chunks for k in c.rows] == rows
    assert [r for c in chunks for r in c.records(data[c.start : c.end])] == [records[k] for k in rows]
    # an index built from the document alone is the one the merger wrote, less the merger's
    # claim that every record is an item of its plan (which a document alone cannot say)
    written = keyindex.index_path(sd.output).read_bytes()
    assert keyindex.claim(sd.output, plan_of(sd)) == len(records)
    keyindex.index_path(sd.output).unlink()
    rebuilt = keybuild.build(sd.output, str(sd.output))
    assert rebuilt is not None and rebuilt.ids == index.ids
    assert unclaimed(keyindex.index_path(sd.output).read_bytes()) == unclaimed(written)
    assert keyindex.claim(sd.output, plan_of(sd)) is None


def test_an_index_is_stale_once_its_document_changes(tmp_path: Path) -> None:
    sd = merged(tmp_path, n_seqs=1, units=2)
    out = sd.output
    st = out.stat()
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched
    assert keyindex.read(out) is None
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert keyindex.read(out) is not None
    with open(out, "r+b") as f:  # a byte changed in place, size and mtime put back
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(b"X" if byte != b"X" else b"Y")
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert out.stat().st_size == st.st_size and keyindex.read(out) is None
    copy = tmp_path / "copy.json"
    shutil.copy(out, copy)
    assert keyindex.read(copy) is None  # no index beside it
    keyindex.index_path(out).write_bytes(b"not an index")
    assert keyindex.read(out) is None


def test_a_merge_takes_its_own_output_on_its_index_word_and_judges_anything_else(tmp_path: Path) -> None:
    """With the merge cache (and its output stamp) gone, a merge over its own last output takes
    the key index's claim that every record is an item of this plan; a plan changed since is
    judged by the index's ids, and a document edited by hand by its records: a record of
    another problem added to it is refused, in one line."""
    sd = merged(tmp_path, n_seqs=1, units=2)
    out = sd.output
    shutil.rmtree(sd.root / "merge-cache")
    assert keyindex.claim(out, plan_of(sd)) == sd.planned
    assert inspect(sd, out).records == sd.planned
    unit_file = sd.unit_path(sd.unit_index()[0]["id"])
    st = unit_file.stat()
    os.utime(unit_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # rewritten: another plan
    assert keyindex.claim(out, plan_of(sd)) is None
    judged = inspect(sd, out)
    assert (judged.records, judged.n_foreign) == (sd.planned, 0)
    merge(sd)
    doc = read_doc(out)
    doc["results"].append({**doc["results"][0], "seq": 12345})  # edited by hand
    out.write_text(json.dumps(doc, indent=1))
    shutil.rmtree(sd.root / "merge-cache")
    before = out.read_bytes()
    with pytest.raises(ResultsError, match=f"{out} holds 1 record that is not this sweep's"):
        merge(sd)
    assert out.read_bytes() == before


def plan(tmp_path: Path, doc: Path, name: str, **over: Any) -> Planned:
    """Plan the synthetic sweep's spec (executor slurm: the environment is the document's)
    against ``doc`` (``reuse.documents``), into a sweep directory of its own."""
    data = {**small_spec(n_seqs=2), "executor": {"kind": "slurm"}, "reuse": {"documents": [str(doc)]}, **over}
    spec_path = tmp_path / f"{name}.json"
    spec_path.write_text(json.dumps({**data, "output": str(tmp_path / f"{name}-out.json")}))
    return plan_with_reuse(load_spec(str(spec_path)), tmp_path / name, tmp_path / f"{name}-out.json", None, None, None)


def carried(p: Planned) -> dict[int, dict[str, Any]]:
    """The records a plan carries, by item; ``reused_from`` less the document's path."""
    return {k: {**r, "reused_from": r["reused_from"].split(" unit ")[1]} for k, (r, _) in p.found.records.items()}


def same_plan(a: Planned, b: Planned) -> None:
    assert carried(a) == carried(b)
    assert [(s.records, s.reused, s.errors_left, s.damaged, s.why) for s in a.found.sources] == [
        (s.records, s.reused, s.errors_left, s.damaged, s.why) for s in b.found.sources
    ]
    assert (a.found.costs and a.found.costs.costs) == (b.found.costs and b.found.costs.costs)
    assert [u.id for u in a.units] == [u.id for u in b.units]


def test_planning_through_the_index_plans_what_reading_the_records_plans(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sd = merged(tmp_path)
    doc = json.loads(sd.output.read_text())
    runnable = [r for r in doc["results"] if "error" not in r]
    runnable[3]["error"] = "ValueError: a failure of a runnable config"  # measured again, priced
    runnable[5]["median_ms"] = "fast"  # damaged: measured again, with a warning
    for name, where in (("indexed", tmp_path / "indexed.json"), ("read", tmp_path / "read.json")):
        where.write_text(json.dumps(doc, indent=1) if name == "indexed" else json.dumps(doc))
    keybuild.build(tmp_path / "indexed.json", "indexed.json")
    with caplog.at_level(logging.WARNING):
        through_index = plan(tmp_path, tmp_path / "indexed.json", "a")
        by_reading = plan(tmp_path, tmp_path / "read.json", "b")
    assert through_index.found.reused == len(runnable) - 2 > 0
    same_plan(through_index, by_reading)
    assert sum("median_ms is str" in r.getMessage() for r in caplog.records) == 2
    # records of problems the plan does not have are never parsed: one made unreadable, the
    # document's size, mtime and edges kept, plans what it planned with the record intact
    other = plan(tmp_path, tmp_path / "indexed.json", "c", seq_lens=[128])
    path = tmp_path / "indexed.json"
    data, st = path.read_bytes(), path.stat()
    index = keyindex.read(path)
    assert index is not None
    edge = 64 << 10  # the bytes at either end that the index's stamp hashes
    start, end = next(
        (a, b)
        for a, b in map(index.span, range(len(index.ids)))
        if edge < a and b < len(data) - edge and json.loads(data[a:b])["seq"] == 256
    )
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"!" * (end - start))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    same_plan(plan(tmp_path, path, "d", seq_lens=[128]), other)


def test_what_the_index_reads_off_the_records_bytes_is_what_parsing_them_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the index no record is parsed at planning time: whether a record is screened,
    replayed, of another device, of no known unit, or spelled in another key order is read off
    its text, and the plan is the one reading every record makes; the carried records, read when
    asked for, are those reading makes."""
    sd = merged(tmp_path)
    doc = json.loads(sd.output.read_text())
    runnable = [r for r in doc["results"] if "error" not in r]
    runnable[0]["screened"] = True  # a full sweep measures it again
    runnable[1]["device"] = "NVIDIA H100 80GB HBM3"  # another device
    del runnable[2]["unit"]  # no block says how it was measured
    runnable[3]["timer"] = "virtual"  # replayed: not taken for a measurement
    moved = runnable[4]
    doc["results"][doc["results"].index(moved)] = {"seq": moved["seq"], **moved}  # another key order: carried
    for name, where in (("indexed", tmp_path / "indexed.json"), ("read", tmp_path / "read.json")):
        where.write_text(json.dumps(doc, indent=1) if name == "indexed" else json.dumps(doc))
    index = keybuild.build(tmp_path / "indexed.json", "indexed.json")
    assert index is not None and index.odd == 0 and index.damaged == {}
    with caplog.at_level(logging.WARNING):
        through_index = plan(tmp_path, tmp_path / "indexed.json", "a")
        by_reading = plan(tmp_path, tmp_path / "read.json", "b")
    (src,) = through_index.found.sources
    assert (src.screened_left, src.other_device, src.unknown, src.replayed) == (1, 1, 1, 1)
    assert through_index.found.reused == len(runnable) - 4 > 0
    same_plan(through_index, by_reading)
    assert not [r for r in caplog.records if "key index" in r.getMessage()]
    assert keyindex.read(tmp_path / "indexed.json") is not None


def test_an_index_of_another_version_is_rebuilt_not_read(tmp_path: Path) -> None:
    sd = merged(tmp_path, n_seqs=1, units=2)
    where = keyindex.index_path(sd.output)
    written = where.read_bytes()
    head, rest = written.split(b"\n", 1)
    older = {**json.loads(head), "version": keyindex.VERSION - 1}
    where.write_bytes(json.dumps(older).encode() + b"\n" + rest)
    assert keyindex.read(sd.output) is None
    p = plan(tmp_path, sd.output, "a")
    assert p.found.reused > 0 and unclaimed(where.read_bytes()) == unclaimed(written)


@pytest.mark.parametrize("damage", ["places", "first", "last"])
def test_an_index_whose_places_are_damaged_under_a_current_stamp_is_rebuilt_not_read(
    tmp_path: Path, damage: str
) -> None:
    """An index whose header still describes its document but whose record places are not the
    document's (garbage bytes, a shifted first record, a last record past the end): not read,
    so neither a plan with reuse nor a merge over the document parses bytes that are no record
    (a traceback, or the document called invalid JSON); the plan rebuilds the index."""
    sd = merged(tmp_path, n_seqs=1, units=2)
    where = keyindex.index_path(sd.output)
    written = where.read_bytes()
    head, ids, rest = written.split(b"\n", 2)
    header = json.loads(head)
    n = header["records"]
    if damage == "places":
        rest = b"\xff" * (8 * (n + 1)) + rest[8 * (n + 1) :]
    elif damage == "first":
        header["first"] += 7
    else:
        header["first"] += len(sd.output.read_bytes())
    where.write_bytes(json.dumps(header).encode() + b"\n" + ids + b"\n" + rest)
    assert keyindex.read(sd.output) is None
    p = plan(tmp_path, sd.output, "a")
    assert p.found.reused > 0 and unclaimed(where.read_bytes()) == unclaimed(written)
    where.write_bytes(json.dumps(header).encode() + b"\n" + ids + b"\n" + rest)
    merge(sd)
    assert len(read_doc(sd.output)["results"]) == n


def unclaimed(index: bytes) -> tuple[dict[str, Any], bytes]:
    """An index's header less the merger's claim on its plan (``keyindex.claim``), and the rest."""
    head, rest = index.split(b"\n", 1)
    return {k: v for k, v in json.loads(head).items() if k != "plan"}, rest


def test_a_record_its_index_misnames_is_never_reused_as_that_item(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A document edited in place where its stamp does not look (a record's seq changed in the
    middle, size and mtime put back): the record is not carried as the item the index names,
    the plan says so in one warning and the index goes, so the next plan rebuilds it."""
    sd = merged(tmp_path)
    path, data, st = sd.output, sd.output.read_bytes(), sd.output.stat()
    index = keyindex.read(path)
    assert index is not None
    edge = 64 << 10  # the bytes at either end that the index's stamp hashes
    start, end = next(
        (a, b)
        for a, b in map(index.span, range(len(index.ids)))
        if edge < a and b < len(data) - edge and b'"seq": 256' in data[a:b] and b'"error"' not in data[a:b]
    )
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(data[start:end].replace(b'"seq": 256', b'"seq": 128'))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert keyindex.read(path) is not None  # the stamp does not see it
    with caplog.at_level(logging.WARNING):
        planned = plan(tmp_path, path, "a")
    by_index = {it.index: it for it in planned.items}
    assert planned.found.reused > 0
    assert all(item_id(r) == by_index[k].id for k, (r, _) in planned.found.records.items())
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records if "key index" in r.getMessage()] == [
        "1 record is not the item its key index .results.json.keys names (the document was changed behind it); "
        "not reused, the index removed (the next plan rebuilds it)"
    ]
    assert not keyindex.index_path(path).exists()


def test_odd_records_and_other_tags_are_matched_by_key(tmp_path: Path) -> None:
    sd = merged(tmp_path)
    doc = json.loads(sd.output.read_text())
    runnable = [r for r in doc["results"] if "error" not in r]
    runnable[0]["head_dim"] = float(runnable[0]["head_dim"])  # 64.0 == 64: a key of the plan, damaged
    runnable[1]["tag"] = "another"  # not reused (tag), priced all the same
    for name in ("indexed", "read"):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc, indent=1) if name == "indexed" else json.dumps(doc))
    index = keybuild.build(tmp_path / "indexed.json", "indexed.json")
    assert index is not None and index.odd == 1 and set(index.tags) == {"h100_nvl", "another"}
    a = plan(tmp_path, tmp_path / "indexed.json", "a")
    b = plan(tmp_path, tmp_path / "read.json", "b")
    same_plan(a, b)
    assert a.found.sources[0].damaged == 1 and a.found.reused == len(runnable) - 2


def peak_over_document(sd: SweepDir) -> float:
    """tracemalloc's peak during a merge of ``sd``, over the size of the document it writes."""
    sd = SweepDir.open(sd.root)
    sd.spec  # noqa: B018 - parsed before, as any caller holding a SweepDir has it
    tracemalloc.start()
    try:
        merge(sd)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / sd.output.stat().st_size


def test_merging_over_a_document_costs_no_more_memory_than_merging_into_none(tmp_path: Path) -> None:
    """The memory a merge needs is its own records' (a few times the document's size as
    tracemalloc counts it: 3.4 here), whether or not a document is there to be judged first (with
    the merge cache, its output stamp, deleted). A merge that parsed the document it replaces
    whole needed 16 times it. Without its key index the document is judged batch by batch, which
    at this size is one batch: ``bench/merge`` measures that case at a million records."""
    sd, _ = build_sweep(tmp_path / "sweep", small_spec(n_seqs=6), 8, output=tmp_path / "results.json")
    into_none = peak_over_document(sd)
    shutil.rmtree(sd.root / "merge-cache")
    over_indexed = peak_over_document(sd)
    assert into_none < 5 and over_indexed < 1.2 * into_none
