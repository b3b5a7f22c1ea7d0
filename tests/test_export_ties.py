"""Configs of one problem that tie on the median: every export picks the same one, whatever the
order of the records or of the documents (``analysis.ranking``: the lower q3, then config order)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis import tokamax_export
from orchestrator.store import document
from tests.helpers import run_cli
from tests.report_helpers import make_doc, rec, write

AUTO = rec(auto=True, ms=2.0)


def _exported(tmp_path: Path, *docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries ``tilesweep export`` writes of documents holding ``docs``' records, in that order."""
    paths = [write(tmp_path, make_doc(recs), f"doc{n}.json") for n, recs in enumerate(docs)]
    out = tmp_path / "tuned.json"
    r = run_cli("export", *map(str, paths), "--out", str(out))
    assert r.returncode == 0, r.stderr
    entries: list[dict[str, Any]] = json.loads(out.read_text())["entries"]
    return entries


def _picked(tmp_path: Path, name: str, *docs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    (tmp_path / name).mkdir()
    return [(e["mode"], e["config"]) for e in _exported(tmp_path / name, *docs)]


def test_a_tie_on_the_median_goes_to_the_lower_q3_whatever_the_record_order(tmp_path: Path) -> None:
    wide, steady = rec(ms=1.0, spread=0.05, block_q=32), rec(ms=1.0, spread=0.01, block_q=64)
    first, second = _picked(tmp_path, "ab", [AUTO, wide, steady]), _picked(tmp_path, "ba", [AUTO, steady, wide])
    assert first == second and first[0][1]["block_q"] == 64, (first, second)


def test_a_tie_on_median_and_q3_goes_to_the_config_first_in_config_order(tmp_path: Path) -> None:
    """Equal timings: the config whose fields, by name, come first (block_k, then block_q: the smaller)."""
    configs = [rec(ms=1.0, block_q=128, block_k=64), rec(ms=1.0, block_q=64, block_k=128), rec(ms=1.0, block_q=32)]
    first, second = _picked(tmp_path, "up", [AUTO, *configs]), _picked(tmp_path, "down", [AUTO, *configs[::-1]])
    assert first == second and (first[0][1]["block_k"], first[0][1]["block_q"]) == (64, 128), (first, second)


def test_combined_documents_pick_as_one_document_does_whatever_their_order(tmp_path: Path) -> None:
    wide, steady = rec(ms=1.0, spread=0.05, block_q=32), rec(ms=1.0, spread=0.01, block_q=64)
    one = _picked(tmp_path, "one", [AUTO, wide, steady])
    assert one == _picked(tmp_path, "ab", [AUTO, wide], [steady]) == _picked(tmp_path, "ba", [steady], [AUTO, wide])
    assert one[0][1]["block_q"] == 64


def test_tags_that_tie_on_one_shape_give_one_entry_whatever_their_order(tmp_path: Path) -> None:
    """Two tags measured one shape to the same time: the entry is the same whichever comes first."""
    a = [rec(auto=True, ms=2.0, tag="a"), rec(ms=1.0, block_q=64, tag="a")]
    b = [rec(auto=True, ms=2.0, tag="b"), rec(ms=1.0, block_q=32, tag="b")]
    first, second = _picked(tmp_path, "ab", a + b), _picked(tmp_path, "ba", b + a)
    assert first == second and len(first) == 1 and first[0][1]["block_q"] == 32, (first, second)


def test_tokamax_tables_write_the_tied_best_first_as_the_tuned_table_picks_it(tmp_path: Path) -> None:
    pytest.importorskip("tokamax")
    from kernels import devices, tokamax_ops
    from kernels import tokamax_meta as meta

    p = meta.Problem(batch=2, seq=512, heads=4, head_dim=64, dtype="float32", causal=True)
    impl, kind = "tokamax-triton", "NVIDIA H200"
    two = random.Random(0).sample(list(tokamax_ops.search_space(impl, "fwd", p, devices.get(kind))), 2)
    shape = {"dtype": p.dtype, "head_dim": p.head_dim, "seq": p.seq, "batch": p.batch, "heads": p.heads}
    timed = {"rel_err": 1e-3, "compile_s": 1.0, "inner": 10, "median_ms": 1.0, "q1_ms": 0.9, "q3_ms": 1.1}
    recs = [
        {**shape, "causal": True, "tag": "t", "mode": "fwd", "impl": impl, "config": "forced", **f, **timed}
        for f in two
    ]
    firsts = []
    for order in (recs, recs[::-1]):
        doc = document.from_obj({"device": {"device_kind": kind}, "config": {}, "results": order})
        (entry,) = tokamax_export.choose(doc, kind).entries
        firsts.append(entry.configs[0].fields)
    assert firsts[0] == firsts[1], firsts
