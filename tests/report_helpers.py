"""Records and results documents in the reference layout, and the analysis commands run in this
process, for the tests of the analysis room (report, page, plots, export, compare)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import analysis as cli_report
from orchestrator.store import document as results_doc
from tests.helpers import run_cli

# a spec of one float32 shape with one config per mode: ``merged_from_nothing`` plans it
SMALL_SPEC = {
    "dtypes": ["float32"],
    "head_dims": [64],
    "seq_lens": [256],
    "batch": 1,
    "heads": 2,
    "fwd_block_q": [64],
    "fwd_block_k": [64],
    "fwd_stages": [2],
    "fwd_warps": [4],
    "bwd_outer": [64],
    "bwd_inner": [32],
    "bwd_stages": [2],
    "bwd_warps": [4],
}


def rec(
    mode: str = "fwd",
    *,
    auto: bool = False,
    ms: float | None = 1.0,
    spread: float = 0.01,
    error: str | None = None,
    dtype: str = "bfloat16",
    head_dim: int = 64,
    seq: int = 2048,
    batch: int = 4,
    heads: int = 8,
    tag: str = "t",
    **cfg: Any,
) -> dict[str, Any]:
    """One record in the reference layout; ``ms=None`` or ``error`` makes a failed config."""
    r: dict[str, Any] = {
        "dtype": dtype,
        "head_dim": head_dim,
        "seq": seq,
        "batch": batch,
        "heads": heads,
        "tag": tag,
        "mode": mode,
        "config": "auto" if auto else "forced",
    }
    if not auto:
        if mode == "fwd":
            defaults = {"block_q": 128, "block_k": 128, "num_stages": 2, "num_warps": 4}
        else:
            defaults = {
                "fwd_block_q": 128,
                "fwd_block_k": 128,
                "bwd_outer": 64,
                "bwd_inner": 32,
                "num_stages": 2,
                "num_warps": 4,
            }
        r.update({**defaults, **cfg})
    if error is not None or ms is None:
        r["error"] = error or "JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded"
    else:
        r.update(rel_err=1e-3, compile_s=0.2, inner=10, median_ms=ms, q1_ms=ms * (1 - spread), q3_ms=ms * (1 + spread))
    return r


def make_doc(records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "device": {"jax": "0.11.2", "device_kind": "NVIDIA H100"},
        "config": {"tag": "t"},
        "results": records,
        **extra,
    }


def write(tmp_path: Path, doc: Any, name: str = "results.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def merged_from_nothing(tmp_path: Path, modes: list[str]) -> Path:
    """The document `merge` writes of a sweep of ``SMALL_SPEC`` in ``modes``, planned and never run."""
    spec = write(tmp_path, {**SMALL_SPEC, "modes": modes}, "spec.json")
    sweep, doc = tmp_path / "sweep", tmp_path / "empty.json"
    planned = run_cli("plan", str(spec), "--sweep-dir", str(sweep))
    assert planned.returncode == 0, planned.stderr
    merged = run_cli("merge", str(sweep), "--output", str(doc))
    assert merged.returncode == 0 and "merged 0 records" in merged.stdout, merged.stdout + merged.stderr
    return doc


def load_obj(doc: dict[str, Any]) -> results_doc.ResultsDoc:
    return results_doc.from_obj(doc, name="test.json")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilesweep")
    cli_report.register(p.add_subparsers(dest="command", required=True))
    return p


def run_handler(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = parser().parse_args(argv)
    rc = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err
