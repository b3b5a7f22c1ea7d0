"""End to end on this machine: a tiny sweep run by local worker processes, a worker
killed with SIGKILL and rerun, and the CLI's answers to bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.spec.records import FWD_BWD_CONFIG_FIELDS, FWD_CONFIG_FIELDS, IDENTITY_FIELDS, RESULT_FIELDS
from tests.helpers import assert_one_line_error

from .conftest import REPO, TINY_SPEC, run_cli

EXTRAS = ("timer", "samples_ms", "pruned", "smem_bytes", "compile_cached", "unit", "attempt")


def _record_lines(partial: Path) -> list[dict]:
    out = []
    for line in partial.read_text().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "record" in obj:
            out.append(obj)
    return out


def _check_reference_format(doc: dict, sample_record_types: dict[str, type]) -> None:
    assert list(doc)[:3] == ["device", "config", "results"]
    assert list(doc["device"]) == ["jax", "backend", "devices", "python", "device_kind"]
    for rec in doc["results"]:
        keys = list(rec)
        cfg = () if rec["config"] == "auto" else (FWD_CONFIG_FIELDS if rec["mode"] == "fwd" else FWD_BWD_CONFIG_FIELDS)
        head = list(IDENTITY_FIELDS) + list(cfg)
        assert keys[: len(head)] == head
        tail = keys[len(head) :]
        if "error" in rec:
            assert tail[0] == "error" and isinstance(rec["error"], str)
        else:
            assert tail[: len(RESULT_FIELDS)] == list(RESULT_FIELDS)
            for k in RESULT_FIELDS:
                assert isinstance(rec[k], sample_record_types[k]), (k, rec[k])
        assert set(tail) - set(RESULT_FIELDS) - {"error"} <= set(EXTRAS)


def test_tiny_sweep_end_to_end(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    # timed by the device timer with the L2 flush asked for (the CPU does not flush unless
    # asked): one real sweep covers them both; the wall timer's sweeps are the other tests here
    spec = write_spec(report={"html": True}, timing={**TINY_SPEC["timing"], "timer": "device", "flush_l2": True})
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    # progress in a log (stderr is a pipe here): whole lines, no carriage returns, the last one complete
    progress = [line for line in r.stderr.splitlines() if "|" in line and "item" in line]
    assert "\r" not in r.stderr, [line for line in r.stderr.split("\n") if "\r" in line]
    assert progress and progress[-1].startswith("100%|") and "6/6" in progress[-1]
    # report.html: true ends the run with the page's path
    assert r.stdout.splitlines()[-1] == f"report page: {tmp_path / 'results.html'}"
    assert (tmp_path / "results.html").read_text().count("<svg class='heatmap'") == 2
    doc = json.loads((tmp_path / "results.json").read_text())
    types = {"rel_err": float, "compile_s": float, "inner": int, "median_ms": float, "q1_ms": float, "q3_ms": float}
    _check_reference_format(doc, types)
    # every planned item once, in plan order, each checked against the reference
    plan = [json.loads(line) for line in run_cli("plan", str(spec), "--dry-run", "--json").stdout.splitlines()]

    def strip(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k in IDENTITY_FIELDS + FWD_CONFIG_FIELDS + FWD_BWD_CONFIG_FIELDS}

    assert [strip(r) for r in doc["results"]] == [strip(p) for p in plan]
    assert all(r["rel_err"] < 1e-4 for r in doc["results"] if "error" not in r)
    assert all(r["q1_ms"] <= r["median_ms"] <= r["q3_ms"] and 1 <= r["inner"] <= 2 for r in doc["results"])
    # every timed sample is kept, and the median is theirs
    timed = [r for r in doc["results"] if "error" not in r]
    assert all(len(r["samples_ms"]) == doc["config"]["repeats"] for r in timed)
    assert all(statistics.median(r["samples_ms"]) == pytest.approx(r["median_ms"]) for r in timed)
    assert doc["config"]["dtypes"] == ["float32"]
    # records name the timer; the document says how they were measured
    assert all(r["timer"] == "profiler_device_time" for r in doc["results"] if "error" not in r)
    measurement = doc["tilesweep"]["measurement"]
    assert measurement["flush_l2"] is True and measurement["timers"] == ["profiler_device_time"]
    assert measurement["clock"] == ["real"] and measurement["strategy"] == "full"
    # the best-config table is printed
    assert "speedup" in r.stdout and "fwd_bwd" in r.stdout
    # running again redoes nothing: the partials keep one record per item
    partials = sorted((sweep / "partials").glob("*.jsonl"))
    before = sum(len(_record_lines(p)) for p in partials)
    r2 = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r2.returncode == 0, r2.stderr
    assert sum(len(_record_lines(p)) for p in partials) == before == len(plan)
    # status from a new process
    st = json.loads(run_cli("status", str(sweep), "--json").stdout)
    assert st["done"] == st["planned"] == len(plan) and st["complete"]


def test_worker_killed_with_sigkill_and_rerun_keeps_every_record(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(fwd_block_q=[16, 32, 64], fwd_block_k=[16, 32], modes=["fwd"])  # 6 configs and auto
    sweep = tmp_path / "sweep"
    r = run_cli("plan", str(spec), "--units", "1", "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    partial = next((sweep / "partials").glob("*.jsonl"), None)
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobs.worker", str(sweep), "0"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        partial = next((sweep / "partials").glob("*.jsonl"), None)
        if partial is not None and len(_record_lines(partial)) >= 3:
            break
        assert worker.poll() is None, worker.communicate()[1].decode()
        time.sleep(0.05)
    assert partial is not None
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    before = {o["id"]: o["record"] for o in _record_lines(partial)}
    assert 3 <= len(before) < 7
    assert not any((sweep / "done").iterdir()), "a killed unit must not be marked complete"
    rerun = subprocess.run(
        [sys.executable, "-m", "jobs.worker", str(sweep), "0"], cwd=REPO, capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr
    after = _record_lines(partial)
    ids = [o["id"] for o in after]
    assert len(ids) == len(set(ids)) == 7  # every item once: none lost, none duplicated
    assert all({o["id"]: o["record"] for o in after}[i] == rec for i, rec in before.items())
    assert [o["attempt"] for o in after if o["id"] not in before] == [2] * (7 - len(before))
    assert any((sweep / "done").iterdir())
    assert run_cli("merge", str(sweep)).returncode == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["results"]) == 7


def test_bad_input_gets_one_line_errors(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    assert_one_line_error(run_cli("run", str(tmp_path / "missing.json")), "missing.json", "does not exist")
    bad = write_spec("bad.json", fwd_block_q=[32, 48])
    assert_one_line_error(run_cli("plan", str(bad), "--dry-run"), "bad.json", "fwd_block_q", "powers of two")
    typo = write_spec("typo.json", head_dim=[64])
    assert_one_line_error(
        run_cli("plan", str(typo), "--dry-run"), 'unknown field "head_dim"', 'did you mean "head_dims"'
    )
    empty = write_spec("empty.json", seq_lens=[])
    assert_one_line_error(run_cli("plan", str(empty), "--dry-run"), "seq_lens")
    wrong_type = write_spec("wt.json", repeats="many")
    assert_one_line_error(run_cli("plan", str(wrong_type), "--dry-run"), "repeats")
    garbage = tmp_path / "garbage.toml"
    garbage.write_text("= =")
    assert_one_line_error(run_cli("plan", str(garbage), "--dry-run"), "garbage.toml", "TOML")
    assert_one_line_error(run_cli("status", str(tmp_path)), "not a sweep directory")
    assert_one_line_error(run_cli("merge", str(tmp_path / "nowhere")), "does not exist")
    assert_one_line_error(run_cli("plan", str(write_spec()), "--units", "0", "--dry-run"), "--units")
    assert_one_line_error(run_cli("frobnicate"), 'unknown "frobnicate"; choose from spec, plan, run')
    # a sweep directory of another spec is refused, and nothing in it is touched
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(write_spec("a.json")), "--sweep-dir", str(sweep)).returncode == 0
    frozen = (sweep / "sweep.json").read_text()
    assert_one_line_error(
        run_cli("run", str(write_spec("b.json", repeats=3)), "--sweep-dir", str(sweep)),
        "another spec (repeats 3 in this spec, 2 in the sweep's)",
    )
    assert (sweep / "sweep.json").read_text() == frozen
    # the worker by hand: a unit that does not exist
    w = subprocess.run(
        [sys.executable, "-m", "jobs.worker", str(sweep), "nope"], cwd=REPO, capture_output=True, text=True
    )
    assert_one_line_error(w, 'unit "nope" is no unit of')


def test_a_gpu_task_without_a_gpu_backend_is_refused() -> None:
    """A node that allocated GPUs but whose jax has no CUDA plugin must not silently time the
    kernels interpreted on the CPU."""
    from jobs.node_env import check_backend
    from orchestrator.errors import WorkerEnvironmentError

    with pytest.raises(WorkerEnvironmentError, match="CUDA_VISIBLE_DEVICES=0 but jax sees none"):
        check_backend("auto", "cpu", "0", "s/sweep.json")
    with pytest.raises(WorkerEnvironmentError, match="kernel.interpret is false"):
        check_backend(False, "cpu", None, "s/sweep.json")
    check_backend(True, "cpu", "0", "s/sweep.json")  # interpret mode on purpose
    check_backend("auto", "cpu", "", "s/sweep.json")  # no GPU allocated: interpret by itself
    check_backend("auto", "gpu", "0", "s/sweep.json")


@pytest.mark.parametrize("executor", ["local", "debug"])
def test_interpret_false_run_here_without_a_gpu_is_refused_before_anything_is_written(
    write_spec: Callable[..., Path], tmp_path: Path, executor: str
) -> None:
    spec = write_spec(kernel={"interpret": False}, executor={"kind": executor})
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert_one_line_error(r, "kernel.interpret is false but jax sees no GPU here", "set kernel.interpret to auto")
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "results.json").exists()
    # a sweep planned for it (a plan runs nothing) is refused by resume as by run: no unit, no
    # worker, no empty document, no failed unit for status to report
    sweep = tmp_path / "planned"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    units = (sweep / "units.json").read_bytes()
    r = run_cli("resume", str(sweep))
    assert_one_line_error(r, "kernel.interpret is false but jax sees no GPU here", "set kernel.interpret to auto")
    assert (sweep / "units.json").read_bytes() == units and not (sweep / "jobs.jsonl").exists()
    assert not (tmp_path / "results.json").exists()


def test_worker_refusal_is_one_line(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(kernel={"interpret": "auto"})
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    w = subprocess.run(
        [sys.executable, "-m", "jobs.worker", str(sweep), "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0", "JAX_PLATFORMS": "cpu"},
    )
    # the ways on are commands that take them: resume once jax sees the GPU, or interpret mode as
    # another sweep (kernel.interpret is part of the fingerprint), not an edit of sweep.json
    line = assert_one_line_error(
        w,
        "jax sees none",
        f"then `tilesweep resume {sweep}`; or, to time interpret mode on purpose, set kernel.interpret to true in "
        f"{spec} and `tilesweep run {spec}`, another sweep (kernel.interpret is part of its fingerprint)",
    )
    assert "sweep.json" not in line, line
    assert not list((sweep / "partials").glob("*.jsonl")) or all(
        not _record_lines(p) for p in (sweep / "partials").glob("*.jsonl")
    )


def test_a_debug_run_says_a_failed_unit_as_a_local_run_does_and_its_log_keeps_the_reason(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """A unit of the debug executor (run in the command's process) whose worker refuses its
    environment: the command says it as it says a worker process's, each line prefixed once
    ("tilesweep: warning: unit ... failed", not "tilesweep: error: tilesweep: unit ..."), and the
    unit's log ends with the worker's own line, which status reads."""
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], kernel={"interpret": "auto"}, executor={"kind": "debug"})
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), env={"CUDA_VISIBLE_DEVICES": "0", "JAX_PLATFORMS": "cpu"})
    (unit,) = [u["id"] for u in json.loads((sweep / "units.json").read_text())]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "tilesweep: error: tilesweep:" not in r.stderr and "tilesweep: warning: tilesweep:" not in r.stderr, r.stderr
    said = [line for line in r.stderr.splitlines() if "jax sees none" in line]
    assert len(said) == 2, said  # as a local run says it: when the unit failed, and in the summary at the end
    assert said[0].startswith(f"tilesweep: warning: unit {unit} failed (job "), said
    assert said[1].startswith(f"tilesweep: unit {unit} failed: this task was given GPU(s)"), said
    status = json.loads(run_cli("status", str(sweep), "--json").stdout)
    (failed,) = status["units"]
    assert failed["state"] == "failed" and "CUDA_VISIBLE_DEVICES=0 but jax sees none" in failed["detail"], failed


def _one_config_run(write_spec: Callable[..., Path], tmp_path: Path) -> tuple[Path, Path]:
    """A sweep of one fwd config, run here (the debug executor) into ``tmp_path/results.json``:
    its spec file and its sweep directory."""
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], executor={"kind": "debug"})
    sweep = tmp_path / "sweep"
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    return spec, sweep


def test_a_rerun_with_another_output_merges_there_and_a_refused_output_leaves_no_sweep(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec, sweep = _one_config_run(write_spec, tmp_path)
    first = (tmp_path / "results.json").read_bytes()
    other = tmp_path / "other.json"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--output", str(other))
    assert r.returncode == 0, r.stderr
    assert f"merges into {other} from now on" in r.stderr and f"into {other}" in r.stdout + r.stderr
    assert json.loads(other.read_text())["results"] == json.loads(first)["results"]
    assert (tmp_path / "results.json").read_bytes() == first
    assert run_cli("merge", str(sweep)).returncode == 0 and other.stat().st_size  # later merges follow it
    edited = tmp_path / "edited.json"  # the spec file it was planned from, its output edited
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "output": str(edited)}))
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0 and f"merges into {edited} from now on" in r.stderr and edited.exists(), r.stderr
    # an output that is the spec itself: refused, and the sweep directory made for it is gone again
    refused = tmp_path / "refused"
    r = run_cli("run", str(spec), "--sweep-dir", str(refused), "--output", str(spec))
    assert r.returncode == 2 and f"is the spec file {spec} this command reads" in r.stderr and not refused.exists()
    assert len(r.stderr.splitlines()) == 1, r.stderr  # the refusal alone
    r = run_cli("run", str(spec), "--sweep-dir", str(refused), "--output", str(tmp_path / "good.json"))
    assert r.returncode == 0, r.stderr


def test_a_rerun_refused_for_its_new_output_or_its_damaged_directory_keeps_its_output(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec, sweep = _one_config_run(write_spec, tmp_path)
    theirs = tmp_path / "theirs.json"  # another sweep's document
    other = write_spec(name="other.json", modes=["fwd"], fwd_block_q=[64], executor={"kind": "debug"})
    assert run_cli("run", str(other), "--sweep-dir", str(tmp_path / "other"), "--output", str(theirs)).returncode == 0
    output = json.loads((sweep / "sweep.json").read_text())["output"]

    def refused(*args: str) -> str:
        r = run_cli("run", str(spec), "--sweep-dir", str(sweep), *args)
        assert r.returncode == 2 and "from now on" not in r.stderr, r.stderr
        assert json.loads((sweep / "sweep.json").read_text())["output"] == output  # it still merges where it did
        return r.stderr

    assert "not this sweep's" in refused("--output", str(theirs))
    (sweep / "partials").rename(tmp_path / "partials")
    (sweep / "partials").touch()
    assert "is a file, where a directory belongs" in refused("--output", str(tmp_path / "new.json"))


def test_an_output_that_is_a_file_of_the_sweep_directory_is_refused_even_with_overwrite(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec, sweep = _one_config_run(write_spec, tmp_path)
    for own in (sweep / "merge-cache" / "output-stamps.json", sweep / "sweep.json", sweep / "partials" / "x.json"):
        before = own.read_bytes() if own.exists() else None
        for extra in ((), ("--overwrite",)):
            r = run_cli("merge", str(sweep), "--output", str(own), *extra)
            assert_one_line_error(r, "is a file of the sweep directory")
            assert (own.read_bytes() if own.exists() else None) == before
    assert run_cli("status", str(sweep)).returncode == 0
    fresh = tmp_path / "fresh"
    r = run_cli("run", str(spec), "--sweep-dir", str(fresh), "--output", str(fresh / "units.json"))
    assert_one_line_error(r, "is a file of the sweep directory")
    assert not fresh.exists()
    beside = run_cli("merge", str(sweep), "--output", str(sweep / "results.json"))  # a name of its own there
    assert beside.returncode == 0 and (sweep / "results.json").exists(), beside.stderr


def test_a_compile_cache_folder_that_cannot_be_made_is_refused_before_anything_runs(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """``compile.cache_dir`` under a file: every unit failed on it, and the sweep kept it. It is
    refused at once, the sweep directory not made; a sweep whose planned cache folder became
    unusable since is refused too, saying that its cache folder is the planned one."""
    (tmp_path / "a-file").write_text("")
    spec = write_spec(modes=["fwd"], compile={"cache_dir": str(tmp_path / "a-file" / "cache")})
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert_one_line_error(r, f"compile.cache_dir {tmp_path / 'a-file' / 'cache'}: ", "is not a directory")
    assert not sweep.exists()
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], compile={"cache_dir": str(tmp_path / "cache")})
    assert run_cli("run", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    shutil.rmtree(tmp_path / "cache")
    (tmp_path / "cache").write_text("")
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep))
    assert_one_line_error(r, "plan the sweep anew in another --sweep-dir")


def test_a_results_document_given_as_the_spec_is_the_sweep_that_wrote_it(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """``run RESULTS.json`` of tilesweep's own document plans the sweep that wrote it, every
    section included (its timing here): every record is carried, nothing is measured again, and
    the document keeps its timings (its config block alone named other timing settings, so every
    config was measured again)."""
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], timing={"target_ms": 1, "max_inner": 2, "warmup": 0})
    assert run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "first")).returncode == 0
    doc = tmp_path / "results.json"
    before = json.loads(doc.read_text())["results"]
    checked = run_cli("spec", str(doc))
    assert checked.returncode == 0 and json.loads(checked.stdout)["timing"]["max_inner"] == 2, checked.stdout
    again = run_cli("run", str(doc), "--sweep-dir", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    assert f"reused 2 items measured before (not measured again): 2 from {doc}" in again.stderr, again.stderr
    after = json.loads(doc.read_text())["results"]
    timed = [(r["config"], r.get("block_q"), r["median_ms"], r["samples_ms"]) for r in before]
    assert [(r["config"], r.get("block_q"), r["median_ms"], r["samples_ms"]) for r in after] == timed
    assert all("reused_from" in r for r in after)


def test_the_logs_of_a_one_unit_sweep_with_one_compile_thread_count_in_the_singular(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(modes=["fwd"], fwd_block_q=[32], compile={"workers": 1}, sharding={"units": 1})
    sweep = tmp_path / "sweep"
    r = run_cli("-v", "run", str(spec), "--sweep-dir", str(sweep))
    assert r.returncode == 0, r.stderr
    (planned,) = [line for line in r.stderr.splitlines() if "reuseplan: planned " in line]
    assert planned.endswith("planned 2 items: 0 reused, 2 in 1 unit"), planned  # the config and auto
    log = run_cli("logs", str(sweep), "0")
    assert log.returncode == 0, log.stderr
    (compiling,) = [line for line in log.stdout.splitlines() if "jobs.compiled:" in line]
    assert ": 1 compile thread, cache " in compiling, compiling
