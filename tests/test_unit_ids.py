"""Which sweep measured a record: unit ids that name the sweep, a new id for every resumed
unit, sweep directories that keep the ids they were planned with, and a measured span that
runs to the attempts' ends. Replayed sweeps in this process's debug executor: real CLI
commands, no compile."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from orchestrator.spec.identity import canonical_hash
from tests.helpers import run_cli, sample_replay_spec

UNIT_LINE = re.compile(r"^\s+unit\s+\d+ ([0-9a-f]{12}):")


def _spec(tmp_path: Path, name: str, **over: Any) -> Path:
    """bf16 d64 s2048 fwd (55 items: auto and 54 configs) replayed from the excerpt, in one unit, debug executor."""
    one_unit = {
        "dtypes": ["bfloat16"],
        "head_dims": [64],
        "seq_lens": [2048],
        "modes": ["fwd"],
        "sharding": {"units": 1},
    }
    return sample_replay_spec(tmp_path / f"{name}.json", tmp_path / f"{name}.results.json", **{**one_unit, **over})


def _planned_ids(spec: Path) -> list[str]:
    r = run_cli("plan", str(spec), "--dry-run")
    assert r.returncode == 0, r.stderr
    return [m.group(1) for line in r.stdout.splitlines() if (m := UNIT_LINE.match(line))]


def test_two_sweeps_of_the_same_items_timed_differently_have_their_own_unit_ids(tmp_path: Path) -> None:
    a = _planned_ids(_spec(tmp_path, "a"))
    b = _planned_ids(_spec(tmp_path, "b", repeats=7))
    assert len(a) == len(b) == 1 and a != b
    assert _planned_ids(_spec(tmp_path, "c")) == a  # the same sweep plans the same ids


def test_a_resumed_unit_gets_a_new_id_its_records_name_it_and_the_span_runs_to_its_end(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "s")
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    (old,) = [u["id"] for u in json.loads((sweep / "units.json").read_text())]
    # nothing ran the unit: resume --units 1 hands every one of its items to a new unit, with an id of its own
    r = run_cli("resume", str(sweep), "--units", "1")
    assert r.returncode == 0, r.stderr
    index = json.loads((sweep / "units.json").read_text())
    assert [u["origin"] for u in index] == ["plan", "resume"]
    new = index[1]["id"]
    assert new != old and f"1 new unit: {new}" in r.stdout, r.stdout
    doc_path = tmp_path / "s.results.json"
    doc = json.loads(doc_path.read_text())
    assert {rec["unit"] for rec in doc["results"]} == {new} and len(doc["results"]) == 55
    assert list(doc["tilesweep"]["attempts"]) == [new]
    # the worker wrote its last record 90 s after it started (a replay is instant: said by the clock)
    partial = sweep / "partials" / f"{new}.jsonl"
    header = json.loads(partial.read_text().splitlines()[0])["header"]
    started = _epoch(header["started"])
    os.utime(partial, (started + 90, started + 90))
    assert run_cli("merge", str(sweep)).returncode == 0
    (attempt,) = json.loads(doc_path.read_text())["tilesweep"]["attempts"][new]
    assert attempt["started"] == header["started"] and _epoch(attempt["ended"]) == started + 90
    page = tmp_path / "s.html"
    assert run_cli("report", str(doc_path), "--html", str(page)).returncode == 0
    assert f"<dt>measured</dt><dd>{attempt['started']} to {attempt['ended']}</dd>" in page.read_text()


def test_a_sweep_directory_keeps_the_unit_ids_it_was_planned_with(tmp_path: Path) -> None:
    """A directory planned when a unit's id hashed its items alone: every command reads the
    ids from its unit index, none plans them again."""
    spec = _spec(tmp_path, "k")
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    (entry,) = json.loads((sweep / "units.json").read_text())
    unit_file = json.loads((sweep / "units" / f"{entry['id']}.json").read_text())
    old = canonical_hash([iid for _, iid in unit_file["items"]], length=12)  # the earlier rule
    (sweep / "units" / f"{entry['id']}.json").unlink()
    (sweep / "units" / f"{old}.json").write_text(json.dumps({**unit_file, "id": old}))
    (sweep / "units.json").write_text(json.dumps([{**entry, "id": old}]))
    r = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0 and f"unit   0 {old}:" in r.stdout, r.stdout
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (sweep / "partials").iterdir()] == [f"{old}.jsonl"]
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert [u["id"] for u in st["units"]] == [old] and st["complete"]
    doc = json.loads((tmp_path / "k.results.json").read_text())
    assert {rec["unit"] for rec in doc["results"]} == {old}


def _epoch(iso: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(iso).timestamp()
