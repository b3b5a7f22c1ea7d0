"""Partial files: torn and invalid lines are skipped (and redone), never trusted."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import PartialError
from orchestrator.planning import Unit
from orchestrator.store.lines import PartialWriter, record_line
from orchestrator.store.partials import check_record, read_partial, starts_checked
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep, header, partial_lines, record_for, small_spec

Sweep = tuple[SweepDir, Unit]


@pytest.fixture
def sweep(tmp_path: Path) -> Sweep:
    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, write_partials=False)
    return sd, units[0]


def _lines(sd: SweepDir, unit: Unit) -> list[str]:
    import random

    return partial_lines(sd, unit, random.Random(1))


def test_full_partial_reads_every_record(sweep: Sweep) -> None:
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    path.write_text("\n".join(_lines(sd, unit)) + "\n")
    content = read_partial(path)
    assert set(content.records) == {it.id for it in unit.items}
    assert content.attempts == 1 and not content.torn


def test_torn_last_line_is_skipped_with_file_and_line_and_redone(
    sweep: Sweep, caplog: pytest.LogCaptureFixture
) -> None:
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    lines = _lines(sd, unit)
    torn = lines[-1][: len(lines[-1]) // 2]
    path.write_text("\n".join(lines[:-1]) + "\n" + torn)
    with caplog.at_level(logging.WARNING):
        content = read_partial(path)
    last = json.loads(lines[-1])["id"]
    assert last not in content.records  # so the worker redoes it
    assert content.torn == [len(lines)]
    assert f"{path} line {len(lines)}" in caplog.text
    # the next attempt ends the torn line before writing its own
    with PartialWriter(path) as w:
        w.write(record_line(last, 2, json.loads(lines[-1])["record"]))
    again = read_partial(path)
    assert last in again.records and again.records[last][0] == 2


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda r: r.update(median_ms="fast"), "wrong type"),
        (lambda r: r.update(inner=True), "wrong type"),
        (lambda r: r.pop("rel_err"), "missing"),
        (lambda r: r.update(colour="red"), "unknown field"),
        (lambda r: r.update(unit="abc"), "unknown field"),
        (lambda r: r.update(head_dim=999), "not the id"),
        (lambda r: r.update(mode=["fwd"]), "mode/config"),
    ],
)
def test_record_with_wrong_fields_or_types_is_skipped(
    sweep: Sweep, caplog: pytest.LogCaptureFixture, damage: Callable[[dict[str, Any]], object], why: str
) -> None:
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    lines = _lines(sd, unit)
    n = next(i for i, ln in enumerate(lines) if '"record"' in ln and '"rel_err"' in ln)
    obj = json.loads(lines[n])
    damage(obj["record"])
    lines[n] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        content = read_partial(path)
    assert obj["id"] not in content.records
    assert f"{path} line {n + 1}" in caplog.text and why in caplog.text
    assert len(content.records) == len(unit.items) - 1


def test_check_record_accepts_the_workers_layouts_and_reorders_others(sweep: Sweep) -> None:
    import random

    _, unit = sweep
    rng = random.Random(0)
    kinds = set()
    for it in unit.items:
        rec = record_for(it, rng)
        assert check_record(it.id, rec) == (None, None)
        kinds.add((it.mode, it.config, "error" in rec))
        shuffled = dict(reversed(list(rec.items())))
        why, order = check_record(it.id, shuffled)
        assert why is None and order == tuple(rec)
    assert len(kinds) >= 4


def test_unknown_schema_version_is_refused_naming_the_file(sweep: Sweep) -> None:
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    lines = _lines(sd, unit)
    head = json.loads(lines[0])
    head["header"]["schema"] = 99
    path.write_text(json.dumps(head) + "\n")
    with pytest.raises(PartialError, match=str(path)):
        read_partial(path)


def test_nan_rel_err_survives(sweep: Sweep) -> None:
    """The stdlib writes NaN; a broken kernel's record must not read as torn."""
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    it = next(i for i in unit.items if i.kind == "run")
    import random

    rec = record_for(it, random.Random(0))
    rec["rel_err"] = float("nan")
    # a worker's header: one without an integer attempt is not a worker's (the merger quarantines it)
    path.write_text(
        json.dumps(header(sd, unit.id, 1)) + "\n" + json.dumps({"id": it.id, "attempt": 1, "record": rec}) + "\n"
    )
    assert it.id in read_partial(path).records


