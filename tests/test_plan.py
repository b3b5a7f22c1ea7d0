"""Planning: item order and ids, shared-memory pruning on the reference run, sharding."""

from __future__ import annotations

import json
import re
import statistics
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import PlanError
from orchestrator.planning import INVALID, PRUNED, RUN, WorkItem, costs, expand, plan, plan_line, shard
from orchestrator.spec import records
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import item_id
from orchestrator.store import document
from tests.helpers import TINY_SPEC, assert_one_line_error, fwd_replay_spec

from .conftest import SAMPLE, run_cli

REQUESTED = re.compile(r"requested (\d+), available: (\d+)")


@pytest.fixture
def reference(sample_doc: dict[str, Any]) -> SweepSpec:
    return SweepSpec(**sample_doc["config"])


def _by_key(items: list[WorkItem]) -> dict[tuple[Any, ...], WorkItem]:
    return {records.record_key(it.record_fields()): it for it in items}


def test_plan_order_is_the_reference_record_order(sample_doc: dict[str, Any], reference: SweepSpec) -> None:
    items = expand(reference)
    assert len(items) == 832
    sample_keys = [records.record_key(r) for r in sample_doc["results"]]
    wanted = set(sample_keys)
    # The excerpt's records appear in the plan in the same order, and each record's fields
    # come out exactly as the reference wrote them (key order included).
    in_plan = [it for it in items if records.record_key(it.record_fields()) in wanted]
    assert [records.record_key(it.record_fields()) for it in in_plan] == sample_keys
    for it, rec in zip(in_plan, sample_doc["results"], strict=True):
        fields = it.record_fields()
        assert list(fields.items()) == [(k, rec[k]) for k in list(rec)[: len(fields)]]
    assert [it.index for it in items] == list(range(len(items)))


def test_ids_are_stable_and_recomputable_from_records(sample_doc: dict[str, Any], reference: SweepSpec) -> None:
    items = expand(reference)
    # Ids are part of every sweep directory and results document: they must never change.
    assert (items[0].id, items[2].id, items[-1].id) == ("868d852e34a4fc6d", "f1ac0636ccb8d90e", "1a17a832188e09e5")
    assert all(item_id(it.record_fields()) == it.id for it in items)
    assert len({it.id for it in items}) == len(items)
    # ... and from a merged record, result fields and all
    by_key = _by_key(items)
    for rec in sample_doc["results"]:
        assert item_id(rec) == by_key[records.record_key(rec)].id


def test_ids_match_for_invalid_clamped_and_odd_grids() -> None:
    spec = SweepSpec.model_validate(
        {
            "dtypes": ["float32"],
            "head_dims": [48, 64],
            "seq_lens": [64, 96, 256],
            "fwd_block_q": [32, 64, 128, 256],
            "bwd_fwd_config": [64, 32],
            "smem_limit_bytes": 100000,
            "tag": "x",
        }
    )
    items = expand(spec)
    assert all(item_id(it.record_fields()) == it.id for it in items)
    kinds = {k: sum(it.kind == k for it in items) for k in (RUN, INVALID, PRUNED)}
    assert kinds[INVALID] and kinds[PRUNED] and kinds[RUN]
    bad = next(it for it in items if it.kind == INVALID)
    assert bad.reason is not None and bad.reason.startswith(f"ValueError: seq={bad.seq} must be a multiple of")


