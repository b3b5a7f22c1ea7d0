"""Replay (``kernel.impl: replay``): a sweep that compiles and runs nothing and answers from a
results document, through the real plan, worker, partials, merge and report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobs.replay import draw
from orchestrator.spec.records import record_key
from tests.conftest import SAMPLE, run_cli
from tests.helpers import assert_one_line_error, replay_spec, replay_specs, sample_config, synthetic_source


def excerpt_spec(tmp_path: Path, name: str = "replay.json", source: Path = SAMPLE, **over: Any) -> Path:
    """The excerpt's own config at its seq, replayed from ``source``; prune_smem off, so the
    source's shared-memory failures replay as they were recorded."""
    output = tmp_path / f"{Path(name).stem}.results.json"
    grid = {**sample_config(), "seq_lens": [2048]}
    return replay_spec(tmp_path / name, grid, source, output, kernel={"prune_smem": "off"}, **over)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_replayed_median_lies_within_the_records_quartiles(n: int) -> None:
    rec = {"median_ms": 1.0, "q1_ms": 0.9, "q3_ms": 1.3}
    rng = np.random.default_rng(n)
    for _ in range(500):
        samples = draw(rec, n, rng)
        assert len(samples) == n and samples.min() > 0
        assert 0.9 <= float(np.median(samples)) <= 1.3


def test_replay_of_the_excerpt_through_run_reproduces_every_median(tmp_path: Path, sample_doc: dict[str, Any]) -> None:
    spec = excerpt_spec(tmp_path)
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "replay.results.json").read_text())
    assert len(doc["results"]) == 416  # 8 problems at seq 2048: the excerpt measured 3 of them
    replayed = {record_key(rec): rec for rec in doc["results"]}
    for src in sample_doc["results"]:
        rec = replayed.pop(record_key(src))
        if "error" in src:
            assert rec["error"] == src["error"]
            continue
        assert src["q1_ms"] <= rec["median_ms"] <= src["q3_ms"], (src, rec)
        assert rec["rel_err"] == src["rel_err"] and rec["compile_s"] == src["compile_s"]
        assert rec["timer"] == "virtual"
    assert replayed and all(rec["error"].startswith("ReplayMissing: the replay source") for rec in replayed.values())
    assert doc["device"]["backend"] == "replay" and doc["device"]["device_kind"] == "NVIDIA H100"
    assert doc["tilesweep"]["measurement"]["clock"] == ["virtual"]
    markers = [json.loads(p.read_text()) for p in (sweep / "done").glob("*.json")]
    assert markers and {m["clock"] for m in markers} == {"virtual"}
    assert sum(m["timed_s"] for m in markers) > 0 and sum(m["compile_sum_s"] for m in markers) > 0
    assert "bq" in r.stdout  # the best-config table was printed


def test_a_full_replay_takes_no_screened_record_for_a_full_timing(tmp_path: Path, sample_doc: dict[str, Any]) -> None:
    """A halving sweep's screen is one sample: replayed as a full timing it would be three
    identical samples, a spread nobody measured. Such a config replays as an error record."""
    timed = [rec for rec in sample_doc["results"] if "error" not in rec]
    for rec in timed[:3]:
        rec["screened"] = True
    source = tmp_path / "halving.json"
    source.write_text(json.dumps(sample_doc))
    r = run_cli(
        "run", str(excerpt_spec(tmp_path, source=source)), "--sweep-dir", str(tmp_path / "s"), "--executor", "debug"
    )
    assert r.returncode == 0, r.stderr
    replayed = {record_key(rec): rec for rec in json.loads((tmp_path / "replay.results.json").read_text())["results"]}
    for rec in timed[:3]:
        assert "only screened this config" in replayed[record_key(rec)]["error"]
    assert "error" not in replayed[record_key(timed[3])]


