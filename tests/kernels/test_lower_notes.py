"""What ``tilesweep plan --lower`` notes beside its verdicts: the notes ``plan`` gives of the
spec (a tunable the kernel ignores), advice that fits the command line it was given, and its
bar, drawn before the seconds its lowering processes take to start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

SHAPE: dict[str, Any] = {"dtypes": ["float16"], "head_dims": [64], "seq_lens": [256], "batch": 1, "heads": 1}


def _notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tilesweep: note:")]


def _bar(stderr: str, configs: int) -> None:
    """The bar counts verdicts: its first line, at 0, was drawn before the first of them."""
    bar = [line for line in stderr.splitlines() if line.startswith("lowering for NVIDIA H100: ")]
    assert len(bar) >= 2 and f"| 0/{configs} configs [00:00<?" in bar[0], stderr
    assert f"| {configs}/{configs} configs [" in bar[-1], stderr


def test_lower_notes_the_stock_backwards_num_stages_as_plan_does(tmp_path: Path) -> None:
    fwd_bwd = {"fwd_block_q": [64], "fwd_block_k": [64], "bwd_outer": [64], "bwd_inner": [32]}
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                **SHAPE,
                "output": str(tmp_path / "out.json"),
                "modes": ["fwd_bwd"],
                "kernel": {"impl": "jax", "device_kind": "NVIDIA H100"},
                "grid": {"fwd_bwd": {**fwd_bwd, "num_stages": [1, 2, 3], "num_warps": [4]}},
            }
        )
    )
    plan = run_cli("plan", str(spec), "--dry-run")
    lower = run_cli("plan", str(spec), "--lower", "--dry-run", "--lower-workers", "1")
    assert plan.returncode == 0 and lower.returncode == 0, lower.stderr
    (note,) = _notes(plan.stderr)
    assert 'kernel.impl "jax"' in note and "num_stages=2 only" in note and "[1, 2, 3] is not swept" in note
    assert _notes(lower.stderr) == [note]
    assert "lowered 2 configs" in lower.stdout  # auto, and the one config num_stages 2 leaves
    _bar(lower.stderr, 2)  # a dry run's bar, as a lowering into a sweep directory's


def _mosaic_spec(tmp_path: Path) -> Path:
    """jax's Mosaic GPU kernel at head_dim 128, seq 1024: 64/64 with 4 steps fits, 64/256 does not."""
    mosaic = pytest.importorskip("kernels.mosaic")
    try:
        mosaic.check_available()
    except mosaic.MosaicUnavailable as exc:  # scripts/setup-venv.sh installs what it needs
        pytest.skip(f"cannot lower jax's Mosaic GPU kernel here: {exc}")
    spec = tmp_path / "spec.json"
    fwd = {"block_q": [64], "block_kv": [64, 256], "max_concurrent_steps": [4]}
    data = {**SHAPE, "head_dims": [128], "seq_lens": [1024], "modes": ["fwd"], "grid": {"fwd": fwd}}
    spec.write_text(json.dumps({**data, "output": str(tmp_path / "out.json"), "kernel": {"impl": "mosaic"}}))
    return spec


def test_a_dry_runs_advice_to_keep_its_verdicts_fits_its_command_line(tmp_path: Path) -> None:
    spec, sweep = _mosaic_spec(tmp_path), tmp_path / "sweep"
    given = run_cli("plan", str(spec), "--lower", "--dry-run", "--sweep-dir", str(sweep), "--lower-workers", "1")
    assert given.returncode == 0 and "1 refused" in given.stdout, given.stderr
    (keep,) = [line for line in _notes(given.stderr) if "--dry-run keeps no verdicts" in line]
    assert f"without --dry-run to keep them in {sweep} " in keep and "--sweep-dir" not in keep
    assert not sweep.exists()  # a dry run writes nothing
    assert not any("--lower --sweep-dir DIR" in line for line in _notes(given.stderr))  # what it runs already
    bare = run_cli("plan", str(spec), "--lower", "--dry-run", "--lower-workers", "1")
    assert bare.returncode == 0, bare.stderr
    (keep,) = [line for line in _notes(bare.stderr) if "--dry-run keeps no verdicts" in line]
    assert "--sweep-dir DIR" in keep


def test_a_plan_of_a_lowered_sweep_says_its_verdicts_and_suggests_lower_only_for_configs_without_one(
    tmp_path: Path,
) -> None:
    spec, sweep = _mosaic_spec(tmp_path), tmp_path / "sweep"
    command = f"`tilesweep plan {spec} --lower --sweep-dir {sweep}`"

    def note() -> str:
        r = run_cli("plan", str(spec), "--dry-run", "--sweep-dir", str(sweep))
        assert r.returncode == 0, r.stderr
        (line,) = [line for line in _notes(r.stderr) if "no shared-memory model" in line]
        return line

    assert f"{command} prunes its 3 configs to measure by the compiler's verdict" in note()
    lowered = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1")
    assert lowered.returncode == 0 and "2 lowered, 1 refused" in lowered.stdout, lowered.stderr
    said = note()
    assert "gave 3 configs a verdict: 2 lower, 1 refused (pruned, never run)" in said, said
    assert "plan --lower has nothing left to lower" in said and command not in said
    # --json shows the same kept plan: each config's verdict beside it, the same note on stderr
    shown = run_cli("plan", str(spec), "--dry-run", "--json", "--sweep-dir", str(sweep))
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    verdicts = [(line["lowering"]["verdict"], line["pruned"]) for line in lines if line["lowering"] is not None]
    assert sorted(verdicts) == [("lowered", False), ("lowered", False), ("refused", True)], shown.stdout
    assert said in _notes(shown.stderr), shown.stderr
    for no_gpu in (["run", str(spec), "--sweep-dir", str(sweep)], ["resume", str(sweep)]):  # a lowering is no cure
        refused = assert_one_line_error(run_cli(*no_gpu), "its configs are lowered already", "2 lower, 1 refused")
        assert "where jax sees a GPU" in refused and "--lower" not in refused, refused
    # a lowering stopped before its last verdict: the plan names the one config left without one
    path = sweep / "lowering.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")
    kept = [json.loads(line).get("verdict") for line in lines[1:-1]]
    said = note()
    assert f"gave 2 configs a verdict: {kept.count('lowered')} lower, {kept.count('refused')} refused" in said
    assert said.endswith(f"{command} lowers the 1 config to measure without one"), said


def test_a_lowering_into_a_sweep_directory_ends_with_the_command_that_runs_it(tmp_path: Path) -> None:
    """The verdicts kept, what runs the sweep next: its last line, after a lowering (its bar drawn
    from 0) and after a rerun that had nothing left to lower alike."""
    spec, sweep = tmp_path / "spec.json", tmp_path / "my sweep"
    grid = {"block_q": [64], "block_k": [64], "num_stages": [2], "num_warps": [4]}
    kernel = {"impl": "jax", "device_kind": "NVIDIA H100"}
    data = {**SHAPE, "modes": ["fwd"], "kernel": kernel, "grid": {"fwd": grid}, "output": str(tmp_path / "o.json")}
    spec.write_text(json.dumps(data))
    next_step = f"next: `tilesweep resume '{sweep}'` measures what has no record yet (on SLURM: submits it)"
    for said in ("lowered 2 configs", "nothing to lower"):
        r = run_cli("plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1")
        assert r.returncode == 0 and said in r.stdout, r.stderr
        assert r.stdout.splitlines()[-1] == next_step, r.stdout
        if said == "lowered 2 configs":
            _bar(r.stderr, 2)
