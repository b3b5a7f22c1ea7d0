"""A search (``timing.strategy: search``) over the grids of other kernel implementations than
ours, replayed on a CPU (``kernel.impl: replay``): jax's Mosaic GPU kernel and tokamax's Mosaic
op (when tokamax is installed). Its axes are the implementation's own tunables, every record is
of that implementation, and what it never measured is said as such."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernels import tokamax_meta as meta
from orchestrator.spec.records import config_fields
from orchestrator.store.synthetic import document
from tests.helpers import MOSAIC_SPEC, TOKAMAX_SPEC, run_cli

MOSAIC: dict[str, Any] = {**MOSAIC_SPEC, "seq_lens": [256, 512]}
TOKAMAX: dict[str, Any] = {**TOKAMAX_SPEC, "kernel": {**TOKAMAX_SPEC["kernel"], "device_kind": "NVIDIA H100"}}


def _search(tmp_path: Path, measured: dict[str, Any], impl: str) -> tuple[dict[str, Any], str]:
    """Replay a search of ``measured``'s spec from a synthetic document of it; (document, stdout)."""
    source = tmp_path / "source.json"
    source.write_text(json.dumps(document({**measured, "output": "measured.json"}, seed=3)))
    out, spec = tmp_path / "searched.json", tmp_path / "search.json"
    kernel = {**measured["kernel"], "impl": "replay"}
    replay = {"source": str(source), "impl": impl}
    search = {"timing": {"strategy": "search"}, "search": {"design": 3}}
    spec.write_text(json.dumps({**measured, **search, "output": str(out), "kernel": kernel, "replay": replay}))
    r = run_cli("run", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--executor", "debug")
    assert r.returncode == 0, r.stderr
    assert "round 2: " in r.stderr
    return json.loads(out.read_text()), r.stdout


def _check(doc: dict[str, Any], stdout: str, impl: str) -> None:
    assert {rec["impl"] for rec in doc["results"]} == {impl}
    block = doc["tilesweep"]["search"]
    assert block["ended"] and block["rounds"] >= 2
    for p in block["problems"]:
        mode = p["problem"][5]
        assert p["fields"] == list(config_fields(mode, impl=impl))  # the implementation's own tunables
        forced = [r for r in doc["results"] if r["mode"] == mode and r["config"] == "forced"]
        seq = [r for r in forced if r["seq"] == p["problem"][2]]
        assert p["measured"] == len(seq) and p["never_measured"]
        assert not {tuple(c) for c in p["never_measured"]} & {tuple(r[f] for f in p["fields"]) for r in seq}
    assert "never measured" in stdout


def test_a_search_of_jax_mosaic_kernel_searches_its_own_tunables(tmp_path: Path) -> None:
    doc, stdout = _search(tmp_path, MOSAIC, "mosaic")
    _check(doc, stdout, "mosaic")


def test_a_search_of_tokamax_mosaic_op_searches_tokamaxs_own_grid(tmp_path: Path) -> None:
    pytest.importorskip("tokamax", reason=meta.missing("tests of tokamax's kernels"))
    doc, stdout = _search(tmp_path, TOKAMAX, "tokamax-mosaic")
    _check(doc, stdout, "tokamax-mosaic")
