"""Reuse: what an earlier results document holds is carried into a sweep, not
measured again, only where it was measured the same way on the same device; what cannot be
reused is said, once, with counts.

One real sweep (interpret mode, real compiles) makes the first document; the rest plans
against it or against copies of it changed the way a user's documents differ."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.control.reuseplan import ReuseRequest
from orchestrator.spec.files import load_spec
from orchestrator.store.sweepdir import SweepDir
from tests.conftest import SAMPLE, TINY_SPEC, run_cli
from tests.helpers import assert_one_line_error
from tests.reuse_helpers import EXTENDED, FIRST, markers, plan_against, write


def test_an_extended_grid_compiles_only_its_new_config(tmp_path: Path, first_doc: Path) -> None:
    out = tmp_path / "results.json"
    shutil.copy(first_doc, out)
    spec = write(tmp_path, "extended.json", {**EXTENDED, "output": str(out)})
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug")
    assert r.returncode == 0, r.stderr
    assert f"reused 2 items measured before (not measured again): 2 from {out}" in r.stderr
    workers = [m for m in markers(sweep) if "reused" not in m]
    assert sum(m["compiled"] for m in workers) == 1 and len(workers) < len(markers(sweep))  # the new block_q only
    starts = [json.loads(line) for p in (sweep / "partials").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert sum("start" in line for line in starts) == 1
    doc = json.loads(out.read_text())
    assert len(doc["results"]) == 3 and doc["tilesweep"]["reused"]["records"] == 2
    reused = [rec for rec in doc["results"] if "reused_from" in rec]
    assert {rec.get("block_q") for rec in reused} == {None, 32}  # auto and the first config
    assert all(rec["reused_from"].startswith(f"{out} unit ") for rec in reused)
    first = {(rec["config"], rec.get("block_q")): rec for rec in json.loads(first_doc.read_text())["results"]}
    for rec in reused:  # carried as measured
        assert rec["median_ms"] == first[(rec["config"], rec.get("block_q"))]["median_ms"]
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert st["complete"] and st["done"] == 3
    # a rerun of the same spec into a new sweep directory measures nothing at all
    again = plan_against(tmp_path, {**EXTENDED}, ReuseRequest([str(out)]))
    assert again.found.reused == 3 and again.units == []


def test_other_timing_or_another_device_reuses_nothing(
    tmp_path: Path, first_doc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slower = plan_against(
        tmp_path, {**EXTENDED, "timing": {**FIRST["timing"], "target_ms": 2}}, ReuseRequest([str(first_doc)])
    )
    (src,) = slower.found.sources
    assert slower.found.reused == 0 and src.other_measurement == 2
    assert src.why == ["measured with other settings: ms per sample 1.0 vs 2.0 here"]
    spec = write(tmp_path, "slower.json", {**EXTENDED, "timing": {**FIRST["timing"], "target_ms": 2}})
    said = run_cli("plan", str(spec), "--dry-run", "--reuse", str(first_doc)).stdout
    not_reused = f"  not reused from {first_doc}: 2 measured with other settings (ms per sample 1.0 vs 2.0 here)\n"
    assert not_reused in said  # the reason said once, its detail beside it, not again in brackets
    # timing.timer auto (the first document's) is the wall clock here: a wall sweep reuses it, a device one not
    wall = plan_against(
        tmp_path, {**EXTENDED, "timing": {**FIRST["timing"], "timer": "wall"}}, ReuseRequest([str(first_doc)])
    )
    device = plan_against(
        tmp_path, {**EXTENDED, "timing": {**FIRST["timing"], "timer": "device"}}, ReuseRequest([str(first_doc)])
    )
    assert wall.found.reused == 2 and device.found.reused == 0
    assert device.found.sources[0].why == ['measured with other settings: timing.timer "wall" vs "device" here']
    doc = json.loads(first_doc.read_text())
    doc["tilesweep"]["env"]["device_kind"] = doc["device"]["device_kind"] = "NVIDIA H100 80GB HBM3"
    other = write(tmp_path, "h100.json", doc)
    with caplog.at_level(logging.WARNING):
        elsewhere = plan_against(tmp_path, EXTENDED, ReuseRequest([str(other)]))
    assert elsewhere.found.reused == 0 and elsewhere.found.sources[0].other_device == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    (warning,) = warnings
    assert str(other) in warning and '2 records of device "NVIDIA H100 80GB HBM3"' in warning
    mixed = plan_against(tmp_path, {**EXTENDED, "merge": {"mix_devices": True}}, ReuseRequest([str(other)]))
    assert mixed.found.reused == 2
    assert all(rec["device"] == "NVIDIA H100 80GB HBM3" for rec, _ in mixed.found.records.values())


def test_carried_records_are_this_sweeps_to_overwrite_and_prev(tmp_path: Path, first_doc: Path) -> None:
    """Issue 10's rules over reuse: records carried from the output are not another sweep's,
    --overwrite keeps the old document as .prev even when carried records make the new one as
    long, and a record reused from another document is this sweep's to a later merge, while a
    record of that document that is no item of the plan never gets in."""
    doc = json.loads(first_doc.read_text())
    stranger = {**doc["results"][0], "seq": 128, "unit": "elsewhere"}  # another sweep's problem
    out = write(tmp_path, "results.json", {**doc, "results": [*doc["results"], stranger]})
    before = out.read_bytes()
    spec = write(tmp_path, "extended.json", {**EXTENDED, "append": False, "output": str(out)})
    sweep = tmp_path / "a"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug")
    assert_one_line_error(r, "holds 1 record that is not this sweep's", "--overwrite")
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert f"kept as {out}.prev" in r.stderr and (tmp_path / "results.json.prev").read_bytes() == before
    measured = json.loads(out.read_text())["results"]
    assert len(measured) == 3 and sum("reused_from" in rec for rec in measured) == 2
    offered = write(tmp_path, "offered.json", {**json.loads(out.read_text()), "results": [*measured, stranger]})
    other = tmp_path / "other.json"
    spec = write(tmp_path, "again.json", {**EXTENDED, "append": False, "output": str(other)})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "b"), "--executor", "debug", "--reuse", str(offered))
    assert r.returncode == 0 and f"reused 3 items measured before (not measured again): 3 from {offered}" in r.stderr
    assert [m for m in markers(tmp_path / "b") if "reused" not in m] == []  # nothing measured
    carried = json.loads(other.read_text())["results"]
    assert len(carried) == 3 and {rec["seq"] for rec in carried} == {64}
    os.utime(other, ns=(1, 1))  # not the merger's own output any more: judged record by record
    r = run_cli("merge", str(tmp_path / "b"))
    assert r.returncode == 0 and not (tmp_path / "other.json.prev").exists(), r.stderr


# Record fields of a problem variant or another kernel (the optional identity fields), and
# the spec fields that plan exactly those records.
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "causal": ({"causal": True}, {"causal": [True]}),
    "grouped-query": ({"heads": 2, "kv_heads": 1}, {"heads": 2, "kv_heads": [1]}),
    "jax's kernel": ({"impl": "jax"}, {"kernel": {**TINY_SPEC["kernel"], "impl": "jax"}}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_record_is_reused_only_for_its_own_variant_and_kernel(tmp_path: Path, first_doc: Path, variant: str) -> None:
    fields, spec_fields = VARIANTS[variant]
    doc = json.loads(first_doc.read_text())
    for rec in doc["results"]:
        rec.update(fields)
    doc["tilesweep"]["spec"].update({k: v for k, v in spec_fields.items() if k == "kernel"})
    source = write(tmp_path, "variant.json", doc)
    plain = plan_against(tmp_path, EXTENDED, ReuseRequest([str(source)]))
    assert plain.found.reused == 0 and plain.found.sources[0].records == 0  # not even a candidate
    assert plan_against(tmp_path, {**EXTENDED, **spec_fields}, ReuseRequest([str(first_doc)])).found.reused == 0
    same = plan_against(tmp_path, {**EXTENDED, **spec_fields}, ReuseRequest([str(source)]))
    assert same.found.reused == 2
    assert all(rec[k] == v for rec, _ in same.found.records.values() for k, v in fields.items())


def test_a_plan_interrupted_before_its_units_is_planned_again_with_its_reuse(tmp_path: Path, first_doc: Path) -> None:
    """A Ctrl-C after sweep.json is written and before the units are leaves a directory without
    units: planning it again with --reuse carries what the document holds, as the first plan would."""
    spec_path = write(tmp_path, "extended.json", {**EXTENDED, "output": str(tmp_path / "out.json")})
    sweep = tmp_path / "sweep"
    out = (tmp_path / "out.json").resolve()
    SweepDir.create(sweep, load_spec(str(spec_path)), output=out, spec_source=str(spec_path.resolve()), planned=0)
    r = run_cli("plan", str(spec_path), "--sweep-dir", str(sweep), "--reuse", str(first_doc))
    assert r.returncode == 0, r.stderr
    units = SweepDir.open(sweep).unit_index()
    assert sorted((u["origin"], u["n_items"]) for u in units) == [("plan", 1), ("reuse", 2)]


def test_errors_are_measured_again_unless_asked_and_remeasure_overrides(tmp_path: Path, first_doc: Path) -> None:
    doc = json.loads(first_doc.read_text())
    forced = next(rec for rec in doc["results"] if rec["config"] == "forced")
    for k in ("rel_err", "compile_s", "inner", "median_ms", "q1_ms", "q3_ms"):
        forced.pop(k)
    forced["error"] = "CompileError: a failure a new jax may fix"
    failed = write(tmp_path, "failed.json", doc)
    assert plan_against(tmp_path, EXTENDED, ReuseRequest([str(failed)])).found.reused == 1  # auto only
    asked = plan_against(tmp_path, {**EXTENDED, "reuse": {"errors": True}}, ReuseRequest([str(failed)]))
    assert asked.found.reused == 2 and asked.found.sources[0].errors == 1
    overridden = ReuseRequest([str(failed)], remeasure="errors", errors=True)
    assert plan_against(tmp_path, EXTENDED, overridden).found.reused == 1
    everything = plan_against(tmp_path, EXTENDED, ReuseRequest([str(first_doc)], remeasure="all"))
    assert everything.found.reused == 0 and sum(len(u.items) for u in everything.units) == 3
    assert everything.found.costs is not None and len(everything.found.costs) == 2  # costs for free all the same


# ---------------------------------------------------------------------------- halving, replayed

HALVING = {
    "dtypes": ["bfloat16"],
    "head_dims": [64],
    "seq_lens": [2048],
    "modes": ["fwd"],
    "fwd_block_k": [32, 64],
    "sharding": {"units": 2},
    "timing": {"strategy": "halving", "keep": 2},
    "append": True,
    "kernel": {"impl": "replay"},
    "replay": {"source": str(SAMPLE)},
    "executor": {"kind": "debug"},
}


def test_halving_reuses_full_records_as_done_and_screens_as_screens(tmp_path: Path) -> None:
    config = json.loads(SAMPLE.read_text())["config"]
    out = tmp_path / "results.json"
    first = write(tmp_path, "first.json", {**config, **HALVING, "output": str(out)})
    assert run_cli("run", str(first), "--sweep-dir", str(tmp_path / "a")).returncode == 0
    before = {
        (r["block_q"], r["block_k"], r["num_stages"], r["num_warps"]): r
        for r in json.loads(out.read_text())["results"]
        if r["config"] == "forced"
    }
    full_before = {k for k, r in before.items() if "screened" not in r and "error" not in r}
    extended = write(tmp_path, "extended.json", {**config, **HALVING, "fwd_block_k": [32, 64, 128], "output": str(out)})
    sweep = tmp_path / "b"
    r = run_cli("run", str(extended), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    units = json.loads((sweep / "units.json").read_text())
    measured = [
        json.loads(line)
        for u in units
        if u["origin"] != "reuse"
        for line in (sweep / "partials" / f"{u['id']}.jsonl").read_text().splitlines()
    ]
    records = [line["record"] for line in measured if "record" in line]
    round1 = [rec for rec in records if rec.get("screened") or "error" in rec]
    assert round1 and all(rec["block_k"] == 128 for rec in round1)  # round 1 screens only the new configs
    timed = {
        (r["block_q"], r["block_k"], r["num_stages"], r["num_warps"])
        for r in records
        if r["config"] == "forced" and not r.get("screened") and "error" not in r
    }
    assert not timed & full_before  # a config timed in full before is never timed again
    doc = json.loads(out.read_text())
    assert len(doc["results"]) == 1 + 3 * 3 * 3 * 2 and doc["tilesweep"]["reused"]["records"] == 1 + len(before)


def test_a_document_scanned_in_batches_is_the_document_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reuse reads documents with ``document.scan``: records in batches of text (so a million
    records are never alive at once), the same records ``load`` gives, in any layout."""
    from orchestrator.errors import ResultsError
    from orchestrator.store import document

    monkeypatch.setattr(document, "BATCH_BYTES", 2000)  # a few records per batch
    full = document.load(SAMPLE)
    compact = write(tmp_path, "compact.json", json.loads(SAMPLE.read_text()))  # one line: loaded whole
    more = tmp_path / "more.json"  # another tool's top-level array of objects after the results
    more.write_text(json.dumps({**json.loads(SAMPLE.read_text()), "notes": [{"by": "hand"}]}, indent=1))
    for path, n_batches in ((SAMPLE, 30), (compact, 1), (more, 30)):
        loaded, scanned = document.load(path), document.scan(path)
        batches = list(scanned.batches)
        assert [rec for b in batches for rec in b] == loaded.results and len(batches) >= n_batches
        assert (scanned.doc.device, scanned.doc.config, scanned.doc.extra) == (
            loaded.device,
            loaded.config,
            loaded.extra,
        )
    broken = tmp_path / "broken.json"  # the last bfloat16 record, in a late batch, lacks its dtype
    last = len(full.results) - 1 - [r["dtype"] for r in reversed(full.results)].index("bfloat16")
    text = SAMPLE.read_text()
    at = text.rfind('"dtype": "bfloat16"')
    broken.write_text(text[:at] + '"dtype_": "bfloat16"' + text[at + len('"dtype": "bfloat16"') :])
    with pytest.raises(ResultsError, match=rf"results\[{last}\] lacks identity field\(s\) dtype"):
        list(document.scan(broken).batches)