def test_a_block_clamped_to_a_shorter_seq_is_planned_as_the_tiles_that_run(tmp_path: Path) -> None:
    """The kernel clamps a block larger than seq to seq: the record names the tiles that ran
    (seq 100 runs tiles of 100, not "bq128"), and grid points that clamp alike are one item."""
    spec = tmp_path / "clamp.json"
    spec.write_text(
        json.dumps(
            {
                "dtypes": ["float32"],
                "head_dims": [64],
                "seq_lens": [100, 256],
                "modes": ["fwd"],
                "fwd_block_q": [64, 128, 256],
                "fwd_block_k": [128],
                "fwd_stages": [1],
                "fwd_warps": [4],
            }
        )
    )
    r = run_cli("plan", str(spec), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    forced = [json.loads(line) for line in r.stdout.splitlines() if '"forced"' in line]
    s100 = [(p["block_q"], p["block_k"], p.get("error", "")[:11]) for p in forced if p["seq"] == 100]
    assert s100 == [(64, 100, "ValueError:"), (100, 100, "")]  # 128 and 256 both run 100: one item
    s256 = [(p["block_q"], p["block_k"]) for p in forced if p["seq"] == 256]
    assert s256 == [(64, 128), (128, 128), (256, 128)]


def test_pruning_flags_exactly_the_reference_failures(sample_doc: dict[str, Any], reference: SweepSpec) -> None:
    items = expand(reference)
    by_key = _by_key(items)
    limit = reference.smem_limit_bytes
    assert limit is not None
    failed = [r for r in sample_doc["results"] if "error" in r]
    assert len(failed) == 8
    for rec in sample_doc["results"]:
        it = by_key[records.record_key(rec)]
        if "error" in rec:
            match = REQUESTED.search(rec["error"])
            assert match, rec["error"]
            requested, available = map(int, match.groups())
            assert it.kind == PRUNED and it.smem_bytes == requested and available == limit
            assert it.reason and it.reason.startswith("SharedMemoryPredicted: ") and str(requested) in it.reason
        else:
            assert it.kind == RUN, rec  # nothing that ran in the reference is pruned
    # The whole reference run failed 72 configs, all on shared memory.
    assert sum(it.kind == PRUNED for it in items) == 72
    assert all((it.smem_bytes or 0) > limit for it in items if it.kind == PRUNED)
    line = plan_line(next(it for it in items if it.kind == PRUNED))
    assert line["pruned"] is True and line["smem_bytes"] > limit
    assert "unit" not in line  # expanded, not placed in a unit yet (what plan --lower --json prints)
    assert plan_line(shard(items, 2)[0].items[0])["unit"] == 0


def test_pruning_can_be_switched_off(reference: SweepSpec) -> None:
    spec = reference.model_copy(update={"kernel": reference.kernel.model_copy(update={"prune_smem": "off"})})
    items = expand(spec)
    assert not any(it.kind == PRUNED for it in items)
    # the prediction is still shown
    limit = spec.smem_limit_bytes
    assert limit is not None
    assert sum(1 for it in items if it.smem_bytes and it.smem_bytes > limit) == 72
    assert not any(it.kind == PRUNED for it in expand(reference.model_copy(update={"smem_limit_bytes": None})))


# ---------------------------------------------------------------------------- sharding


def _loads(groups: Sequence[Sequence[WorkItem]], cost: list[float]) -> list[float]:
    """Seconds of each group of items (a unit's, or a contiguous chunk's)."""
    return [sum(cost[it.index] for it in group) for group in groups]


def _ratio(loads: list[float]) -> float:
    return max(loads) / statistics.mean(loads)


def _contiguous(items: list[WorkItem], n: int) -> list[list[WorkItem]]:
    return [items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)]


@pytest.mark.parametrize("strategy", ["shape", "balanced"])
def test_units_partition_the_plan_in_plan_order(reference: SweepSpec, strategy: str) -> None:
    items = expand(reference)
    units = shard(items, 8, strategy=strategy)
    assert len(units) == 8
    seen = [it.id for u in units for it in u.items]
    assert sorted(seen) == sorted(it.id for it in items)
    for i, u in enumerate(units):
        assert u.index == i and all(it.unit == i for it in u.items)
        assert [it.index for it in u.items] == sorted(it.index for it in u.items)
    assert [u.items[0].index for u in units] == sorted(u.items[0].index for u in units)
    # same input, same units (unit ids are what resume keys on)
    assert [u.id for u in shard(expand(reference), 8, strategy=strategy)] == [u.id for u in units]


@pytest.mark.parametrize("strategy", ["shape", "balanced"])
@pytest.mark.parametrize("asked", [3, 5, 100])
def test_every_unit_measures_something_where_the_plan_has_pruned_items(strategy: str, asked: int) -> None:
    """Pruned items are recorded without a compile: a unit of pruned items only would start a
    worker for nothing. Every unit holds an item to run, and the plan's items are all there."""
    spec = SweepSpec.model_validate(
        {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [16, 32, 64, 128], "fwd_block_k": [64], "seq_lens": [128]}
        | {"smem_limit_bytes": 60000, "head_dims": [64]}
    )
    items = expand(spec)
    runs = sum(it.kind == RUN for it in items)
    assert 0 < runs < len(items), [it.kind for it in items]  # some pruned
    units = shard(items, asked, strategy=strategy)
    assert len(units) == min(asked, runs)
    assert all(any(it.kind == RUN for it in u.items) for u in units), [[it.kind for it in u.items] for u in units]
    assert sorted(it.index for u in units for it in u.items) == [it.index for it in items]
    assert all([it.index for it in u.items] == sorted(it.index for it in u.items) for u in units)


def test_a_plan_of_pruned_items_only_is_one_unit() -> None:
    spec = SweepSpec.model_validate(
        {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [128], "fwd_block_k": [128], "seq_lens": [128]}
        | {"smem_limit_bytes": 1000, "head_dims": [64], "auto_only": False}
    )
    items = [it for it in expand(spec) if it.kind != RUN]
    assert items, "no pruned item"
    (unit,) = shard(items, 5)
    assert len(unit.items) == len(items)


