"""Partial files: torn and invalid lines are skipped (and redone), never trusted."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bench._synth import DEVICE, build_sweep, partial_lines, record_for, small_spec
from orchestrator.errors import PartialError
from orchestrator.store.partials import PartialWriter, check_record, count_records, read_partial


@pytest.fixture
def sweep(tmp_path: Path):
    sd, units = build_sweep(tmp_path / "sweep", small_spec(n_seqs=1), 2, write_partials=False)
    return sd, units[0]


def _lines(sd, unit) -> list[str]:
    import random

    return partial_lines(sd, unit, random.Random(1))


def test_full_partial_reads_every_record(sweep):
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    path.write_text("\n".join(_lines(sd, unit)) + "\n")
    content = read_partial(path)
    assert set(content.records) == {it.id for it in unit.items}
    assert content.attempts == 1 and not content.torn
    assert count_records(path) == len(unit.items)


def test_torn_last_line_is_skipped_with_file_and_line_and_redone(sweep, caplog):
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
        w.write({"id": last, "attempt": 2, "record": json.loads(lines[-1])["record"]})
    again = read_partial(path)
    assert last in again.records and again.records[last][0] == 2


@pytest.mark.parametrize("damage, why", [
    (lambda r: r.update(median_ms="fast"), "wrong type"),
    (lambda r: r.update(inner=True), "wrong type"),
    (lambda r: r.pop("rel_err"), "missing"),
    (lambda r: r.update(colour="red"), "unknown field"),
    (lambda r: r.update(unit="abc"), "unknown field"),
    (lambda r: r.update(head_dim=999), "not the id"),
    (lambda r: r.update(mode=["fwd"]), "mode/config"),
])
def test_record_with_wrong_fields_or_types_is_skipped(sweep, caplog, damage, why):
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


def test_check_record_accepts_the_workers_layouts_and_reorders_others(sweep):
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


def test_unknown_schema_version_is_refused_naming_the_file(sweep):
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    lines = _lines(sd, unit)
    head = json.loads(lines[0])
    head["header"]["schema"] = 99
    path.write_text(json.dumps(head) + "\n")
    with pytest.raises(PartialError, match=str(path)):
        read_partial(path)


def test_nan_rel_err_survives(sweep):
    """The stdlib writes NaN; a broken kernel's record must not read as torn."""
    sd, unit = sweep
    path = sd.partial_path(unit.id)
    it = next(i for i in unit.items if i.kind == "run")
    import random

    rec = record_for(it, random.Random(0))
    rec["rel_err"] = float("nan")
    path.write_text(json.dumps({"header": {"schema": 1, "device": DEVICE}}) + "\n"
                    + json.dumps({"id": it.id, "attempt": 1, "record": rec}) + "\n")
    assert it.id in read_partial(path).records
