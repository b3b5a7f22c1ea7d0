"""report: best config per problem, checked against numbers computed here from the records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import report
from orchestrator.spec import records
from orchestrator.store import document as results_doc
from tests.report_helpers import load_obj, make_doc, rec, write

# --------------------------------------------------------------------------- the reference sample


def _independent(records: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """Per problem: best forced success, runner-up, auto median, counts (plain loops)."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in records:
        k = (
            r["dtype"],
            r["head_dim"],
            r["seq"],
            r["batch"],
            r["heads"],
            r["mode"],
            r["tag"],
            r.get("causal", False),
            r.get("kv_heads"),
            r.get("impl", "tilesweep"),
        )
        p = out.setdefault(k, {"ok": [], "failed": 0, "forced": 0, "auto": None})
        if r["config"] == "auto":
            p["auto"] = r.get("median_ms")
        else:
            p["forced"] += 1
            if "error" in r:
                p["failed"] += 1
            else:
                p["ok"].append(r)
    for p in out.values():
        p["ok"].sort(key=lambda r: r["median_ms"])
    return out


def test_sample_numbers_match_records(sample_doc: dict[str, Any], tmp_path: Path) -> None:
    doc = results_doc.load(write(tmp_path, sample_doc))
    summaries = report.best_table(doc)
    expect = _independent(sample_doc["results"])
    assert [report.astuple_key(s.key) for s in summaries] == list(expect)  # document order
    for s in summaries:
        e = expect[report.astuple_key(s.key)]
        best, runner = e["ok"][0], e["ok"][1]
        assert s.best_ms == best["median_ms"]
        assert (s.best_q1_ms, s.best_q3_ms) == (best["q1_ms"], best["q3_ms"])
        assert s.auto_ms == e["auto"]
        assert s.speedup == pytest.approx(e["auto"] / best["median_ms"])
        b, h, n, d = s.key.batch, s.key.heads, s.key.seq, s.key.head_dim
        fwd_flops = 4 * b * h * n * n * d
        flops = fwd_flops if s.key.mode == "fwd" else 3.5 * fwd_flops
        assert s.tflops == pytest.approx(flops / (best["median_ms"] / 1e3) / 1e12)
        assert (s.n_configs, s.n_failed) == (e["forced"], e["failed"])
        overlap = best["q3_ms"] >= runner["q1_ms"] and runner["q3_ms"] >= best["q1_ms"]
        assert s.within_noise == overlap
        assert s.runner_up_ms == runner["median_ms"]
        fields = records.config_fields(s.key.mode)
        assert s.best_config == {f: best[f] for f in fields}


def test_sample_bf16_fwd_problem(sample_doc: dict[str, Any]) -> None:
    doc = load_obj(sample_doc)
    (s,) = [
        s
        for s in report.best_table(doc)
        if (s.key.dtype, s.key.head_dim, s.key.seq, s.key.mode) == ("bfloat16", 64, 2048, "fwd")
    ]
    forced_ok = [
        r
        for r in sample_doc["results"]
        if r["dtype"] == "bfloat16" and r["mode"] == "fwd" and r["config"] == "forced" and "error" not in r
    ]
    best = min(forced_ok, key=lambda r: r["median_ms"])
    assert s.best_ms == best["median_ms"]
    assert s.best_label == (f"bq{best['block_q']} bk{best['block_k']} s{best['num_stages']} w{best['num_warps']}")


def test_sample_float32_failures_counted(sample_doc: dict[str, Any]) -> None:
    (s,) = [s for s in report.best_table(load_obj(sample_doc)) if s.key.dtype == "float32"]
    failed = [r for r in sample_doc["results"] if r["dtype"] == "float32" and "error" in r]
    assert s.n_failed == len(failed) > 0
    assert s.best_ms is not None and s.first_error is None