def test_balance_beats_contiguous_chunks_on_a_synthetic_cost_table() -> None:
    # 12 shapes whose items cost very different amounts, in plan order
    spec = SweepSpec(
        dtypes=["bfloat16", "float32"], head_dims=[64, 128], seq_lens=[1024, 4096, 16384], smem_limit_bytes=None
    )
    items = expand(spec)
    cost = [
        (1.0 + (it.seq / 4096) ** 2) * (3.0 if it.mode == "fwd_bwd" else 1.0) * (1 + (it.index % 7) / 7) for it in items
    ]
    for n in (4, 8, 16):
        contiguous = _ratio(_loads(_contiguous(items, n), cost))
        for strategy in ("shape", "balanced"):
            units = shard(items, n, costs=cost, setups={it.shape: 0.0 for it in items}, strategy=strategy)
            ratio = _ratio(_loads([u.items for u in units], cost))
            assert ratio < contiguous and ratio <= 1.02, (n, strategy, ratio, contiguous)


def test_shapes_stay_whole_where_that_costs_nothing() -> None:
    spec = SweepSpec(dtypes=["bfloat16", "float32"], head_dims=[64, 128], seq_lens=[2048], smem_limit_bytes=None)
    items = expand(spec)
    cost = [1.0] * len(items)  # four equal shapes, two units: two whole shapes each
    units = shard(items, 2, costs=cost, setups={it.shape: 1.0 for it in items}, strategy="shape")
    assert [len({it.shape for it in u.items}) for u in units] == [2, 2]
    # more units than shapes: shapes are split, each unit still gets one shape only
    units = shard(items, 8, costs=cost, setups={it.shape: 1.0 for it in items}, strategy="shape")
    assert [len({it.shape for it in u.items}) for u in units] == [1] * 8


