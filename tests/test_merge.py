"""Merging: the reference format byte for byte, plan order, provenance, newest-wins dedupe, and
the CLI's summary. Foreign and damaged input: ``test_merge_quarantine``; append:
``test_merge_append``; the merge cache: ``test_merge_cache``."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.records import IDENTITY_FIELDS, item_id
from orchestrator.store.merge import merge, write_document
from orchestrator.store.synthetic import DEVICE, build_sweep, header, record_for, small_spec
from orchestrator.store.texts import any_record_text, record_text
from tests.merging import Sweep, append_lines, four_units, read_doc

from .conftest import SAMPLE, run_cli


@pytest.fixture
def sweep(tmp_path: Path) -> Sweep:
    return four_units(tmp_path)


# ---------------------------------------------------------------------------- format


def test_writer_is_byte_identical_to_json_dumps_on_the_reference_sample(
    sample_doc: dict[str, Any], tmp_path: Path
) -> None:
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
def test_record_text_matches_json_dumps_for_odd_values(value: object, tmp_path: Path) -> None:
    rec = {"dtype": "float32", "error": value, "tag": "t"}
    nested = {**rec, "extra": {"a": [1, {"b": value}], "c": []}}
    for r, enc in ((rec, record_text), (nested, any_record_text)):
        path = tmp_path / "d.json"
        write_document(path, {"device": {}, "config": {}, "results": None}, [enc(r), enc(r)])
        assert path.read_text() == json.dumps({"device": {}, "config": {}, "results": [r, r]}, indent=1)
    path = tmp_path / "empty.json"
    write_document(path, {"device": {"a": 1}, "results": None, "tilesweep": {}}, [])
    assert path.read_text() == json.dumps({"device": {"a": 1}, "results": [], "tilesweep": {}}, indent=1)


def test_merged_document_is_reference_format_in_plan_order_with_provenance(sweep: Sweep) -> None:
    sd, units = sweep
    summary = merge(sd)
    doc = read_doc(sd.output)
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


def test_missing_partials_count_as_missing(tmp_path: Path) -> None:
    sd, units = build_sweep(tmp_path / "s", small_spec(n_seqs=1), 4, write_partials=[1, 3])
    summary = merge(sd)
    assert summary.missing == len(units[0].items) + len(units[2].items)
    assert len(read_doc(sd.output)["results"]) == summary.records == sd.planned - summary.missing


# ---------------------------------------------------------------------------- dedupe


def test_newest_attempt_wins_within_a_partial_and_across_units(sweep: Sweep) -> None:
    sd, units = sweep
    rng = random.Random(5)
    u = units[1]
    it = u.items[3]
    newer = record_for(it, rng)
    h2 = header(sd, u.id, 2)
    h2["header"]["started"] = "2999-01-01T00:00:00+00:00"
    append_lines(sd.partial_path(u.id), [json.dumps(h2), json.dumps({"id": it.id, "attempt": 2, "record": newer})])
    summary = merge(sd)
    doc = read_doc(sd.output)
    got = [r for r in doc["results"] if item_id(r) == it.id]
    assert len(got) == 1 and got[0]["attempt"] == 2 and got[0]["median_ms"] == newer["median_ms"]
    assert summary.superseded == 1 and summary.records == sd.planned


def test_cli_merge_prints_summary_and_writes_output(sweep: Sweep, tmp_path: Path) -> None:
    sd, _ = sweep
    other = tmp_path / "elsewhere.json"
    r = run_cli("merge", str(sd.root), "--output", str(other))
    assert r.returncode == 0, r.stderr
    assert f"merged {sd.planned} records" in r.stdout
    assert len(read_doc(other)["results"]) == sd.planned
