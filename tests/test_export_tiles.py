"""A tile below tl.dot's 16 at the spec, in export and in the tuned table, per implementation: the
Triton kernels (``tilesweep``, ``jax``) take none on a GPU, so their spec refuses it and export
writes no table entry ``kernels.tuned`` would refuse (a record of one, measured in interpret mode,
is left out, said in one line); tokamax's Triton kernel takes one (tokamax's own GPU test runs
``block_q`` 1 and 2), so its spec plans it and its table loads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernels.tuned import TunedTable
from tests.helpers import assert_one_line_error, run_cli
from tests.report_helpers import make_doc, rec, write


def _small(seq: int, ms: float, *, auto: bool = False, **tiles: Any) -> dict[str, Any]:
    """A record of float32 d64, one sequence of one head, at ``seq``."""
    return rec(auto=auto, ms=ms, seq=seq, dtype="float32", head_dim=64, batch=1, heads=1, **tiles)


def _interpret_doc(tmp_path: Path, *, with_gpu_tiles: bool) -> Path:
    """A document measured in interpret mode: at seq 64 the best is bq8 bk8 (below 16), at seq 128
    (where ``with_gpu_tiles``) bq16 bk16."""
    records = [_small(64, 2.0, auto=True), _small(64, 1.0, block_q=8, block_k=8)]
    records.append(_small(64, 1.5, block_q=16, block_k=16))
    if with_gpu_tiles:
        records += [_small(128, 2.0, auto=True), _small(128, 1.0, block_q=16, block_k=16)]
    return write(tmp_path, make_doc(records, device={"device_kind": "cpu"}), "interpret.json")


def test_a_best_tile_below_16_of_the_triton_kernel_is_left_out_of_the_table_said_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    r = run_cli("export", str(_interpret_doc(tmp_path, with_gpu_tiles=True)), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "wrote " in r.stdout and ": 1 entry (1 tuned, 0 use auto)" in r.stdout, r.stdout
    (note,) = r.stderr.splitlines()
    assert note.startswith("tilesweep: note: left out float32 d64 s64 b1 h1 fwd: its best config is one "), note
    assert "config.block_q=8" in note and "at least 16" in note, note
    table = TunedTable.load(out, check_env=False)  # the table export wrote loads
    assert [(e.seq, e.config and e.config["block_q"]) for e in table.entries] == [(128, 16)]


def test_a_document_whose_every_best_the_table_refuses_writes_nothing_and_keeps_the_table_there(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tuned.json"
    done = run_cli("export", str(_interpret_doc(tmp_path, with_gpu_tiles=True)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    before = out.read_bytes()
    r = run_cli("export", str(_interpret_doc(tmp_path, with_gpu_tiles=False)), "--out", str(out))
    said = assert_one_line_error(r, "nothing to export from", "left out float32 d64 s64 b1 h1 fwd", "nothing written")
    assert "block_q=8" in said
    assert out.read_bytes() == before


def _tokamax_record(block_q: int, block_k: int, ms: float) -> dict[str, Any]:
    r = rec(ms=ms, seq=256, block_q=block_q, block_k=block_k, num_stages=2, num_warps=4, split_k=1, pack_mask=False)
    return {**r, "impl": "tokamax-triton"}


def test_tokamaxs_triton_kernel_takes_a_tile_of_8_at_the_spec_in_export_and_in_the_table(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    grid = {"fwd": {"block_q": [8, 16], "block_k": [8, 16], "num_stages": [2], "num_warps": [4]}}
    data = {"dtypes": ["bfloat16"], "head_dims": [64], "seq_lens": [256], "modes": ["fwd"], "grid": grid}
    spec.write_text(json.dumps({**data, "kernel": {"impl": "tokamax-triton"}}))
    planned = run_cli("plan", str(spec), "--sweep-dir", str(tmp_path / "sweep"))
    assert planned.returncode == 0 and "5 items in 1 unit" in planned.stdout, planned.stderr
    auto = {**rec(auto=True, ms=2.0, seq=256), "impl": "tokamax-triton"}
    records = [auto, _tokamax_record(8, 8, 1.0), _tokamax_record(16, 16, 1.5)]
    out = tmp_path / "tuned.json"
    r = run_cli("export", str(write(tmp_path, make_doc(records))), "--out", str(out))
    assert r.returncode == 0 and not r.stderr, r.stderr
    table = TunedTable.load(out, check_env=False)
    found = table.lookup(impl="tokamax-triton", dtype="bfloat16", head_dim=64, seq=256, mode="fwd")
    assert found is not None and (found["block_q"], found["block_k"]) == (8, 8)