# ---------------------------------------------------------------------------- resume and merge agree


def _damage(case: str, lines: list[str], other: str) -> tuple[str, str, set[int]]:
    """(file text, verdict the case must get, line indexes whose records must not count).
    ``other``: a record line of another unit's item."""
    rec_at = [i for i, ln in enumerate(lines) if '"record"' in ln]
    head = json.loads(lines[0])
    if case == "torn last line":
        return "\n".join(lines[:-1]) + "\n" + lines[-1][:40], "skip", {len(lines) - 1}
    if case == "torn line, then the next attempt":
        k = rec_at[3]
        again = json.dumps({**head, "header": {**head["header"], "attempt": 2}})
        return "\n".join([*lines[:k], lines[k][:50], again, *lines[k + 1 :]]) + "\n", "skip", {k}
    if case == "last line complete but not terminated":
        return "\n".join(lines), "ok", set()
    if case == "blank lines":
        return "\n\n".join(lines) + "\n\n", "ok", set()
    if case == "torn header first":
        return "\n".join([lines[0][:20], *lines]) + "\n", "skip", set()
    if case == "garbage after the header":
        junk = ["PK\x03\x04 not json", '{"hello": 1}', '{"start": 5}']
        return "\n".join([lines[0], *junk, *lines[1:]]) + "\n", "skip", set()
    if case == "start lines spelled otherwise":  # the merger checks start lines all at once
        at = [i for i, ln in enumerate(lines) if ln.startswith('{"start":')]
        odd = {at[1]: lines[at[1]].replace('"attempt":1', '"attempt":01'), at[2]: lines[at[2]][:-1] + ',"alone":false}'}
        return "\n".join(odd.get(i, ln) for i, ln in enumerate(lines)) + "\n", "skip", set()
    if case == "start line torn at the end":
        start = next(ln for ln in lines if ln.startswith('{"start":'))
        return "\n".join(lines) + "\n" + start[:-1], "skip", set()
    if case == "invalid record":
        obj = json.loads(lines[rec_at[2]])
        obj["record"]["median_ms"] = "0.1 ms"
        return "\n".join(lines).replace(lines[rec_at[2]], json.dumps(obj)) + "\n", "skip", {rec_at[2]}
    if case == "record without attempt":
        obj = json.loads(lines[rec_at[1]])
        del obj["attempt"]
        return "\n".join(lines).replace(lines[rec_at[1]], json.dumps(obj)) + "\n", "skip", {rec_at[1]}
    if case == "item of another unit":
        return "\n".join([*lines, other]) + "\n", "skip", set()
    if case == "record before any header":
        return "\n".join([lines[rec_at[0]], *lines]) + "\n", "foreign", set(rec_at)
    if case == "start before any header":
        return "\n".join([lines[1], *lines]) + "\n", "foreign", set(rec_at)
    if case == "garbage first":
        return "\n".join(["\x00\x00\x00\x00", *lines]) + "\n", "foreign", set(rec_at)
    if case == "header not an object":
        return "\n".join(['{"header": 5}', *lines[1:]]) + "\n", "foreign", set(rec_at)
    if case == "header without an attempt":
        del head["header"]["attempt"]
        return "\n".join([json.dumps(head), *lines[1:]]) + "\n", "foreign", set(rec_at)
    if case == "another schema":
        head["header"]["schema"] = 7
        return "\n".join([json.dumps(head), *lines[1:]]) + "\n", "version", set(rec_at)
    raise AssertionError(case)


