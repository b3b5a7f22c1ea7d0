"""``tilesweep plan --lower --sweep-dir`` run again on one sweep directory: after a run that was
killed, and beside another of the same directory. Each config's verdict is written once, under
one header, and the second command says it waits for the first. Lowering jax's stock Triton
kernel for an H100 needs no CUDA plugin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.planning import RUN, expand
from orchestrator.spec.files import load_spec
from orchestrator.store import lowering
from tests.helpers import LAUNCH, REPO, run_cli, second_while_first_stopped, until

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")]

SPEC: dict[str, Any] = {
    "dtypes": ["float16"],
    "head_dims": [64],
    "seq_lens": [256],
    "modes": ["fwd"],
    "batch": 1,
    "heads": 1,
    "kernel": {"impl": "jax", "device_kind": "NVIDIA H100"},
    "grid": {"fwd": {"block_q": [64, 128], "block_k": [64], "num_stages": [2], "num_warps": [4]}},
}


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**SPEC, "output": str(tmp_path / "out.json")}))
    return path


def _lower(spec: Path, sweep: Path) -> list[str]:
    return ["plan", str(spec), "--lower", "--sweep-dir", str(sweep), "--lower-workers", "1"]


def _verdict_lines(sweep: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(headers, verdicts) of the sweep's ``lowering.jsonl``, every whole line."""
    headers: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    for text in (sweep / lowering.FILE).read_text().splitlines():
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            continue
        (headers if "lowering" in obj else verdicts).append(obj)
    return headers, verdicts


def _planned(spec: Path) -> list[str]:
    """The ids of the spec's runnable configs, sorted."""
    return sorted(it.id for it in expand(load_spec(spec)) if it.kind == RUN)


def test_a_rerun_adds_its_verdicts_under_the_one_header(tmp_path: Path) -> None:
    spec, sweep = _spec(tmp_path), tmp_path / "sweep"
    first = run_cli(*_lower(spec, sweep))
    assert first.returncode == 0 and "lowered 3 configs" in first.stdout, first.stderr
    # killed while it wrote its last verdict: the rerun lowers that config again, on a line of its own
    path = sweep / lowering.FILE
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    again = run_cli(*_lower(spec, sweep))
    assert again.returncode == 0 and "lowered 1 configs" in again.stdout, again.stderr
    assert "nothing to lower" in run_cli(*_lower(spec, sweep)).stdout
    headers, verdicts = _verdict_lines(sweep)
    assert len(headers) == 1 and headers[0]["device_kind"] == "NVIDIA H100"
    assert sorted(v["id"] for v in verdicts) == _planned(spec)  # each config's verdict once
    found = lowering.read_verdicts(sweep, load_spec(spec).fingerprint(), "NVIDIA H100")
    assert {v.verdict for v in found.values()} == {"lowered"} and len(found) == 3


def test_a_second_lowering_of_the_sweep_waits_for_the_first_and_lowers_nothing_twice(tmp_path: Path) -> None:
    spec, sweep = _spec(tmp_path), tmp_path / "sweep"
    first = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *_lower(spec, sweep)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    until(lambda: (sweep / "lowering.lease").exists(), "the first lowering holds the sweep's lowering lease", first)
    second = second_while_first_stopped(
        first, [sys.executable, "-m", "orchestrator", *_lower(spec, sweep)], "waiting for the other `plan --lower`"
    )
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0 and "lowered 3 configs" in out, err
    assert second.returncode == 0, second.stderr
    (said,) = [line for line in second.stderr.splitlines() if "waiting" in line]
    assert f"pid {first.pid} " in said and str(sweep) in said and "without a verdict" in said
    assert "nothing to lower" in second.stdout and "lowered before" in second.stdout
    headers, verdicts = _verdict_lines(sweep)
    assert len(headers) == 1 and sorted(v["id"] for v in verdicts) == _planned(spec)
