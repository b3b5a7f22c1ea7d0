"""What the search strategy's tests share: a replayed search's spec file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import SAMPLE


def spec_file(tmp_path: Path, name: str = "search.json", **over: Any) -> Path:
    """bf16 d64 s2048, fwd and fwd_bwd (104 items), replayed from the excerpt, searched."""
    config = json.loads(SAMPLE.read_text())["config"]
    data = {
        **config,
        "dtypes": ["bfloat16"],
        "head_dims": [64],
        "seq_lens": [2048],
        "sharding": {"units": 2},
        "output": str(tmp_path / "results.json"),
        "kernel": {"impl": "replay"},
        "replay": {"source": str(SAMPLE)},
        "executor": {"kind": "debug"},
        "timing": {"strategy": "search"},
        **over,
    }
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path
