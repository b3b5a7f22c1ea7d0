"""What ``tilesweep plan --lower`` notes beside its verdicts: the notes ``plan`` gives of the
spec (a tunable the kernel ignores), and advice that fits the command line it was given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

SHAPE: dict[str, Any] = {"dtypes": ["float16"], "head_dims": [64], "seq_lens": [256], "batch": 1, "heads": 1}


def _notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tilesweep: note:")]


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
    assert "kernel.impl 'jax'" in note and "num_stages=2 only" in note and "[1, 2, 3] is not swept" in note
    assert _notes(lower.stderr) == [note]
    assert "lowered 2 configs" in lower.stdout  # auto, and the one config num_stages 2 leaves
