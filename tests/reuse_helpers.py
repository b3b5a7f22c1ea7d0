"""What the tests of reuse share: the first sweep's spec (a real two-config sweep, interpret
mode, in-process workers) and its extension, spec files, and a plan against documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.control.reuseplan import ReuseRequest, plan_with_reuse
from orchestrator.spec.files import load_spec
from tests.helpers import TINY_SPEC, run_cli

# fwd only: auto plus one forced config (two compiles); the extension adds one block_q.
FIRST = {**TINY_SPEC, "modes": ["fwd"], "fwd_block_q": [32], "append": True}
EXTENDED = {**FIRST, "fwd_block_q": [32, 64]}


def write(folder: Path, name: str, data: dict[str, Any]) -> Path:
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def run_first(folder: Path) -> Path:
    """The document of a real two-config sweep (run here, in-process workers)."""
    spec = write(folder, "first.json", {**FIRST, "output": str(folder / "results.json")})
    r = run_cli("run", str(spec), "--sweep-dir", str(folder / "sweep"), "--executor", "debug")
    assert r.returncode == 0, r.stderr
    return folder / "results.json"


def markers(sweep: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((sweep / "done").glob("*.json"))]


def plan_against(tmp_path: Path, data: dict[str, Any], request: ReuseRequest | None = None) -> Any:
    spec_path = write(tmp_path, "spec.json", {**data, "output": str(tmp_path / "out.json")})
    spec = load_spec(str(spec_path))
    return plan_with_reuse(spec, tmp_path / "sweep", Path(spec.output), None, None, request)