def test_bad_replay_sources_are_one_line_errors(tmp_path: Path) -> None:
    not_a_doc = tmp_path / "list.json"
    not_a_doc.write_text("[1, 2]")
    r = run_cli("plan", str(excerpt_spec(tmp_path, "a.json", source=not_a_doc)), "--dry-run")
    assert_one_line_error(r, "replay.source", str(not_a_doc), "not a results document")

    r = run_cli("run", str(excerpt_spec(tmp_path, "b.json", heads=4)), "--sweep-dir", str(tmp_path / "b"))
    assert_one_line_error(r, "another spec", "heads=8", "heads=4")
    assert not (tmp_path / "b").exists()  # refused before anything was planned
    # the excerpt measured our kernel, non-causal, multi-head: a replay of jax's kernel, of causal
    # or of grouped-query problems would find none of its records
    other_problems: list[tuple[str, dict[str, Any], list[str]]] = [
        (
            "c.json",
            {"replay": {"source": str(SAMPLE), "impl": "jax"}},
            ["measured the tilesweep kernel", "replay.impl is jax", '"impl": "tilesweep"'],
        ),
        ("d.json", {"causal": [False, True]}, ["causal [True] were not measured"]),
        ("e.json", {"kv_heads": [2]}, ["kv_heads [2] were not measured", "its kv_heads: [8]"]),
    ]
    for name, over, needles in other_problems:
        r = run_cli("plan", str(excerpt_spec(tmp_path, name, **over)), "--dry-run")
        assert_one_line_error(r, "another spec", *needles)


def test_a_replay_into_its_own_source_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Its merge would replace the measurements it replays with replayed ones."""
    source = tmp_path / "measured.json"
    source.write_bytes(SAMPLE.read_bytes())
    spec = excerpt_spec(tmp_path, "self.json", source=source, output=str(tmp_path / "." / "measured.json"))
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "self"))
    assert_one_line_error(r, "replay.source", "this sweep's output", "set output to another file")
    assert source.read_bytes() == SAMPLE.read_bytes() and not (tmp_path / "self").exists()


def test_replay_needs_its_source_and_the_strategy_settings_are_checked() -> None:
    from orchestrator.errors import SpecError
    from orchestrator.spec.files import spec_from_data

    cases: list[tuple[dict[str, Any], str]] = [
        ({"kernel": {"impl": "replay"}}, 'no replay source is given: add "replay"'),
        ({"replay": {"source": "x.json"}}, 'replay.source is given but kernel.impl is "tilesweep"'),
        ({"kernel": {"impl": "triton"}}, '"kernel.impl"'),
        ({"timing": {"keep": 0}}, '"timing.keep"'),
        ({"timing": {"screen_ms": 50}}, "screen_ms=50 must be below target_ms=50"),
        ({"timing": {"strategy": "racing"}}, '"full", "halving" or "search"'),
        ({"timing": {"timer": "cuda"}}, '"wall" or "device"'),
        ({"timing": {"flush_l2": "yes"}}, '"timing.flush_l2"'),
    ]
    for data, needle in cases:
        with pytest.raises(SpecError) as err:
            spec_from_data(data, source="s.json")
        assert needle in err.value.message and "\n" not in err.value.message, (data, err.value.message)


def test_a_replay_plans_the_implementation_its_source_measured(sample_doc: dict[str, Any]) -> None:
    """kernel.impl is replay; the configs planned, their records' impl and the document's config
    block are those of replay.impl (default: ours), so the source's records are found."""
    from orchestrator.planning import expand
    from orchestrator.spec.files import spec_from_data

    base = {**sample_doc["config"], "kernel": {"impl": "replay"}}
    ours = spec_from_data({**base, "replay": {"source": "x.json"}})
    stock = spec_from_data({**base, "replay": {"source": "x.json", "impl": "jax"}, "kv_heads": [None]})
    assert ours.measured_impl == "tilesweep" and stock.measured_impl == "jax"
    assert "kernel" not in ours.reference_config() and stock.reference_config()["kernel"]["impl"] == "jax"
    assert ours.fingerprint() != stock.fingerprint()
    assert {it.impl for it in expand(ours)} == {"tilesweep"} and {it.impl for it in expand(stock)} == {"jax"}