def test_sample_text_and_markdown(sample_doc: dict[str, Any]) -> None:
    summaries = report.best_table(load_obj(sample_doc))
    text = report.format_table(summaries)
    lines = text.splitlines()
    assert lines[0].split()[:6] == ["dtype", "D", "seq", "B", "H", "mode"]
    assert "tag" not in lines[0].split()  # one tag only
    assert len(lines) == 1 + len(summaries) + 2  # header, rows, blank, legend
    assert "4*B*H*S*S*D" in text
    for s in summaries:
        label = s.best_label
        assert label is not None and any(label in line and f"{s.best_ms:.4f}" in line for line in lines)
    md = report.format_table(summaries, "markdown").splitlines()
    assert md[0].startswith("| dtype |") and set(md[1]) <= set("|:-")
    assert all(line.count("|") == md[0].count("|") for line in md[2 : 2 + len(summaries)])


# --------------------------------------------------------------------------- edge cases


def test_noise_flag() -> None:
    close = [rec(ms=1.00, spread=0.03, block_q=64), rec(ms=1.02, spread=0.03, block_q=128)]
    apart = [rec(ms=1.00, spread=0.01, block_q=64), rec(ms=1.10, spread=0.01, block_q=128)]
    (s,) = report.best_table(load_obj(make_doc(close)))
    assert s.within_noise and "noise" in s.note
    (s,) = report.best_table(load_obj(make_doc(apart)))
    assert not s.within_noise and s.runner_up_label == "bq128 bk128 s2 w4"
    (s,) = report.best_table(load_obj(make_doc([rec(ms=1.0)])))  # no runner-up
    assert not s.within_noise and s.runner_up_label is None


def test_failed_and_all_failed_problem() -> None:
    records = [
        rec(auto=True, ms=2.0),
        rec(ms=1.0, block_q=64),
        rec(ms=None, block_q=128),
        rec(auto=True, ms=2.0, seq=4096),
        rec(ms=None, seq=4096, block_q=64),
        rec(error="ValueError: seq=4096 must be a multiple of block_q=96", seq=4096, block_q=96),
    ]
    a, b = report.best_table(load_obj(make_doc(records)))
    assert (a.best_ms, a.n_configs, a.n_failed, a.speedup) == (1.0, 2, 1, 2.0)
    assert b.best_ms is None and b.best_label is None and b.speedup is None and b.tflops is None
    assert (b.n_configs, b.n_failed, b.note) == (2, 2, "all failed")
    assert b.first_error is not None and b.first_error.startswith("JaxRuntimeError")
    row = [line for line in report.format_table([a, b]).splitlines() if " 4096 " in line][0]
    assert "all failed" in row and " - " in row


def test_auto_only_sweep() -> None:
    records = [rec("fwd", auto=True, ms=0.5), rec("fwd_bwd", auto=True, ms=1.5)]
    doc = make_doc(records, config={"tag": "t", "auto_only": True})
    summaries = report.best_table(load_obj(doc))
    assert [s.key.mode for s in summaries] == ["fwd", "fwd_bwd"]
    for s, ms in zip(summaries, (0.5, 1.5), strict=True):
        assert (s.auto_ms, s.best_ms, s.speedup, s.n_configs) == (ms, None, None, 0)
        assert s.note == "auto only (auto_only: true)"
    assert "auto only (auto_only: true)" in report.format_table(summaries)


def test_a_problem_of_only_auto_records_where_tile_configs_were_to_be_timed_says_only_auto_was_measured() -> None:
    """A reference-run document (no tilesweep block, ``auto_only: false``) holding only a
    problem's auto record: not "auto only", which reads as the sweep's choice, but what is true."""
    records = [rec(auto=True, ms=0.5), rec(auto=True, ms=1.0, seq=4096), rec(ms=0.8, seq=4096)]
    only_auto, tuned = report.best_table(load_obj(make_doc(records, config={"tag": "t", "auto_only": False})))
    assert only_auto.note == "only the kernel's own choice (auto) was measured; no tile config was"
    assert "auto" not in tuned.note


