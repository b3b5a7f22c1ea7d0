"""Merging with ``append: true``: the document's records are kept in place, the newest record of
an identity wins both ways, another device is refused unless mixing, and a file that is not a
results document is refused with the way out."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ResultsError
from orchestrator.spec.records import item_id
from orchestrator.store.merge import merge
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import DEVICE, build_sweep, record_for, small_spec
from tests.helpers import assert_one_line_error
from tests.merging import Sweep, read_doc

from .conftest import run_cli


def _earlier_document(path: Path, sd: SweepDir, device_kind: str = "NVIDIA H100") -> dict[str, Any]:
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


def _append_sweep(tmp_path: Path, **merge_opts: Any) -> Sweep:
    out = tmp_path / "results.json"
    return build_sweep(tmp_path / "sweep", small_spec(n_seqs=1, append=True, merge=merge_opts), 4, output=out)


def test_append_replaces_same_identity_keeps_others_untouched(tmp_path: Path) -> None:
    sd, _ = _append_sweep(tmp_path)
    old = _earlier_document(sd.output, sd)
    summary = merge(sd)
    doc = read_doc(sd.output)
    res = doc["results"]
    assert res[0] == old["results"][0] and res[4] == old["results"][4]  # untouched, in place
    assert [item_id(r) for r in res[1:4]] == [item_id(r) for r in old["results"][1:4]]
    assert all(r["unit"] != "old" for r in res[1:4])  # newest wins
    ids = [item_id(r) for r in res]
    assert len(ids) == len(set(ids)) and len(res) == sd.planned + 2  # the second copy is gone
    assert summary.kept_from_existing == 2
    assert doc["tilesweep"]["earlier"][0]["fingerprint"] == "earlier-sweep"
    merge(sd)  # idempotent: merging again changes no record and does not nest provenance
    again = read_doc(sd.output)
    assert again["results"] == res and len(again["tilesweep"]["earlier"]) == 1


def test_append_keeps_a_record_the_document_measured_later(tmp_path: Path) -> None:
    """Newest wins both ways: re-merging an older sweep does not undo a later one's record."""
    sd, _ = _append_sweep(tmp_path)
    old = _earlier_document(sd.output, sd)
    old["tilesweep"]["attempts"]["later"] = [{"attempt": 3, "started": "2999-01-01T00:00:00+00:00"}]
    old["results"][2] = {**old["results"][2], "unit": "later", "attempt": 3}
    sd.output.write_text(json.dumps(old, indent=1))
    summary = merge(sd)
    res = read_doc(sd.output)["results"]
    assert res[2] == old["results"][2]  # measured after this sweep: kept untouched
    assert res[1]["unit"] != "old" and res[3]["unit"] != "old"  # measured before: replaced
    ids = [item_id(r) for r in res]
    assert len(ids) == len(set(ids)) == sd.planned + 2 and summary.kept_from_existing == 3


def test_append_into_another_device_is_refused_unless_mixing(tmp_path: Path) -> None:
    sd, _ = _append_sweep(tmp_path)
    _earlier_document(sd.output, sd, device_kind="NVIDIA A100")
    before = sd.output.read_bytes()
    with pytest.raises(ResultsError, match="mix_devices"):
        merge(sd)
    assert sd.output.read_bytes() == before
    r = run_cli("merge", str(sd.root))
    assert_one_line_error(r, str(sd.output))


def test_append_with_mix_devices_tags_every_record_with_its_device(tmp_path: Path) -> None:
    sd, _ = _append_sweep(tmp_path, mix_devices=True)
    _earlier_document(sd.output, sd, device_kind="NVIDIA A100")
    merge(sd)
    res = read_doc(sd.output)["results"]
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
def test_append_into_a_file_that_is_not_a_results_document_is_refused_with_the_way_out(
    tmp_path: Path, content: str, why: str
) -> None:
    """The append target is read by the one results-document reader: what it refuses is
    named in one line, with the way out, and the file is left as it was."""
    sd, _ = _append_sweep(tmp_path)
    sd.output.write_text(content)
    r = run_cli("merge", str(sd.root))
    line = assert_one_line_error(r, str(sd.output), why, "append: false")
    assert "move it away" in line and sd.output.read_text() == content


def test_append_into_a_document_holding_nan_keeps_it(tmp_path: Path) -> None:
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


def test_append_over_another_sweeps_records_keeps_the_old_document_as_prev(tmp_path: Path) -> None:
    """Replacing records another sweep measured is a loss to undo: the old document is kept as
    ``.prev``; merging the same sweep again replaces only its own records and keeps that ``.prev``."""
    sd, _ = _append_sweep(tmp_path)
    _earlier_document(sd.output, sd)
    before = sd.output.read_bytes()
    summary = merge(sd)
    prev = sd.output.with_name(sd.output.name + ".prev")
    assert summary.prev == prev and prev.read_bytes() == before
    merge(sd)
    assert prev.read_bytes() == before


def test_a_replay_appended_into_a_measured_document_never_replaces_its_measurements(
    tmp_path: Path, write_spec: Any
) -> None:
    """A replayed record is no measurement: appended into a document that measured the same
    items, the measurements stay (whatever their times) and the replay adds only what is new."""
    from orchestrator.store import synthetic
    from tests.helpers import TINY_SPEC

    out, source = tmp_path / "results.json", tmp_path / "source.json"
    measured = synthetic.document({**TINY_SPEC, "modes": ["fwd"], "output": str(out)})
    out.write_text(json.dumps(measured))
    source.write_text(json.dumps(measured))
    spec = write_spec(
        modes=["fwd"],
        append=True,
        kernel={"impl": "replay"},
        replay={"source": str(source)},
        executor={"kind": "local"},
    )
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert r.returncode == 0, r.stderr
    res = read_doc(out)["results"]
    assert len(res) == len(measured["results"]) and all(rec.get("timer") != "virtual" for rec in res)
    assert [item_id(rec) for rec in res] == [item_id(rec) for rec in measured["results"]]