CASES = [
    "torn last line",
    "torn line, then the next attempt",
    "last line complete but not terminated",
    "blank lines",
    "torn header first",
    "garbage after the header",
    "start lines spelled otherwise",
    "start line torn at the end",
    "invalid record",
    "record without attempt",
    "item of another unit",
    "record before any header",
    "start before any header",
    "garbage first",
    "header not an object",
    "header without an attempt",
    "another schema",
]


def test_start_lines_are_checked_all_at_once() -> None:
    start = b'{"start":"0123456789abcdef","attempt":'
    good = b'{"header":{}}\n' + start + b"1}\n" + start + b'2,"alone":true}\n'
    assert starts_checked(good)
    assert not starts_checked(good + start + b"01}\n")
    assert not starts_checked(good + start + b"1} \n")
    assert not starts_checked(good + start + b"1}")  # no newline yet: it may still grow


@pytest.mark.parametrize("case", CASES)
def test_resume_and_merge_agree_on_what_a_damaged_partial_records(tmp_path: Path, case: str) -> None:
    """The worker and resume (read_partial) and the merger (segments) classify every line with
    the one classifier: the same records count, the same lines are skipped for the same
    reason, the same files are refused, and what they agree on is right."""
    from orchestrator.spec.records import item_id
    from orchestrator.store.merge import merge
    from orchestrator.store.segments import segment

    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, output=tmp_path / "out.json")
    unit = units[0]
    path = sd.partial_path(unit.id)
    lines = path.read_text().splitlines()
    other = next(ln for ln in sd.partial_path(units[1].id).read_text().splitlines() if '"record"' in ln)
    text, verdict, lost = _damage(case, lines, other)
    path.write_text(text)
    lost_ids = {json.loads(lines[i])["id"] for i in lost}
    expected = set() if verdict in ("foreign", "version") else {it.id for it in unit.items} - lost_ids

    seg = segment(sd.root, unit.id, path, use_cache=False)
    if verdict == "version":
        with pytest.raises(PartialError, match="partial schema version 7") as err:
            read_partial(path)
        assert seg.foreign is not None and seg.foreign in str(err.value)
    else:
        content = read_partial(path)
        assert content.foreign == seg.foreign and (content.foreign is not None) == (verdict == "foreign")
        assert set(content.records) == (set(seg.ids) if seg.foreign is None else set()) == expected
        assert content.problems == [tuple(s[:2]) for s in seg.skipped] if seg.foreign is None else not content.problems
        assert bool(content.problems) == (verdict == "skip")

    summary = merge(sd)  # what a user sees: the document holds exactly what resume counts as recorded
    merged = {item_id(r) for r in json.loads(sd.output.read_text())["results"] if r["unit"] == unit.id}
    assert merged == expected
    assert [q.source for q in summary.quarantined] == ([path] if verdict in ("foreign", "version") else [])


def test_resume_and_merge_agree_when_damage_follows_a_cached_merge(sweep: Sweep) -> None:
    """The merger reads a grown partial from where its cache ends; its verdicts on the new
    lines are still those of read_partial (which reads the file whole)."""
    from orchestrator.store.merge import merge
    from orchestrator.store.segments import segment

    sd, unit = sweep
    path = sd.partial_path(unit.id)
    lines = _lines(sd, unit)
    path.write_text("\n".join(lines[:40]) + "\n")
    merge(sd)  # caches the first 40 lines
    with open(path, "a") as f:
        f.write("\n".join([*lines[40:60], "not json", '{"start": ["x"]}', *lines[60:], lines[-1][:30]]))
    seg = segment(sd.root, unit.id, path)
    content = read_partial(path)
    assert not seg.cached and seg.foreign is None is content.foreign
    assert set(content.records) == set(seg.ids) == {json.loads(ln)["id"] for ln in lines if '"record"' in ln}
    assert content.problems == [tuple(s[:2]) for s in seg.skipped] and len(content.problems) == 3