def test_auto_failed_or_absent() -> None:
    records = [rec(auto=True, ms=None), rec(ms=1.0), rec("fwd_bwd", ms=2.0)]
    a, b = report.best_table(load_obj(make_doc(records)))
    assert (a.auto_status, a.speedup, a.note) == ("failed", None, "auto failed")
    assert (b.auto_status, b.speedup) == ("absent", None)
    assert b.best_label == "o64 i32 s2 w4"
    rows = report.format_table([a, b]).splitlines()[1:3]
    assert all("-" in r.split() for r in rows)


def test_single_problem_and_extras_tolerated() -> None:
    r = rec(ms=1.0)
    r.update(
        timer="wall", unit="ms", attempt=2, pruned=False, smem_bytes=1234, compile_cached=True, something_new={"x": 1}
    )
    doc = load_obj(make_doc([r], sweep_id="abc", schema_version=3))
    assert doc.extra == {"sweep_id": "abc", "schema_version": 3}
    (s,) = report.best_table(doc)
    assert s.best_ms == 1.0 and s.n_configs == 1


def test_duplicate_attempts_count_once() -> None:
    records = [
        rec(ms=None, block_q=64, attempt=1),
        rec(ms=1.5, block_q=64, attempt=2),
        rec(ms=2.0, block_q=128),
        rec(ms=1.9, block_q=128, attempt=2),
    ]
    (s,) = report.best_table(load_obj(make_doc(records)))
    assert (s.n_configs, s.n_failed, s.best_ms, s.runner_up_ms) == (2, 0, 1.5, 1.9)


def test_pruned_counted_as_failed_and_the_note_says_it_never_ran() -> None:
    r = rec(ms=None, block_q=256)
    r["pruned"] = True
    (s,) = report.best_table(load_obj(make_doc([rec(ms=1.0), r])))
    assert (s.n_configs, s.n_failed, s.n_pruned) == (2, 1, 1)
    assert "1 of the failed pruned, not run" in s.note  # the text report has no pruned column


def test_fwd_bwd_label_names_fwd_blocks_only_when_not_default() -> None:
    assert (
        report.config_label(
            {"fwd_block_q": 128, "fwd_block_k": 128, "bwd_outer": 64, "bwd_inner": 32, "num_stages": 2, "num_warps": 8},
            "fwd_bwd",
        )
        == "o64 i32 s2 w8"
    )
    assert (
        report.config_label(
            {"fwd_block_q": 64, "fwd_block_k": 32, "bwd_outer": 64, "bwd_inner": 32, "num_stages": 2, "num_warps": 8},
            "fwd_bwd",
        )
        == "bq64 bk32 o64 i32 s2 w8"
    )


def test_several_tags_get_a_tag_column() -> None:
    records = [rec(ms=1.0, tag="h100"), rec(ms=2.0, tag="a100")]
    summaries = report.best_table(load_obj(make_doc(records)))
    assert len(summaries) == 2
    lines = report.format_table(summaries).splitlines()
    assert "tag" in lines[0].split() and "h100" in lines[1] and "a100" in lines[2]


def test_unknown_mode_has_no_flops() -> None:
    (s,) = report.best_table(load_obj(make_doc([rec("bwd", ms=1.0, block_q=64)])))
    assert s.flops is None and s.tflops is None and s.best_ms == 1.0


def test_empty_results() -> None:
    assert report.best_table(load_obj(make_doc([]))) == []
    assert "(no records)" in report.format_table([])


def test_json_form_states_flops() -> None:
    records = [rec(auto=True, ms=2.0), rec(ms=1.0), rec("fwd_bwd", ms=3.0)]
    out = report.to_json(report.best_table(load_obj(make_doc(records))))
    json.dumps(out)  # serialisable
    assert out[0]["flops_formula"].startswith("4*B*H*S*S*D")
    assert out[1]["flops_formula"].startswith("3.5*4*B*H*S*S*D")
    assert out[0]["flops"] == 4 * 4 * 8 * 2048 * 2048 * 64
    assert out[0]["best_config"] == {"block_q": 128, "block_k": 128, "num_stages": 2, "num_warps": 4}
