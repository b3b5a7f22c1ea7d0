"""What the search strategy's tests share: a replayed search's spec file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import EXCERPT_BF16_D64, sample_replay_spec


def spec_file(tmp_path: Path, name: str = "search.json", **over: Any) -> Path:
    """bf16 d64 s2048, fwd and fwd_bwd (104 items), replayed from the excerpt, searched."""
    data = {**EXCERPT_BF16_D64, "sharding": {"units": 2}, "timing": {"strategy": "search"}, **over}
    return sample_replay_spec(tmp_path / name, tmp_path / "results.json", **data)
