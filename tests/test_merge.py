"""Merging: the reference format byte for byte, plan order, provenance, newest-wins dedupe,
foreign and damaged input quarantined (never merged, never deleted), append, the cache."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from orchestrator.errors import ResultsError
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.records import IDENTITY_FIELDS, item_id
from orchestrator.store.merge import merge, write_document
from orchestrator.store.segments import any_record_text, record_text
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import DEVICE, build_sweep, header, record_for, small_spec
from tests.helpers import assert_one_line_error

from .conftest import SAMPLE, run_cli


@pytest.fixture
def sweep(tmp_path: Path):
    """A sweep of 4 units x 100 items, every partial complete."""
    return build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 4, output=tmp_path / "results.json")


def _doc(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    doc = json.loads(text)
    assert json.dumps(doc, indent=1) == text  # the reference format, byte for byte
    return doc


def _append_lines(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


# ---------------------------------------------------------------------------- format


def test_writer_is_byte_identical_to_json_dumps_on_the_reference_sample(sample_doc, tmp_path):
    texts = [record_text(r) for r in sample_doc["results"]]
    path = tmp_path / "doc.json"
    write_document(path, {"device": sample_doc["device"], "config": sample_doc["config"], "results": None}, texts)
    assert path.read_bytes() == SAMPLE.read_bytes()


@pytest.mark.parametrize(
    "value",
    [
        1e-05,
        1e16,
        -0.0,
        float("nan"),
        float("inf"),
        2**70,
        "é ✓ \u2028",
        'say "hi",\n   "x": 1},\n  {',
        "",
        None,
        True,
    ],
)
def test_record_text_matches_json_dumps_for_odd_values(value, tmp_path):
    rec = {"dtype": "float32", "error": value, "tag": "t"}
    nested = {**rec, "extra": {"a": [1, {"b": value}], "c": []}}
    for r, enc in ((rec, record_text), (nested, any_record_text)):
        path = tmp_path / "d.json"
        write_document(path, {"device": {}, "config": {}, "results": None}, [enc(r), enc(r)])
        assert path.read_text() == json.dumps({"device": {}, "config": {}, "results": [r, r]}, indent=1)
    path = tmp_path / "empty.json"
    write_document(path, {"device": {"a": 1}, "results": None, "tilesweep": {}}, [])
    assert path.read_text() == json.dumps({"device": {"a": 1}, "results": [], "tilesweep": {}}, indent=1)


def test_merged_document_is_reference_format_in_plan_order_with_provenance(sweep):
    sd, units = sweep
    summary = merge(sd)
    doc = _doc(sd.output)
    assert list(doc) == ["device", "config", "results", "tilesweep"]
    assert doc["device"] == {k: DEVICE[k] for k in ("jax", "backend", "devices", "python", "device_kind")}
    assert doc["config"] == sd.spec.reference_config()
    assert [item_id(r) for r in doc["results"]] == [it.id for it in sd.items()]  # plan order
    assert summary.records == len(doc["results"]) == sd.planned and summary.missing == 0
    assert summary.errors == sum("error" in r for r in doc["results"]) > 0
    ts = doc["tilesweep"]
    assert ts["fingerprint"] == sd.spec.fingerprint() and ts["env"] == env_fingerprint(DEVICE)
    assert ts["spec"] == sd.spec.model_dump(mode="json") and ts["planned"] == sd.planned
    unit_of = {it.id: u.id for u in units for it in u.items}
    for r in doc["results"]:
        assert r["unit"] == unit_of[item_id(r)]
        assert r["attempt"] in {a["attempt"] for a in ts["attempts"][r["unit"]]}
        keys = list(r)
        assert keys[:8] == list(IDENTITY_FIELDS) and keys[-2:] == ["unit", "attempt"]
    assert not any(sd.root.glob("quarantine/*"))


def test_missing_partials_count_as_missing(tmp_path):
    sd, units = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 4, write_partials=[1, 3])
    summary = merge(sd)
    assert summary.missing == len(units[0].items) + len(units[2].items)
    assert len(_doc(sd.output)["results"]) == summary.records == sd.planned - summary.missing


# ---------------------------------------------------------------------------- dedupe


def test_newest_attempt_wins_within_a_partial_and_across_units(sweep):
    sd, units = sweep
    rng = random.Random(5)
    u = units[1]
    it = u.items[3]
    newer = record_for(it, rng)
    h2 = header(sd, u.id, 2)
    h2["header"]["started"] = "2999-01-01T00:00:00+00:00"
    _append_lines(sd.partial_path(u.id), [json.dumps(h2), json.dumps({"id": it.id, "attempt": 2, "record": newer})])
    summary = merge(sd)
    doc = _doc(sd.output)
    got = [r for r in doc["results"] if item_id(r) == it.id]
    assert len(got) == 1 and got[0]["attempt"] == 2 and got[0]["median_ms"] == newer["median_ms"]
    assert summary.superseded == 1 and summary.records == sd.planned


# ---------------------------------------------------------------------------- foreign / damaged


def _quarantined(sd: SweepDir) -> list[Path]:
    return sorted(p for p in (sd.root / "quarantine").glob("*") if p.name != "quarantine.jsonl")


@pytest.mark.parametrize("case", ["other spec", "other env", "other schema", "other unit", "garbage", "no header"])
def test_foreign_or_damaged_partial_is_quarantined_never_merged_never_deleted(sweep, caplog, case):
    sd, units = sweep
    victim = units[2]
    path = sd.partial_path(victim.id)
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    if case == "other spec":
        head["header"]["sweep"] = "0123456789abcdef"
    elif case == "other env":
        head["header"]["env"] = {**head["header"]["env"], "jax": "0.4.30", "device_kind": "NVIDIA A100"}
    elif case == "other schema":
        head["header"]["schema"] = 7
    elif case == "other unit":
        head["header"]["unit"] = units[0].id
    lines[0] = json.dumps(head)
    if case == "garbage":
        lines = ["\x00\x01 this is not a partial", "PK\x03\x04"]
    if case == "no header":
        lines = lines[1:]
    path.write_text("\n".join(lines) + "\n")
    original = path.read_bytes()
    with caplog.at_level(logging.WARNING):
        summary = merge(sd)
    assert not path.exists()
    moved = _quarantined(sd)
    assert len(moved) == 1 and moved[0].read_bytes() == original  # nothing deleted
    assert [q.source for q in summary.quarantined] == [path]
    assert str(path) in caplog.text and str(moved[0]) in caplog.text
    doc = _doc(sd.output)
    ids = {item_id(r) for r in doc["results"]}
    assert ids == {it.id for u in units if u is not victim for it in u.items}
    log = [json.loads(line) for line in (sd.root / "quarantine" / "quarantine.jsonl").read_text().splitlines()]
    assert log[0]["file"] == str(path) and log[0]["moved_to"] == moved[0].name
    # the CLI run shows one line naming the file too; the unit counts as missing, not lost
    assert summary.missing == len(victim.items)


def test_quarantine_refuses_when_it_cannot_move(sweep):
    """Where the file cannot be moved aside, the merge stops naming it (never merges it)."""
    from orchestrator.errors import PartialError

    sd, units = sweep
    path = sd.partial_path(units[0].id)
    path.write_text("garbage\n")
    (sd.root / "quarantine").write_text("a file where the quarantine folder should be")
    before = sd.output.exists()
    with pytest.raises(PartialError, match=str(path)):
        merge(sd)
    assert path.read_text() == "garbage\n" and sd.output.exists() == before
    r = run_cli("merge", str(sd.root))
    assert_one_line_error(r, str(path))


def test_invalid_record_line_is_skipped_with_a_warning_and_counts_as_missing(sweep, caplog):
    sd, units = sweep
    path = sd.partial_path(units[0].id)
    lines = path.read_text().splitlines()
    n = next(i for i, ln in enumerate(lines) if '"median_ms"' in ln)
    obj = json.loads(lines[n])
    obj["record"]["median_ms"] = "0.1 ms"
    lines[n] = json.dumps(obj)
    lines.append(lines[n][:40])  # and a torn last line, of the same item (one recorded elsewhere would be moot)
    path.write_text("\n".join(lines))
    with caplog.at_level(logging.WARNING):
        summary = merge(sd)
    assert f"{path} line {n + 1}" in caplog.text and "wrong type" in caplog.text
    assert f"{path} line {len(lines)}" in caplog.text and "torn" in caplog.text
    assert obj["id"] not in {item_id(r) for r in _doc(sd.output)["results"]}
    assert summary.missing == 1 and summary.skipped_lines == 2
    assert path.exists()  # a damaged line is not a foreign file


def test_stray_file_in_partials_is_named_and_not_merged(sweep, caplog):
    sd, _ = sweep
    stray = sd.partials / "copied-from-elsewhere.jsonl"
    stray.write_text("{}\n")
    with caplog.at_level(logging.WARNING):
        merge(sd)
    assert str(stray) in caplog.text and stray.exists()


# ---------------------------------------------------------------------------- append


def _earlier_document(path: Path, sd: SweepDir, device_kind: str = "NVIDIA H100") -> dict:
    """A document from an earlier sweep: 3 records of this sweep's items (measured long ago),
    2 of another problem, and a second copy of one of ours."""
    rng = random.Random(9)
    items = sd.items()
    ours = [{**record_for(it, rng), "unit": "old", "attempt": 1} for it in items[:3]]
    other = [{**r, "seq": 99999, "note": {"kept": [1, 2]}} for r in ours[:2]]
    doc = {
        "device": {**{k: DEVICE[k] for k in ("jax", "backend", "devices", "python")}, "device_kind": device_kind},
        "config": {"tag": "earlier"},
        "results": [other[0], *ours, other[1], ours[0]],
        "tilesweep": {
            "fingerprint": "earlier-sweep",
            "spec": {},
            "attempts": {"old": [{"attempt": 1, "started": "2001-01-01T00:00:00+00:00"}]},
        },
    }
    path.write_text(json.dumps(doc, indent=1))
    return doc


def _append_sweep(tmp_path: Path, **merge_opts):
    out = tmp_path / "results.json"
    return build_sweep(tmp_path / "sweep", small_spec(n_seqs=1, append=True, merge=merge_opts), 4, output=out)


def test_append_replaces_same_identity_keeps_others_untouched(tmp_path):
    sd, _ = _append_sweep(tmp_path)
    old = _earlier_document(sd.output, sd)
    summary = merge(sd)
    doc = _doc(sd.output)
    res = doc["results"]
    assert res[0] == old["results"][0] and res[4] == old["results"][4]  # untouched, in place
    assert [item_id(r) for r in res[1:4]] == [item_id(r) for r in old["results"][1:4]]
    assert all(r["unit"] != "old" for r in res[1:4])  # newest wins
    ids = [item_id(r) for r in res]
    assert len(ids) == len(set(ids)) and len(res) == sd.planned + 2  # the second copy is gone
    assert summary.kept_from_existing == 2
    assert doc["tilesweep"]["earlier"][0]["fingerprint"] == "earlier-sweep"
    merge(sd)  # idempotent: merging again changes no record and does not nest provenance
    again = _doc(sd.output)
    assert again["results"] == res and len(again["tilesweep"]["earlier"]) == 1


def test_append_keeps_a_record_the_document_measured_later(tmp_path):
    """Newest wins both ways: re-merging an older sweep does not undo a later one's record."""
    sd, _ = _append_sweep(tmp_path)
    old = _earlier_document(sd.output, sd)
    old["tilesweep"]["attempts"]["later"] = [{"attempt": 3, "started": "2999-01-01T00:00:00+00:00"}]
    old["results"][2] = {**old["results"][2], "unit": "later", "attempt": 3}
    sd.output.write_text(json.dumps(old, indent=1))
    summary = merge(sd)
    res = _doc(sd.output)["results"]
    assert res[2] == old["results"][2]  # measured after this sweep: kept untouched
    assert res[1]["unit"] != "old" and res[3]["unit"] != "old"  # measured before: replaced
    ids = [item_id(r) for r in res]
    assert len(ids) == len(set(ids)) == sd.planned + 2 and summary.kept_from_existing == 3