def _dated(doc: dict[str, Any], started: str, scale: float) -> dict[str, Any]:
    """``doc`` as if its sweep had run at ``started``, every timing scaled by ``scale``."""
    ts = json.loads(json.dumps(doc["tilesweep"]))
    for attempts in ts["attempts"].values():
        for a in attempts:
            a["started"] = started
    timed = ("median_ms", "q1_ms", "q3_ms")
    results = [
        {
            **r,
            **{k: r[k] * scale for k in timed if k in r},
            **({"samples_ms": [v * scale for v in r["samples_ms"]]} if r.get("samples_ms") else {}),
        }
        for r in doc["results"]
    ]
    return {**doc, "tilesweep": ts, "results": results}


def test_a_carried_record_is_as_new_as_its_measurement_not_its_carrying(tmp_path: Path, first_doc: Path) -> None:
    """Exported beside a newer measurement of the same items, a record carried into another
    sweep's document is the older one: it was measured when its source measured it."""
    doc = json.loads(first_doc.read_text())
    old = write(tmp_path, "old.json", _dated(doc, "2001-01-01T00:00:00+00:00", 1.0))
    newer = write(tmp_path, "newer.json", _dated(doc, "2002-01-01T00:00:00+00:00", 3.0))
    carried = tmp_path / "carried.json"
    spec = write(tmp_path, "carry.json", {**FIRST, "append": False, "output": str(carried)})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "c"), "--executor", "debug", "--reuse", str(old))
    assert r.returncode == 0 and "reused 2 items" in r.stderr, r.stderr
    exported = run_cli("export", str(newer), "--out", "-")
    assert exported.returncode == 0, exported.stderr
    want = {e["median_ms"] for e in json.loads(exported.stdout)["entries"]}
    for order in ((newer, carried), (carried, newer)):
        exported = run_cli("export", *map(str, order), "--out", "-")
        assert exported.returncode == 0, exported.stderr
        assert {e["median_ms"] for e in json.loads(exported.stdout)["entries"]} == want


