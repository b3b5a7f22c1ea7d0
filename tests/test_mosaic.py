"""jax's Mosaic GPU attention (``kernel.impl: mosaic``) before any GPU: its grid and
constraints, what the planner refuses, its records, and a replayed Mosaic sweep through run,
report, export and reuse. Nothing here lowers (``tests/kernels/test_preflight.py`` does)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import PlanError, SpecError
from orchestrator.planning import INVALID, RUN, expand, notes
from orchestrator.spec.files import spec_from_data
from orchestrator.spec.model import SweepSpec
from orchestrator.store.layouts import check_record
from orchestrator.store.synthetic import document
from tests.helpers import MOSAIC_SPEC, assert_one_line_error, run_cli


def _spec(**over: Any) -> SweepSpec:
    return spec_from_data({**MOSAIC_SPEC, **over})


@pytest.mark.parametrize(
    ("over", "needles"),
    [
        ({"grid": {"fwd": {"block_q": [64, 96]}}}, ("grid.fwd", "block_q=96", "multiple of 64", "TuningConfig")),
        ({"grid": {"fwd": {"max_concurrent_steps": [1]}}}, ("max_concurrent_steps=1", "at least 2")),
        ({"grid": {"fwd": {"block_k": [64]}}}, ('"block_k" is not a tunable', "block_q, block_kv, max_concurrent")),
        ({"modes": ["fwd"], "grid": {"fwd_bwd": {"block_q": [64]}}}, ('grid names mode "fwd_bwd"', '["fwd"]')),
        ({"fwd_block_q": [64]}, ("fwd_block_q is a field of the Triton kernels' grid", "drop fwd_block_q")),
        ({"smem_limit_bytes": 100000}, ("smem_limit_bytes", "kernel.device_kind's limit")),
        ({"grid": {"fwd_bwd": {"compute_wgs_bwd": [0]}}}, ("compute_wgs_bwd=0", "divides by zero")),
        ({"kernel": {"impl": "mosaic", "device_kind": "H100"}}, ("kernel.device_kind", '"NVIDIA H200"')),
    ],
)
def test_a_grid_the_kernel_refuses_is_one_line_naming_the_rule(over: dict[str, Any], needles: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as err:
        _spec(**over)
    assert "\n" not in err.value.message
    for n in needles:
        assert n in err.value.message, err.value.message


@pytest.mark.parametrize(
    ("over", "needles"),
    [
        ({"dtypes": ["bfloat16", "float16"]}, ('dtypes ["bfloat16"]', "float16", "Expected dtypes to match")),
        ({"causal": [True]}, ('causal true with modes ["fwd", "fwd_bwd"]', "backwards pass")),
        ({"causal": [False, True]}, ('use modes ["fwd"] for it (or causal [false] here', "a spec of its own")),
        ({"head_dims": [96]}, ("head_dims [96]", "divisible by 64")),
        ({"kernel": {"impl": "mosaic", "device_kind": "NVIDIA B200"}}, ('"NVIDIA B200" is sm_100', "sm_90")),
    ],
)
def test_what_the_kernel_cannot_do_is_refused_at_plan_time(over: dict[str, Any], needles: tuple[str, ...]) -> None:
    with pytest.raises(PlanError) as err:
        expand(_spec(**over))
    assert "\n" not in err.value.message and 'kernel.impl "mosaic"' in err.value.message
    for n in needles:
        assert n in err.value.message, err.value.message


def test_a_spec_file_the_kernel_cannot_plan_is_named_with_the_fix_by_every_command(tmp_path: Path) -> None:
    """spec, plan, plan --lower and run each refuse it in one line that names the file, what the
    kernel cannot do and what to write instead; a kind --device-kind gave is named as such."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "head_dims": [96], "output": str(tmp_path / "out.json")}))
    fix = "head_dims [96] cannot be planned (jax: 'head_dim must be divisible by 64'); use head_dims of "
    fix += "[64, 128, 192, 256]"
    for command in (["spec"], ["plan", "--dry-run"], ["plan", "--lower", "--dry-run"], ["run"]):
        r = run_cli(command[0], str(spec), *command[1:])
        assert_one_line_error(r, f'error: {spec}: kernel.impl "mosaic": {fix}')
    spec.write_text(json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "out.json")}))
    r = run_cli("plan", str(spec), "--dry-run", "--device-kind", "NVIDIA B200")
    assert_one_line_error(r, f"error: {spec} with --device-kind 'NVIDIA B200': kernel.impl \"mosaic\"", "sm_100")


