"""A spec that writes a default out is the sweep of the same spec that leaves it out: one
fingerprint, so ``resume --spec`` and ``run`` into the sweep directory take it, while a value
that changes what is measured is still another sweep, refused naming the field. The grid's
default for a tunable is what the tunable sweeps without the grid (``spec.grid.ungridded``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.spec.model import SweepSpec
from orchestrator.spec.sections import ShardingSettings, TimingSettings
from tests.helpers import MOSAIC_SPEC, TINY_SPEC, assert_one_line_error, run_cli, sample_replay_spec

# TINY_SPEC leaving the fwd stages and the fwd_bwd forward tiles at their defaults ([1, 2, 3]; null: 128/128)
BASE = {k: v for k, v in TINY_SPEC.items() if k != "fwd_stages"}
TIMING = {**TimingSettings().model_dump(mode="json"), **TINY_SPEC["timing"]}


@pytest.mark.parametrize(
    ("base", "written"),
    [
        (BASE, {"grid": {}}),
        (BASE, {"grid": {"fwd": {}, "fwd_bwd": {}}}),
        (BASE, {"grid": {"fwd": {"num_stages": [1, 2, 3]}}}),  # fwd_stages' default
        (BASE, {"grid": {"fwd_bwd": {"fwd_block_q": [128], "fwd_block_k": [128]}}}),  # bwd_fwd_config null
        (MOSAIC_SPEC, {"grid": {"fwd": {"use_schedule_barrier": [True]}, "fwd_bwd": {"block_q_dkv": [64]}}}),
        (BASE, {"timing": TIMING, "sharding": ShardingSettings().model_dump(mode="json")}),
    ],
    ids=["empty grid", "empty modes", "fwd_stages", "bwd_fwd_config", "mosaic defaults", "timing and sharding"],
)
def test_a_spec_that_writes_its_defaults_out_has_the_fingerprint_of_one_that_leaves_them_out(
    base: dict[str, Any], written: dict[str, Any]
) -> None:
    assert SweepSpec.model_validate({**base, **written}).fingerprint() == SweepSpec.model_validate(base).fingerprint()


def test_a_grid_that_changes_what_is_swept_is_another_sweep_of_a_pinned_fingerprint() -> None:
    """A grid value other than the tunable's default counts (and a default beside it does not);
    the fingerprints of such specs are pinned: sweep directories and documents on disk hold them."""
    fp = SweepSpec.model_validate(BASE).fingerprint()
    assert SweepSpec.model_validate({**BASE, "grid": {"fwd": {"num_stages": [1, 2]}}}).fingerprint() != fp
    grid = {"fwd": {"block_q": [64], "block_kv": [128, 256]}, "fwd_bwd": {"compute_wgs_bwd": [2]}}
    assert SweepSpec.model_validate({**MOSAIC_SPEC, "grid": grid}).fingerprint() == "ad6d3ba7ac5eef5b"
    with_default = {**grid, "fwd": {**grid["fwd"], "max_concurrent_steps": [2, 3, 4]}}
    assert SweepSpec.model_validate({**MOSAIC_SPEC, "grid": with_default}).fingerprint() == "ad6d3ba7ac5eef5b"
    tiny = {k: v for k, v in TINY_SPEC.items() if k != "bwd_stages"}
    assert SweepSpec.model_validate({**tiny, "grid": {"fwd_bwd": {"num_stages": [3]}}}).fingerprint() == (
        "a9d9b2441a73eec1"
    )


def test_resume_and_run_take_a_spec_that_writes_defaults_out_and_name_a_real_difference(tmp_path: Path) -> None:
    """The sweep planned from a spec file; the same spec with a grid section that only repeats what
    each tunable sweeps without it, and timing and sharding sections of the default values, is the
    sweep's spec for ``resume --spec`` and for ``run`` into its directory; a grid value of its own
    is refused by both in one line naming it."""
    shape: dict[str, Any] = {"dtypes": ["bfloat16"], "head_dims": [64], "seq_lens": [2048]}
    out, sweep = tmp_path / "results.json", tmp_path / "sweep"
    spec = sample_replay_spec(tmp_path / "spec.json", out, **shape)
    assert run_cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    grid = {"fwd": {"num_stages": [1, 2, 3], "num_warps": [4, 8]}, "fwd_bwd": {"fwd_block_q": [128]}}
    defaults = {"timing": TimingSettings().model_dump(mode="json"), "sharding": {"strategy": "shape"}}
    same = sample_replay_spec(tmp_path / "same.json", out, **shape, grid=grid, **defaults)
    r = run_cli("resume", str(sweep), "--spec", str(same))
    assert r.returncode == 0 and "merged 104 records" in r.stderr, r.stdout + r.stderr
    r = run_cli("run", str(same), "--sweep-dir", str(sweep))
    assert r.returncode == 0 and "merged 104 records" in r.stderr, r.stdout + r.stderr
    other = sample_replay_spec(tmp_path / "other.json", out, **shape, grid={**grid, "fwd": {"num_stages": [2]}})
    said = "(grid.fwd.num_stages [2] in this spec, not set in the sweep's)"
    assert_one_line_error(run_cli("resume", str(sweep), "--spec", str(other)), "is not the spec of the sweep", said)
    r = run_cli("run", str(other), "--sweep-dir", str(sweep))
    assert_one_line_error(r, f"{sweep} already holds a sweep of another spec {said}")
