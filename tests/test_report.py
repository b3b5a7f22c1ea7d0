"""report: best config per problem, checked against numbers computed here from the records."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import report
from orchestrator.cli import analysis as cli_report
from orchestrator.errors import ResultsError, TilesweepError
from orchestrator.spec import records
from orchestrator.store import document as results_doc

REPO = Path(__file__).resolve().parent.parent
RESULTS = ("rel_err", "compile_s", "inner", "median_ms", "q1_ms", "q3_ms")


# --------------------------------------------------------------------------- builders


def rec(
    mode: str = "fwd",
    *,
    auto: bool = False,
    ms: float | None = 1.0,
    spread: float = 0.01,
    error: str | None = None,
    dtype: str = "bfloat16",
    head_dim: int = 64,
    seq: int = 2048,
    batch: int = 4,
    heads: int = 8,
    tag: str = "t",
    **cfg: Any,
) -> dict[str, Any]:
    """One record in the reference layout; ``ms=None`` or ``error`` makes a failed config."""
    r: dict[str, Any] = {
        "dtype": dtype,
        "head_dim": head_dim,
        "seq": seq,
        "batch": batch,
        "heads": heads,
        "tag": tag,
        "mode": mode,
        "config": "auto" if auto else "forced",
    }
    if not auto:
        if mode == "fwd":
            defaults = {"block_q": 128, "block_k": 128, "num_stages": 2, "num_warps": 4}
        else:
            defaults = {
                "fwd_block_q": 128,
                "fwd_block_k": 128,
                "bwd_outer": 64,
                "bwd_inner": 32,
                "num_stages": 2,
                "num_warps": 4,
            }
        r.update({**defaults, **cfg})
    if error is not None or ms is None:
        r["error"] = error or "JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded"
    else:
        r.update(rel_err=1e-3, compile_s=0.2, inner=10, median_ms=ms, q1_ms=ms * (1 - spread), q3_ms=ms * (1 + spread))
    return r


def make_doc(records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "device": {"jax": "0.11.2", "device_kind": "NVIDIA H100"},
        "config": {"tag": "t"},
        "results": records,
        **extra,
    }


def write(tmp_path: Path, doc: Any, name: str = "results.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def load_obj(doc: dict[str, Any]) -> results_doc.ResultsDoc:
    return results_doc.from_obj(doc, name="test.json")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilesweep")
    cli_report.register(p.add_subparsers(dest="command", required=True))
    return p


def run_handler(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = parser().parse_args(argv)
    rc = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err


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
        assert any(s.best_label in line and f"{s.best_ms:.4f}" in line for line in lines)
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
    assert b.first_error.startswith("JaxRuntimeError")
    row = [line for line in report.format_table([a, b]).splitlines() if " 4096 " in line][0]
    assert "all failed" in row and " - " in row


def test_auto_only_sweep() -> None:
    records = [rec("fwd", auto=True, ms=0.5), rec("fwd_bwd", auto=True, ms=1.5)]
    summaries = report.best_table(load_obj(make_doc(records)))
    assert [s.key.mode for s in summaries] == ["fwd", "fwd_bwd"]
    for s, ms in zip(summaries, (0.5, 1.5), strict=True):
        assert (s.auto_ms, s.best_ms, s.speedup, s.n_configs, s.note) == (ms, None, None, 0, "auto only")
    assert "auto only" in report.format_table(summaries)


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


def test_pruned_counted_as_failed() -> None:
    r = rec(ms=None, block_q=256)
    r["pruned"] = True
    (s,) = report.best_table(load_obj(make_doc([rec(ms=1.0), r])))
    assert (s.n_configs, s.n_failed, s.n_pruned) == (2, 1, 1)


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


# --------------------------------------------------------------------------- not a results document


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "top level is a JSON array"),
        (json.dumps({"device": {}, "results": []}), "missing top-level key(s) config"),
        (json.dumps({"device": {}, "config": {}, "results": {}}), "'results' is a JSON object"),
        (json.dumps({"device": {}, "config": {}, "results": [3]}), "results[0] is a JSON number"),
        (
            json.dumps(make_doc([rec(ms=1.0), {"dtype": "bfloat16", "seq": 1}])),
            "results[1] lacks identity field(s) head_dim, batch, heads, tag, mode, config",
        ),
    ],
)
def test_not_a_results_document(tmp_path: Path, content: str, fragment: str) -> None:
    path = write(tmp_path, content, "bad.json")
    with pytest.raises(ResultsError) as info:
        results_doc.load(path)
    msg = info.value.message
    assert msg.startswith(str(path)) and fragment in msg and "\n" not in msg
    assert isinstance(info.value, TilesweepError)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such file"):
        results_doc.load(tmp_path / "nope.json")
    with pytest.raises(ResultsError, match="is a directory"):
        results_doc.load(tmp_path)


def test_stdlib_parser_gives_same_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, make_doc([rec(ms=1.25), rec(auto=True, ms=None)]))
    fast = results_doc.load(path)
    monkeypatch.setattr(results_doc, "_orjson", None)
    slow = results_doc.load(path)
    assert (fast.device, fast.config, fast.results) == (slow.device, slow.config, slow.results)


# --------------------------------------------------------------------------- CLI


def test_cli_report_text_json_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write(tmp_path, make_doc([rec(auto=True, ms=2.0), rec(ms=1.0), rec(ms=1.5, block_q=64)])))
    rc, out, _ = run_handler(["report", path], capsys)
    assert rc == 0 and "bq128 bk128 s2 w4" in out and "2.00x" in out
    rc, out, _ = run_handler(["report", path, "--json"], capsys)
    data = json.loads(out)
    assert rc == 0 and isinstance(data, list) and data[0]["speedup"] == 2.0
    rc, out, _ = run_handler(["report", path, "--markdown"], capsys)
    assert rc == 0 and out.startswith("| dtype |")
    with pytest.raises(SystemExit):
        parser().parse_args(["report", path, "--json", "--markdown"])


def test_cli_report_bad_file_raises_results_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ResultsError, match="no such file"):
        run_handler(["report", str(tmp_path / "missing.json")], capsys)


def test_cli_subprocess_one_line_error_exit_2(tmp_path: Path) -> None:
    bad = write(tmp_path, "[]", "bad.json")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.analysis", "report", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "not a results document" in proc.stderr
    good = write(tmp_path, make_doc([rec(ms=1.0)]), "good.json")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.analysis", "report", str(good)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0 and "bq128 bk128 s2 w4" in proc.stdout