def test_append_into_another_device_is_refused_unless_mixing(tmp_path):
    sd, _ = _append_sweep(tmp_path)
    _earlier_document(sd.output, sd, device_kind="NVIDIA A100")
    before = sd.output.read_bytes()
    with pytest.raises(ResultsError, match="mix_devices"):
        merge(sd)
    assert sd.output.read_bytes() == before
    r = run_cli("merge", str(sd.root))
    assert_one_line_error(r, str(sd.output))


def test_append_with_mix_devices_tags_every_record_with_its_device(tmp_path):
    sd, _ = _append_sweep(tmp_path, mix_devices=True)
    _earlier_document(sd.output, sd, device_kind="NVIDIA A100")
    merge(sd)
    res = _doc(sd.output)["results"]
    assert {r["device"] for r in res} == {"NVIDIA A100", "NVIDIA H100"}
    assert sum(r["device"] == "NVIDIA A100" for r in res) == 2
    assert len(res) == sd.planned + 2


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "not valid JSON"),
        ('{"device": {}, "results": []}', "missing top-level key(s) config"),
        ('{"device": {}, "config": {}, "results": [{"seq": 1}]}', "results[0] lacks identity field(s)"),
    ],
)
def test_append_into_a_file_that_is_not_a_results_document_is_refused_with_the_way_out(tmp_path, content, why):
    """The append target is read by the one results-document reader: what it refuses is
    named in one line, with the way out, and the file is left as it was."""
    sd, _ = _append_sweep(tmp_path)
    sd.output.write_text(content)
    r = run_cli("merge", str(sd.root))
    line = assert_one_line_error(r, str(sd.output), why, "append: false")
    assert "move it away" in line and sd.output.read_text() == content