def test_the_report_and_its_page_say_what_reuse_carried_from_where_and_when_it_was_measured(
    tmp_path: Path, first_doc: Path
) -> None:
    """A sweep that carries two records of an earlier document and measures one: the report and
    the page say how many records were carried, from which document, and when they were
    measured there; the page's "measured" starts then, not when the sweep carrying them planned."""
    old = write(tmp_path, "old.json", _dated(json.loads(first_doc.read_text()), "2001-01-01T00:00:00+00:00", 1.0))
    out, page = tmp_path / "carried.json", tmp_path / "carried.html"
    spec = write(tmp_path, "extended.json", {**EXTENDED, "append": False, "output": str(out)})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "c"), "--executor", "debug", "--reuse", str(old))
    assert r.returncode == 0, r.stderr
    said = f"2 of 3 records carried from earlier documents (not measured again): 2 from {old}; measured there 2001-"
    assert f"reused: {said}" in r.stdout  # the table that ends the run says it too
    r = run_cli("report", str(out), "--html", str(page))
    assert r.returncode == 0, r.stderr
    assert f"\nreused: {said}01-01T00:00:00+00:00\n" in r.stdout
    text = page.read_text()
    assert f"<dt>reused</dt><dd>{said}01-01T00:00:00+00:00</dd>" in text
    assert "<dt>measured</dt><dd>2001-01-01T00:00:00+00:00 to " in text