def test_replay_at_the_real_pace_waits_out_each_records_seconds(tmp_path: Path) -> None:
    """replay.pace: real (rehearsing time limits on a CPU partition): the same records as the
    instant replay, the same sweep (fingerprint: a sweep may be resumed at either pace), but the
    unit lasts the virtual seconds it replays."""
    from orchestrator.spec.files import spec_from_data
    from tests.conftest import TINY_SPEC

    grid = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [16, 32], "timing": {"target_ms": 200, "warmup": 0}}
    timed = {"compile_s": 0.2, "median_ms": 2.0, "q1_ms": 1.9, "q3_ms": 2.1}
    source = synthetic_source(tmp_path / "source.json", grid, lambda k: timed)
    docs = {}
    markers = {}
    for pace in ("instant", "real"):
        spec = replay_spec(
            tmp_path / f"{pace}.spec.json", grid, source, tmp_path / f"{pace}.json", replay={"pace": pace}
        )
        sweep = tmp_path / f"sweep-{pace}"
        r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug")
        assert r.returncode == 0, r.stderr
        docs[pace] = json.loads((tmp_path / f"{pace}.json").read_text())["results"]
        (markers[pace],) = [json.loads(p.read_text()) for p in (sweep / "done").glob("*.json")]
    assert docs["real"] == docs["instant"] and len(docs["real"]) == 3, (docs["real"][0], docs["instant"][0])
    virtual = markers["real"]["compile_sum_s"] + markers["real"]["timed_s"]
    assert virtual > 1.5 and markers["real"]["wall_s"] >= virtual > markers["instant"]["wall_s"]
    fingerprints = {spec_from_data(json.loads((tmp_path / f"{p}.spec.json").read_text())).fingerprint() for p in docs}
    assert len(fingerprints) == 1


def test_a_stop_that_ends_a_paced_wait_leaves_that_record_unwritten(tmp_path: Path) -> None:
    """A stop that does not raise (SLURM's time-limit warning, a whole-node task's SIGTERM: the
    worker's stop_check) ends the wait for a record's seconds: that record is not written, so a
    rehearsal of time limits gets no record its seconds were not spent on."""
    from jobs.worker import run_unit
    from orchestrator.store.partials import read_partial
    from orchestrator.store.sweepdir import SweepDir
    from tests.conftest import TINY_SPEC

    grid = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [16, 32]}
    # a minute per record: only the stop ends the wait
    source = synthetic_source(tmp_path / "source.json", grid, lambda k: {"compile_s": 60.0})
    spec = replay_spec(tmp_path / "spec.json", grid, source, tmp_path / "out.json", replay={"pace": "real"})
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep), "--units", "1").returncode == 0
    checks = []

    def stop_check() -> bool:  # False before the first record, True once its wait has begun
        checks.append(1)
        return len(checks) > 1

    summary = run_unit(str(sweep), "0", stop_check=stop_check)
    sd = SweepDir.open(sweep)
    content = read_partial(sd.partial_path(sd.unit_index()[0]["id"]))
    assert summary["stopped"] and content.records == {}, content.records


def test_a_replay_resumed_with_a_spec_of_the_other_pace_replays_at_that_pace(tmp_path: Path) -> None:
    specs = replay_specs(tmp_path, lambda k: 60.0, "debug")  # a minute per record at the real pace
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(specs["real"]), "--sweep-dir", str(sweep)).returncode == 0
    r = run_cli("resume", str(sweep), "--spec", str(specs["instant"]), timeout=120)  # not three minutes
    assert r.returncode == 0 and f"{sweep} replays at pace instant from now on" in r.stderr, r.stderr
    assert json.loads((sweep / "sweep.json").read_text())["spec"]["replay"]["pace"] == "instant"
    assert len(json.loads((tmp_path / "out.json").read_text())["results"]) == 3