def test_append_into_a_document_holding_nan_keeps_it(tmp_path):
    """The stdlib writes NaN for a broken kernel's rel_err; orjson refuses it, the one
    results-document reader (append, report, compare) must not."""
    from orchestrator.store.document import load

    sd, _ = _append_sweep(tmp_path)
    old = _earlier_document(sd.output, sd)
    old["results"][0]["rel_err"] = float("nan")
    sd.output.write_text(json.dumps(old, indent=1))
    merge(sd)
    res = load(sd.output).results
    assert res[0]["seq"] == 99999 and res[0]["rel_err"] != res[0]["rel_err"]  # kept, still NaN
    assert len(res) == sd.planned + 2


# ---------------------------------------------------------------------------- merge cache


def test_cache_reads_only_what_changed_and_gives_the_same_document(sweep):
    sd, units = sweep
    first = merge(sd)
    assert first.partials_cached == 0
    cold = _doc(sd.output)
    again = merge(sd)
    assert again.partials_cached == len(units)
    assert _doc(sd.output)["results"] == cold["results"]
    # a partial grows (a resumed worker appends): only its new lines are read
    u = units[0]
    it = u.items[0]
    newer = record_for(it, random.Random(3))
    _append_lines(
        sd.partial_path(u.id),
        [json.dumps(header(sd, u.id, 2)), json.dumps({"id": it.id, "attempt": 2, "record": newer})],
    )
    grown = merge(sd)
    assert grown.partials_cached == len(units) - 1
    got = next(r for r in _doc(sd.output)["results"] if item_id(r) == it.id)
    assert got["attempt"] == 2 and got["median_ms"] == newer["median_ms"]
    assert _doc(sd.output)["results"] == merge_without_cache(sd)


def merge_without_cache(sd: SweepDir) -> list:
    out = sd.output.with_name("nocache.json")
    merge(sd, output=out, use_cache=False)
    return _doc(out)["results"]


def test_damaged_or_rewritten_cache_inputs_are_rebuilt(sweep, caplog):
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
    assert _doc(sd.output)["results"] == merge_without_cache(sd)


def test_cache_with_arrays_of_different_lengths_is_rebuilt(sweep, caplog):
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


def test_unterminated_complete_last_line_is_merged_but_not_cached(sweep):
    """A record whose newline was not written yet is a finished record: merge it."""
    sd, units = sweep
    path = sd.partial_path(units[0].id)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert merge(sd).records == sd.planned
    assert merge(sd).records == sd.planned  # from the cache plus the re-read tail


def test_cli_merge_prints_summary_and_writes_output(sweep, tmp_path):
    sd, _ = sweep
    other = tmp_path / "elsewhere.json"
    r = run_cli("merge", str(sd.root), "--output", str(other))
    assert r.returncode == 0, r.stderr
    assert f"merged {sd.planned} records" in r.stdout
    assert len(_doc(other)["results"]) == sd.planned
