"""The causal and grouped-query axes and the kernel implementation, from the spec to the tuned
table: record fields and ids, the plan's refusals and notes, report, export and compare."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernels.impls import STOCK_DEFAULTS
from kernels.tuned import TunedTable
from orchestrator.analysis import compare, export, report
from orchestrator.errors import PlanError
from orchestrator.planning import RUN, costs, expand, notes, plan
from orchestrator.planning.costs import item_costs
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.records import item_id, record_key
from orchestrator.store import document as results_doc
from orchestrator.store.layouts import check_record
from tests.helpers import assert_one_line_error
from tests.test_report import make_doc, rec

from .conftest import run_cli

SMALL = {
    "dtypes": ["bfloat16"],
    "head_dims": [64],
    "seq_lens": [256],
    "batch": 1,
    "heads": 8,
    "fwd_block_q": [64],
    "fwd_block_k": [64, 128],
    "fwd_stages": [2],
    "fwd_warps": [4],
    "bwd_outer": [64],
    "bwd_inner": [32],
    "bwd_stages": [1, 2],
    "bwd_warps": [4],
}


def _spec(**kw: Any) -> SweepSpec:
    return SweepSpec(**{**SMALL, **kw})


# ---------------------------------------------------------------------- records and ids


def test_defaults_leave_records_and_ids_as_they_were() -> None:
    plain = expand(_spec())
    spelled = expand(_spec(causal=[False], kv_heads=[8], kernel={"impl": "tilesweep"}))
    assert [it.record_fields() for it in spelled] == [it.record_fields() for it in plain]
    assert [it.id for it in spelled] == [it.id for it in plain]
    assert "causal" not in plain[0].record_fields() and "impl" not in plain[0].record_fields()
    # a record that spells a default value has the id of one that does not
    r = plain[3].record_fields()
    spelled_rec = {**r, "causal": False, "kv_heads": r["heads"], "impl": "tilesweep"}
    assert item_id(spelled_rec) == item_id(r) == plain[3].id
    assert record_key(spelled_rec) == record_key(r)


def test_swept_axes_join_every_record_after_heads_and_keep_the_default_ids() -> None:
    plain = {it.id for it in expand(_spec())}
    items = expand(_spec(causal=[False, True], kv_heads=[None, 2]))
    assert len(items) == 4 * len(plain)
    for it in items:
        keys = list(it.record_fields())
        assert keys[:8] == ["dtype", "head_dim", "seq", "batch", "heads", "causal", "kv_heads", "tag"]
        assert item_id(it.record_fields()) == it.id
    # the non-causal multi-head items are the very items of the plain sweep (resume, append reuse them)
    default = [it for it in items if not it.causal and it.kv_heads is None]
    assert {it.id for it in default} == plain
    assert all(it.record_fields()["kv_heads"] == 8 for it in default)
    assert len({it.id for it in items}) == len(items)
    # problems that share inputs follow one another: kv_heads, then causal, inside seq
    assert [(it.kv_heads, it.causal) for it in items if it.config == "auto" and it.mode == "fwd"] == [
        (None, False),
        (None, True),
        (2, False),
        (2, True),
    ]


def test_one_swept_axis_shows_only_itself() -> None:
    keys = list(expand(_spec(kv_heads=[2]))[0].record_fields())
    assert keys[5:7] == ["kv_heads", "tag"] and "causal" not in keys
    keys = list(expand(_spec(causal=[True]))[0].record_fields())
    assert keys[5:7] == ["causal", "tag"] and "kv_heads" not in keys


def test_stock_kernel_records_name_it_before_config_and_pin_its_backward_stages() -> None:
    spec = _spec(kernel={"impl": "jax"}, causal=[True])
    items = expand(spec)
    fields = items[0].record_fields()
    assert list(fields)[-2:] == ["impl", "config"] and fields["impl"] == "jax"
    bwd = [it for it in items if it.mode == "fwd_bwd" and it.config == "forced"]
    assert [it.record_fields()["num_stages"] for it in bwd] == [2]  # bwd_stages [1, 2] collapses
    fwd = [it for it in items if it.mode == "fwd" and it.config == "forced"]
    assert len(fwd) == 2
    assert notes(spec) == [
        'kernel.impl "jax": the stock backward ignores num_stages and runs 2, so fwd_bwd configs '
        "are planned with num_stages=2 only (bwd_stages [1, 2] is not swept)"
    ]
    assert notes(_spec()) == [] and notes(_spec(kernel={"impl": "jax"}, modes=["fwd"])) == []
    assert notes(_spec(kernel={"impl": "jax"}, bwd_stages=[2])) == []  # asked for what it runs: nothing left out
    ours = {it.id for it in expand(_spec(causal=[True]))}
    assert not ours & {it.id for it in items}  # another kernel: other records


def test_stock_kernel_refuses_grouped_query_in_one_line() -> None:
    with pytest.raises(PlanError) as err:
        plan(_spec(kernel={"impl": "jax"}, kv_heads=[None, 2]))
    msg = str(err.value)
    assert "\n" not in msg and "kv_heads [2]" in msg and 'kernel.impl "tilesweep"' in msg


def test_worker_layout_accepts_the_new_fields_and_puts_them_in_order() -> None:
    for spec in (_spec(causal=[True], kv_heads=[2]), _spec(causal=[True], kernel={"impl": "jax"})):
        it = expand(spec)[4]
        r = {**it.record_fields(), "error": "x"}
        assert check_record(it.id, r) == (None, None)
        moved = ("impl", "causal") if "impl" in r else ("kv_heads", "causal")
        shuffled = {**{k: r[k] for k in moved}, **{k: v for k, v in r.items() if k not in moved}}
        why, order = check_record(it.id, shuffled)
        assert why is None and order == tuple(r)
        wrong_type, _ = check_record(it.id, {**r, "causal": "yes"})
        assert wrong_type is not None and "wrong type: causal is str" in wrong_type
        other_problem, _ = check_record(it.id, {**r, "causal": False})
        assert other_problem is not None and other_problem.startswith("id ")


def test_cost_model_halves_timed_work_for_causal_and_compiles_two_loops() -> None:
    spec = _spec(causal=[False, True], seq_lens=[8192], modes=["fwd"], fwd_block_k=[64])
    args = ("fwd", "bfloat16", 1, 8, 8192, 64)
    assert costs.call_estimate(*args, causal=True) < 0.55 * costs.call_estimate(*args)
    cfg = {"block_q": 64, "block_k": 64, "num_warps": 4}
    one, two = (costs.compile_estimate("fwd", "bfloat16", 64, 8192, cfg, loops=n) for n in (1, 2))
    assert one < two < 2 * one
    # a work item's cost is made of those parts: the causal one of two loop copies and half the calls
    items = [it for it in expand(spec) if it.kind == RUN and it.config == "forced"]
    full, causal = item_costs(items, spec)[0]
    assert full == pytest.approx(one + costs.timed_estimate(*args, spec))
    assert causal == pytest.approx(two + costs.timed_estimate(*args, spec, causal=True))


# ---------------------------------------------------------------------- report, export, compare


def _rec(**kw: Any) -> dict[str, Any]:
    extra = {k: kw.pop(k) for k in ("causal", "kv_heads", "impl") if k in kw}
    r = rec(**kw)
    out: dict[str, Any] = {}
    for k, v in r.items():
        if k == "tag":
            out.update({k2: extra[k2] for k2 in ("causal", "kv_heads") if k2 in extra})
        if k == "config" and "impl" in extra:
            out["impl"] = extra["impl"]
        out[k] = v
    return out


def test_report_counts_causal_flops_as_half_and_says_so() -> None:
    doc = results_doc.from_obj(
        make_doc(
            [
                _rec(auto=True, ms=2.0, causal=False, kv_heads=2),
                _rec(ms=1.0, causal=False, kv_heads=2),
                _rec(auto=True, ms=1.2, causal=True, kv_heads=2),
                _rec(ms=0.5, causal=True, kv_heads=2),
            ]
        )
    )
    full, causal = report.best_table(doc)
    assert (full.key.causal, causal.key.causal, causal.key.kv_heads) == (False, True, 2)
    assert full.flops is not None and causal.flops == full.flops / 2 and causal.tflops == pytest.approx(full.tflops)
    text = report.format_table([full, causal])
    assert "causal" in text.splitlines()[0] and "KV" in text.splitlines()[0]
    assert "causal = half" in text
    assert causal.to_json()["flops_formula"].startswith("0.5*")


def test_export_keys_on_the_new_fields_and_answers_for_both_kernels(tmp_path: Path) -> None:
    docs = make_doc(
        [
            _rec(auto=True, ms=2.0, causal=True, kv_heads=2, impl="jax", mode="fwd_bwd"),
            _rec(ms=1.0, causal=True, kv_heads=2, impl="jax", mode="fwd_bwd", bwd_outer=64, bwd_inner=32),
            _rec(auto=True, ms=2.0, causal=True, kv_heads=2, mode="fwd_bwd"),
            _rec(ms=1.0, causal=True, kv_heads=2, mode="fwd_bwd", bwd_outer=128, bwd_inner=64),
            _rec(auto=True, ms=2.0, mode="fwd", impl="jax"),
            _rec(ms=1.0, mode="fwd", impl="jax", block_q=64),
        ]
    )
    table, summary = export.tuned_table(results_doc.from_obj(docs))
    assert summary.entries == 3
    path = tmp_path / "tuned.json"
    export.write_atomic(path, table)
    t = TunedTable.load(path, check_env=False)
    ask = {"dtype": "bfloat16", "head_dim": 64, "seq": 2048, "mode": "fwd_bwd", "causal": True, "kv_heads": 2}
    ours = t.config_for(**ask)
    assert ours is not None
    assert (ours.bwd_outer, ours.bwd_inner) == (128, 64)
    assert t.config_for(**{**ask, "causal": False}) is None  # non-causal was never measured
    stock = t.mha_kwargs(**ask)
    assert stock is not None
    bs = stock["block_sizes"]
    assert (bs.block_kv_dkv, bs.block_q_dq, bs.block_q_dkv, bs.block_kv_dq) == (64, 64, 32, 32)
    assert (stock["num_warps"], stock["num_stages"]) == (4, 2)
    fwd_kwargs = t.mha_kwargs(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd")
    assert fwd_kwargs is not None
    fwd = fwd_kwargs["block_sizes"]
    # a fwd entry of the stock kernel keeps its backward defaults (32), not ours (128)
    assert (fwd.block_q, fwd.block_q_dkv, fwd.block_kv_dkv) == (64, STOCK_DEFAULTS.bwd_inner, STOCK_DEFAULTS.bwd_outer)
    assert t.config_for(dtype="bfloat16", head_dim=64, seq=2048, mode="fwd") is None  # only the stock kernel's


def test_version_1_tables_still_load(tmp_path: Path) -> None:
    cfg = {"block_q": 64, "block_k": 64, "bwd_outer": 64, "bwd_inner": 32, "num_warps": 4, "num_stages": 2}
    entry = {
        "dtype": "float32",
        "head_dim": 64,
        "seq": 1024,
        "batch": 1,
        "heads": 2,
        "mode": "fwd",
        "config": cfg,
        "median_ms": 1.0,
        "auto_ms": 1.5,
    }
    t = TunedTable.from_obj({"format": "tilesweep-tuned", "version": 1, "device": {}, "entries": [entry]})
    assert t.lookup(dtype="float32", head_dim=64, seq=1024, mode="fwd") == cfg
    assert t.lookup(dtype="float32", head_dim=64, seq=1024, mode="fwd", causal=True) is None
    assert t.entries[0].kv_heads == 2 and t.entries[0].impl == "tilesweep"


def test_compare_pairs_our_kernel_with_the_stock_one() -> None:
    a = results_doc.from_obj(make_doc([_rec(auto=True, ms=2.0, causal=True), _rec(ms=1.0, causal=True)]))
    b = results_doc.from_obj(
        make_doc([_rec(auto=True, ms=2.0, causal=True, impl="jax"), _rec(ms=1.5, causal=True, impl="jax")])
    )
    (row,) = compare.compare(a, b)
    assert row.presence == "both" and row.ratio is not None and math.isclose(row.ratio, 1.5)
    assert row.to_json()["b"]["impl"] == "jax" and row.to_json()["causal"] is True


# ---------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ({"kv_heads": [3]}, ("kv_heads", "divide heads=8", "1, 2, 4, 8")),
        ({"kv_heads": [0, -2, 16]}, ("kv_heads", "divide heads=8", "got [0, -2, 16]")),
        # a mistyped head count is refused at once, not after counting its divisors
        ({"heads": 99999999999}, ("heads 99999999999", "more than one GPU holds")),
        ({"heads": 2**40, "kv_heads": [3]}, ("kv_heads", f"divide heads={2**40} (1 is multi-query", "got [3]")),
        ({"head_dims": [512]}, ("head_dims", "16 to 256")),
        ({"head_dims": [8]}, ("head_dims", "16 to 256")),
        (
            {"kernel": {"impl": "triton"}},
            ("kernel.impl", '"tilesweep", "jax", "mosaic", "tokamax-mosaic", "tokamax-triton" or "replay"'),
        ),
        ({"kernel": {"impl": "jax"}, "kv_heads": [2]}, ('kernel.impl "jax"', "grouped-query", "kv_heads [null]")),
    ],
)
def test_bad_input_is_one_line_exit_2(
    write_spec: Callable[..., Path], overrides: dict[str, Any], needles: tuple[str, ...]
) -> None:
    spec = write_spec(**{"heads": 8, **overrides})
    assert_one_line_error(run_cli("plan", str(spec), "--dry-run"), *needles)


def test_plan_says_once_what_the_stock_kernel_ignores(write_spec: Callable[..., Path]) -> None:
    spec = write_spec(kernel={"impl": "jax", "interpret": True}, bwd_stages=[1, 2])
    r = run_cli("plan", str(spec), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("ignores num_stages") == 1 and "bwd_stages [1, 2] is not swept" in r.stderr
    lines = [json.loads(x) for x in run_cli("plan", str(spec), "--dry-run", "--json").stdout.splitlines()]
    assert {x["num_stages"] for x in lines if x["mode"] == "fwd_bwd" and x["config"] == "forced"} == {2}