def test_a_device_kind_given_over_a_planned_sweep_is_said_to_come_from_the_option(tmp_path: Path) -> None:
    """``plan --lower --device-kind`` (and ``plan``) of a sweep planned from a spec file naming no
    device kind refuses it naming --device-kind as where the kind came from, not the spec file."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "out.json")}))
    sweep = tmp_path / "sweep"
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    for lower in (["--lower"], []):
        r = run_cli("plan", str(spec), *lower, "--sweep-dir", str(sweep), "--device-kind", "NVIDIA H200")
        said = '(kernel.device_kind "NVIDIA H200" from --device-kind, not set in the sweep\'s)'
        line = assert_one_line_error(r, f"{sweep} already holds a sweep of another spec {said}")
        assert "in this spec" not in line, line


def test_records_carry_the_kernels_own_fields_and_ids_of_their_own() -> None:
    items = expand(_spec(grid={"fwd": {"block_q": [64, 128], "block_kv": [64], "max_concurrent_steps": [2]}}))
    fwd = [it for it in items if it.mode == "fwd" and it.config == "forced"]
    rec = fwd[0].record_fields()
    assert list(rec)[-6:] == ["impl", "config", "block_q", "block_kv", "max_concurrent_steps", "use_schedule_barrier"]
    assert rec["impl"] == "mosaic" and rec["use_schedule_barrier"] is True
    bwd = next(it for it in items if it.mode == "fwd_bwd" and it.config == "forced").record_fields()
    assert list(bwd)[-5:] == ["compute_wgs_bwd", "block_q_dkv", "block_kv_dkv", "block_q_dq", "block_kv_dq"]
    assert check_record(fwd[0].id, {**rec, "error": "x"}) == (None, None)
    why, _ = check_record(fwd[0].id, {**rec, "block_k": 64, "error": "x"})
    assert why is not None and "unknown field(s) block_k" in why
    triton = {it.id for it in expand(SweepSpec(**{**MOSAIC_SPEC, "kernel": {}}))}
    assert not triton & {it.id for it in items}
    # the reference config's own records and fingerprint are untouched by the new sections
    assert SweepSpec().fingerprint() == "c926b7436d2959d9"
    assert _spec().fingerprint() != _spec(kernel={"impl": "mosaic", "device_kind": "NVIDIA H200"}).fingerprint()


def test_jaxs_seq_checks_are_invalid_items_and_clamped_steps_one_item() -> None:
    grid = {"fwd": {"block_q": [64, 256], "block_kv": [128], "max_concurrent_steps": [2, 3, 4]}}
    items = [it for it in expand(_spec(modes=["fwd"], grid=grid)) if it.config == "forced"]
    invalid = [it for it in items if it.kind == INVALID]
    assert {it.reason for it in invalid} == {
        "NotImplementedError: q_seq_len=256 must be a multiple of block_q * 2=512 (jax's check, made at plan time; "
        "not lowered)"
    }
    runnable = [it.record_fields()["max_concurrent_steps"] for it in items if it.kind == RUN]
    assert runnable == [2]  # 256 // 128 = 2 K/V tiles: jax runs 3 and 4 as 2, so they are one config
    assert "use_schedule_barrier" in notes(_spec(grid={"fwd": {"use_schedule_barrier": [True, False]}}))[0]


def test_impls_lists_mosaic_with_its_tunables_and_auto() -> None:
    r = run_cli("impls", "--json")
    assert r.returncode == 0, r.stderr
    mosaic = next(d for d in json.loads(r.stdout) if d["name"] == "mosaic")
    assert mosaic["capabilities"]["dtypes"] == ["float16"] and mosaic["pruning"] == "lowering"
    fwd = {t["name"]: t for t in mosaic["tunables"]["fwd"]}
    assert fwd["block_q"]["rule"] == "a multiple of 64 and at least 64" and "max_concurrent_steps" in fwd
    assert "tilesweep's choice" in mosaic["auto"] and mosaic["pinned"]["fwd"] == {"use_schedule_barrier": True}


def test_a_mosaic_run_without_a_gpu_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "out.json")}))
    sweep = tmp_path / "sweep"
    r = run_cli("run", str(spec), "--sweep-dir", str(sweep), "--executor", "debug")
    assert_one_line_error(r, 'kernel.impl "mosaic"', f"`tilesweep plan {spec} --lower --sweep-dir {sweep}`", "replay")
    assert not sweep.exists()


def test_a_mosaic_resume_without_a_gpu_names_the_lowering_of_its_spec_file_and_sweep(tmp_path: Path) -> None:
    """The refusal names the ``plan --lower`` the plan's note names: the sweep's spec file and
    directory, not placeholders; where that file is gone, SPEC stands for it."""
    spec, sweep = tmp_path / "m.json", tmp_path / "sweep"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "out.json")}))
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    note = f"`tilesweep plan {spec} --lower --sweep-dir {sweep}`"
    assert planned.returncode == 0 and note in planned.stderr, planned.stdout + planned.stderr
    assert_one_line_error(run_cli("resume", str(sweep)), 'kernel.impl "mosaic"', note)
    spec.unlink()
    assert_one_line_error(run_cli("resume", str(sweep)), f"`tilesweep plan SPEC --lower --sweep-dir {sweep}`")


def test_a_mosaic_worker_on_a_node_without_a_gpu_names_the_kernel_as_json_spells_it() -> None:
    from jobs.node_env import check_backend
    from orchestrator.errors import WorkerEnvironmentError

    with pytest.raises(WorkerEnvironmentError) as err:
        check_backend("auto", "cpu", "0", "s/sweep.json", impl="mosaic")
    assert str(err.value).startswith('kernel.impl "mosaic" in s/sweep.json does not run without a GPU'), err.value


def test_a_lowering_array_without_slurm_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "executor": {"lower_partition": "cpu"}}))
    r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(tmp_path / "sweep"))
    assert_one_line_error(r, 'executor.lower_partition is "cpu"', 'executor.kind is "local"', "drop lower_partition")
    assert not (tmp_path / "sweep").exists()


def test_a_replayed_mosaic_sweep_runs_reports_exports_and_is_reused(tmp_path: Path) -> None:
    source = tmp_path / "source.json"
    source.write_text(json.dumps(document({**MOSAIC_SPEC, "output": "measured.json"}, seed=3)))
    out = tmp_path / "replayed.json"
    spec = tmp_path / "replay.json"
    replay = {"source": str(source), "impl": "mosaic"}
    spec.write_text(json.dumps({**MOSAIC_SPEC, "output": str(out), "kernel": {"impl": "replay"}, "replay": replay}))
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--executor", "local", "--workers", "2")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert {rec["impl"] for rec in doc["results"]} == {"mosaic"} and all("error" not in x for x in doc["results"])
    assert "bq" in r.stdout and "bkv" in r.stdout and " c" in r.stdout  # the best configs by the kernel's own fields
    export = tmp_path / "tuned.json"
    r = run_cli("export", str(out), "--out", str(export), "--include-replays")
    assert r.returncode == 0, r.stderr
    entries = json.loads(export.read_text())["entries"]
    assert {e["impl"] for e in entries} == {"mosaic"} and all(e["wins"] for e in entries)
    assert set(entries[0]["config"]) == {"block_q", "block_kv", "max_concurrent_steps", "use_schedule_barrier"}
    # the replay again, from what it wrote: every record reused, nothing left to measure
    r = run_cli("plan", str(spec), "--dry-run", "--reuse", str(out), "--include-replays")
    assert r.returncode == 0, r.stderr
    assert f"reused {len(doc['results'])} items recorded before" in r.stdout and "nothing to measure" in r.stdout


def test_report_says_which_implementation_wins_a_problem_both_measured(tmp_path: Path) -> None:
    triton = document({**MOSAIC_SPEC, "kernel": {}, "output": "x.json"}, seed=1)
    triton["results"] += document({**MOSAIC_SPEC, "output": "x.json"}, seed=2)["results"]
    path = tmp_path / "both.json"
    path.write_text(json.dumps(triton))
    r = run_cli("report", str(path), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    by_impl = {(row["impl"], row["mode"]): row for row in rows}

    def runs(row: dict[str, Any]) -> float:  # as its tuned table answers: its best, or auto where faster
        return min(t for t in (row["best_ms"], row["auto_ms"]) if t is not None)

    for mode in ("fwd", "fwd_bwd"):
        ours, theirs = by_impl["tilesweep", mode], by_impl["mosaic", mode]
        winner = "mosaic" if runs(theirs) < runs(ours) else "tilesweep"
        assert ours["winner_impl"] == theirs["winner_impl"] == winner
        slow, fast = sorted((runs(ours), runs(theirs)), reverse=True)
        assert ours["impl_margin"] == pytest.approx(slow / fast)
    # the tuned table's ``wins`` names the same implementation, also where auto is the fastest
    for r0 in triton["results"]:
        if r0["config"] == "auto" and r0.get("impl", "tilesweep") == "tilesweep":
            r0.update(median_ms=2e-6, q1_ms=2e-6, q3_ms=2e-6)
    path.write_text(json.dumps(triton))
    rows = json.loads(run_cli("report", str(path), "--json").stdout)
    assert {row["winner_impl"] for row in rows} == {"tilesweep"}
    assert run_cli("export", str(path), "--out", str(tmp_path / "t.json")).returncode == 0
    table = json.loads((tmp_path / "t.json").read_text())
    assert {e["impl"] for e in table["entries"] if e["wins"]} == {"tilesweep"}
    text = run_cli("report", str(path)).stdout
    assert "implementations compared (2 problems)" in text and "mosaic ms" in text


def test_checking_a_spec_refuses_what_the_kernel_cannot_do_as_plan_does(tmp_path: Path) -> None:
    """``tilesweep spec FILE`` is how a user checks a spec: it refuses what ``plan`` would."""
    path = tmp_path / "spec.json"
    path.write_text(
        json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "out.json"), "dtypes": ["bfloat16", "float16"]})
    )
    said = assert_one_line_error(run_cli("spec", str(path)), 'kernel.impl "mosaic"', 'dtypes ["bfloat16"]')
    assert said == assert_one_line_error(run_cli("plan", str(path), "--dry-run"))


def test_a_replay_source_whose_config_block_names_no_kernel_says_to_name_the_one_its_records_hold(
    tmp_path: Path,
) -> None:
    """A hand-made source whose records are Mosaic GPU's but whose config block names no kernel
    (read as tilesweep's): the refusal names what to add, not the wrong replay.impl."""
    data = document({**MOSAIC_SPEC, "output": "measured.json"}, seed=3)
    data["config"].pop("kernel")
    source = tmp_path / "source.json"
    source.write_text(json.dumps(data))
    spec = tmp_path / "replay.json"
    replay = {"source": str(source), "impl": "mosaic"}
    spec.write_text(
        json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "o.json"), "kernel": {"impl": "replay"}, "replay": replay})
    )
    said = assert_one_line_error(run_cli("plan", str(spec), "--dry-run"), 'its records are of kernel.impl "mosaic"')
    assert 'add "kernel": {"impl": "mosaic"} to its config block' in said and '"replay": {"impl"' not in said