def test_measured_costs_balance_the_reference_excerpt(
    sample_doc: dict[str, Any], reference: SweepSpec, tmp_path: Path
) -> None:
    # Plan only the excerpt's items (the ones with measured costs) and judge with them.
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(sample_doc))
    table = document.load_costs(path)
    assert len(table) == 151  # the excerpt's successful records
    keys = {records.record_key(r) for r in sample_doc["results"]}
    sub = [it for it in expand(reference) if records.record_key(it.record_fields()) in keys]
    truth = {it.index: table.get(it.record_fields()) or 0.002 for it in sub}
    measured = [truth[it.index] for it in sub]
    units = shard(sub, 8, costs=measured, setups={it.shape: 0.0 for it in sub})
    loads = [sum(truth[it.index] for it in u.items) for u in units]
    contiguous = [sum(truth[it.index] for it in sub[i * len(sub) // 8 : (i + 1) * len(sub) // 8]) for i in range(8)]
    assert _ratio(loads) <= 1.02 < _ratio(contiguous)


def test_plan_takes_costs_from_a_results_document(
    sample_doc: dict[str, Any], reference: SweepSpec, tmp_path: Path
) -> None:
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(sample_doc))
    table = document.load_costs(path)
    items, units = plan(reference, 8, costs=table)
    assert len(units) == 8 and sum(len(u.items) for u in units) == 832
    # the model fills in for the 13 problems the excerpt lacks, scaled to agree with it
    cost, scale = costs.item_costs(items, reference, table)
    assert 0.5 < scale < 2.0
    rec = sample_doc["results"][2]
    assert cost[2] == pytest.approx(rec["compile_s"] + (1 + 2 + 5 * rec["inner"]) * rec["median_ms"] / 1e3)


def test_cli_plan_shows_units_and_takes_costs() -> None:
    r = run_cli("plan", str(SAMPLE), "--units", "8", "--dry-run", "--json", "--costs", str(SAMPLE))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 832 and {line["unit"] for line in lines} == set(range(8))
    assert sum(line["pruned"] for line in lines) == 72
    r = run_cli("plan", str(SAMPLE), "--dry-run", "--costs", str(SAMPLE.parent / "missing.json"))
    assert_one_line_error(r, "--costs")


def test_shard_rejects_bad_counts(reference: SweepSpec) -> None:
    items = expand(reference)
    with pytest.raises(PlanError, match="at least 1"):
        shard(items, 0)
    with pytest.raises(PlanError, match="no items"):
        shard([], 3)
    assert len(shard(items[:5], 10)) == 5


# ---------------------------------------------------------------------------- scale


def _plan_peak_bytes(n_seqs: int) -> tuple[int, int]:
    spec = SweepSpec(
        dtypes=["bfloat16", "float32"], head_dims=[64, 128], seq_lens=[128 * k for k in range(1, n_seqs + 1)]
    )
    tracemalloc.start()
    try:
        items, units = plan(spec, 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return len(items), peak


def test_plan_memory_grows_in_proportion_to_items() -> None:
    # What a 1,000,000-item plan needs, judged from 4x smaller and 16x smaller plans.
    small_items, small_peak = _plan_peak_bytes(15)
    big_items, big_peak = _plan_peak_bytes(60)
    assert big_items == 4 * small_items
    per_item = big_peak / big_items
    assert 0.8 * 4 < big_peak / small_peak < 1.25 * 4
    assert per_item < 1000, f"{per_item:.0f} bytes per item"


def test_more_units_asked_for_than_items_is_said_where_a_plan_is_made(tmp_path: Path) -> None:
    spec = fwd_replay_spec(tmp_path, executor={"kind": "slurm", "slurm_partition": "gpu"})
    note = "tilesweep: note: 20 units asked for, 3 made: a unit holds at least one item to measure"
    plan = run_cli("plan", str(spec), "--units", "20", "--dry-run")
    assert plan.returncode == 0 and note in plan.stderr.splitlines(), plan.stderr
    assert plan.stdout.startswith("3 items in 3 units") and plan.stdout.count(":     1 item   float32/d16/s64") == 3
    (tmp_path / "local").mkdir()
    local = fwd_replay_spec(tmp_path / "local", sharding={"units": 20})
    run = run_cli("run", str(local), "--sweep-dir", str(tmp_path / "sweep"))
    assert run.returncode == 0 and note in run.stderr.splitlines() and "3 items in 3 units" in run.stderr, run.stderr
    again = run_cli("run", str(local), "--sweep-dir", str(tmp_path / "sweep"))  # the plan is kept: nothing to say
    assert again.returncode == 0 and "asked for" not in again.stderr, again.stderr
    # its document holds every record: a new plan carries them all, measures nothing, and says so alone
    replan = run_cli("plan", str(local), "--units", "20", "--dry-run")
    assert replan.returncode == 0 and "asked for" not in replan.stderr, replan.stderr
    assert "nothing to measure" in replan.stdout, replan.stdout


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_sweep_directory_that_is_a_file_is_refused_before_the_plan_is_shown(tmp_path: Path, command: str) -> None:
    spec = fwd_replay_spec(tmp_path)
    (tmp_path / "a-file").write_text("")
    r = run_cli(command, str(spec), "--sweep-dir", str(tmp_path / "a-file"))
    assert_one_line_error(r, f"sweep directory {tmp_path / 'a-file'} exists and is not a directory")
    assert r.stdout == "", r.stdout


def test_a_large_grid_is_said_before_a_plan_expands_it_and_only_then(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A grid past ``LARGE_GRID_ITEMS`` (here lowered to 5) is warned of as a plan starts (3.6M
    items took 40 s in silence); re-expanding the plan of a sweep (status, resume) says nothing."""
    from orchestrator.control.reuseplan import plan_with_reuse
    from orchestrator.planning import items as planning_items

    monkeypatch.setattr(planning_items, "LARGE_GRID_ITEMS", 5)
    spec = SweepSpec.model_validate({**TINY_SPEC, "output": str(tmp_path / "out.json")})
    with caplog.at_level("WARNING"):
        plan(spec)
        plan_with_reuse(spec, tmp_path / "sweep", tmp_path / "out.json", None, None, None)
    said = [r.getMessage() for r in caplog.records if "the spec expands to up to" in r.getMessage()]
    assert (
        said
        == [
            "the spec expands to up to 6 items (1 problem x 4 configs and auto); planning them takes a "
            "while, measuring them far longer: narrow the grid, or measure part of it (timing.strategy search)"
        ]
        * 2
    )
    caplog.clear()
    with caplog.at_level("WARNING"):
        expand(spec)
    assert not caplog.records


def test_units_asked_of_a_sweep_planned_before_are_said_not_to_be_used(tmp_path: Path) -> None:
    """A sweep directory keeps the units it was planned with: ``--units`` of another count on
    ``plan`` or ``run`` into it says it is not used, where it had been dropped without a word."""
    spec = fwd_replay_spec(tmp_path, sharding={"units": 3})
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    note = f"tilesweep: note: --units 1 is not used: {sweep} keeps the 3 units it was planned with"
    for command in ("plan", "run"):
        r = run_cli(command, str(spec), "--sweep-dir", str(sweep), "--units", "1")
        assert r.returncode == 0 and any(line.startswith(note) for line in r.stderr.splitlines()), r.stderr
        assert r.stderr.count("keeps the") == 1, r.stderr  # said once
        same = run_cli(command, str(spec), "--sweep-dir", str(sweep), "--units", "3")
        assert same.returncode == 0 and "is not used" not in same.stderr, same.stderr