def test_checking_a_spec_names_the_plan_lower_of_that_file_and_its_default_sweep_directory(tmp_path: Path) -> None:
    """`spec FILE` notes the pruning by lowering as `plan` does, with the command spelled for the
    file checked and the sweep directory plan would make, ready to paste, not SPEC and DIR."""
    spec = tmp_path / "my mosaic.json"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "out.json")}))
    checked, planned = run_cli("spec", str(spec), cwd=tmp_path), run_cli("plan", str(spec), "--dry-run", cwd=tmp_path)
    assert checked.returncode == 0 and planned.returncode == 0, checked.stderr + planned.stderr
    (note,) = [line for line in checked.stderr.splitlines() if "no shared-memory model" in line]
    fingerprint = spec_from_data({**MOSAIC_SPEC, "output": str(tmp_path / "out.json")}).fingerprint()[:8]
    command = f"`tilesweep plan '{spec}' --lower --sweep-dir 'sweeps/my mosaic-{fingerprint}'`"
    assert command in note, note
    assert "SPEC" not in note and " DIR" not in note, note
    assert note.split("` prunes")[0] in planned.stderr, planned.stderr  # the command plan names


def test_a_mosaic_plan_counts_no_configs_of_a_shared_memory_model_it_has_not(tmp_path: Path) -> None:
    """A kernel pruned by the compiler's verdict alone: its plan's first line counts the invalid
    configs, and names no shared-memory model (its note says there is none, and how it prunes)."""
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({**MOSAIC_SPEC, "output": str(tmp_path / "out.json")}))
    r = run_cli("plan", str(spec), "--dry-run")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert "shared-memory model" not in first and " invalid)" in first, first
    assert "has no shared-memory model" in r.stderr, r.stderr
